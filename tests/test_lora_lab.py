"""LoRA from the command line: `rlvr train --lora.rank N` trains adapters only and saves a
plain model (or the adapter alone); a target the model lacks is one line before any work."""

from __future__ import annotations

import json

from rlvr.cli import main
from rlvr.models.tiny import load_model
from tests.test_cli import cli_error
from tests.test_lab import TINY


def _runs(tmp_path, name: str) -> list[str]:
    return ["--runs-dir", str(tmp_path / "runs"), "--run-name", name, "--cache-dir", str(tmp_path)]


def test_lab_with_lora_saves_a_merged_plain_model(tmp_path):
    main(["train", *TINY, *_runs(tmp_path, "lora"), "--lora.rank", "4", "--grpo.lr", "1e-2"])
    run = tmp_path / "runs" / "lora"
    assert not (run / "model" / "adapter_config.json").exists()
    model, _ = load_model(run / "model")  # an ordinary Hugging Face directory
    assert not any("lora" in name for name, _ in model.named_parameters())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3
    config = (run / "config.yaml").read_text()
    assert "rank: 4" in config


def test_lab_with_lora_can_save_the_adapter_alone(tmp_path):
    flags = ["--lora.rank", "2", "--lora.save-adapter-only", "--lora.target-modules", "q_proj"]
    main(["train", *TINY, *_runs(tmp_path, "adapter"), *flags, "--grpo.steps", "1"])
    adapter = json.loads(
        (tmp_path / "runs" / "adapter" / "model" / "adapter_config.json").read_text()
    )
    assert adapter["r"] == 2 and adapter["target_modules"] == ["q_proj"]


def test_a_lora_target_the_model_lacks_is_one_line_naming_its_layers(tmp_path, capsys):
    argv = ["train", *TINY, *_runs(tmp_path, "bad"), "--lora.rank", "4"]
    message = cli_error([*argv, "--lora.target-modules", "c_attn"], capsys)
    assert message.startswith("--lora.rank 4: LoRA target_modules ['c_attn'] not found")
    assert "q_proj" in message and "v_proj" in message
    assert not (tmp_path / "runs" / "bad" / "config.yaml").exists()


def test_lora_with_a_synced_reference_is_refused_before_any_work(tmp_path, capsys):
    argv = ["train", *TINY, *_runs(tmp_path, "sync"), "--lora.rank", "4"]
    message = cli_error([*argv, "--grpo.beta", "0.1", "--grpo.ref-sync-every", "5"], capsys)
    assert "ref-sync-every 0" in message
    assert not (tmp_path / "runs" / "sync").exists()
