"""Rejection sampling: only verified completions are kept, deduplicated and capped per prompt,
the summary adds up, and `rlvr sample` output is `rlvr sft` input."""

import json

import pytest
import torch

from rlvr.cli import main
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
from rlvr.report.run_dir import read_jsonl
from rlvr.rollout.sampler import sample_completions
from rlvr.train.rejection import (
    STAGES,
    RejectionConfig,
    normalize_whitespace,
    rejection_sample,
)
from rlvr.train.sft import shuffled_epochs, train_next_token
from rlvr.verifiers.math import math_reward, score
from tests.helpers import TINY_MODEL_FLAGS
from tests.test_cli import cli_error

PROMPTS = [f"q{i}?" for i in range(5)]
# for the answer "1" the math verifier accepts the first three (two are the same text up to
# whitespace) and rejects the last
COMPLETIONS = ("#### 1", " #### 1", "#### 1.0", "#### 2")


@pytest.fixture(scope="module")
def model_and_tokenizer():
    """A tiny model that mostly answers with one of COMPLETIONS (and sometimes with noise)."""
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = build_tiny_model(tiny, tok, seed=0)
    pairs = [(p, c) for p in PROMPTS for c in COMPLETIONS]
    train_next_token(
        model,
        tok,
        shuffled_epochs(pairs, 0),
        steps=40,
        batch_size=10,
        lr=1e-2,
        warmup_steps=2,
        progress=False,
    )
    return model, tok


ROWS = [{"prompt": p, "answer": "1", "id": i} for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize(
    ("text", "key"),
    [("#### 1", "#### 1"), ("  #### 1\n", "#### 1"), ("a \t\n b", "a b"), ("", "")],
)
def test_normalize_whitespace(text, key):
    assert normalize_whitespace(text) == key


def test_keeps_only_verified_distinct_completions_up_to_the_cap(model_and_tokenizer):
    model, tok = model_and_tokenizer
    config = RejectionConfig(
        num_samples=8, max_new_tokens=10, max_per_prompt=1, prompts_per_call=2, progress=False
    )
    kept, summary = rejection_sample(model, tok, ROWS, math_reward, config)
    print(summary)

    # every kept line is verified, carries its row's columns, and is SFT input
    assert kept and all(k["reward"] >= config.threshold for k in kept)
    assert all(score(k["completion"], "1") == 1.0 for k in kept)
    assert all(list(k)[:3] == ["prompt", "completion", "reward"] for k in kept)
    assert all(ROWS[k["id"]]["prompt"] == k["prompt"] and k["answer"] == "1" for k in kept)
    # the cap holds, so no prompt has duplicates either
    per_prompt = [[k["completion"] for k in kept if k["prompt"] == p] for p in PROMPTS]
    assert all(len(texts) <= 1 for texts in per_prompt)

    # the counts add up, and this model exercises the interesting stages
    assert summary["prompts"] == 5 and summary["sampled"] == 5 * 8
    assert sum(summary[stage] for stage in STAGES) == summary["sampled"]
    assert summary["accepted"] == summary["sampled"] - summary["rejected"]
    assert summary["kept"] == len(kept)
    assert summary["prompts_with_kept"] == sum(bool(texts) for texts in per_prompt)
    assert summary["acceptance_rate"] == summary["accepted"] / summary["sampled"]
    assert summary["rejected"] > 0 and summary["duplicates"] > 0 and summary["capped"] > 0

    # reference: the same seeded samples, classified one by one
    generator = torch.Generator().manual_seed(config.seed)
    expected = []
    for start in (0, 2, 4):
        chunk = ROWS[start : start + 2]
        batch = sample_completions(
            model, tok, [r["prompt"] for r in chunk], 8, 10, 1.0, generator=generator
        )
        for i, row in enumerate(chunk):
            mine = []
            for j in range(i * 8, (i + 1) * 8):
                text = batch.completions[j]
                if score(text, "1") == 1.0 and not batch.truncated[j] and not mine:
                    mine.append(text)
            expected += [(row["prompt"], text) for text in mine]
    assert [(k["prompt"], k["completion"]) for k in kept] == expected


def test_without_a_cap_distinct_texts_are_all_kept(model_and_tokenizer):
    model, tok = model_and_tokenizer
    config = RejectionConfig(num_samples=8, max_new_tokens=10, progress=False)
    kept, summary = rejection_sample(model, tok, ROWS, math_reward, config)
    keys = [(k["prompt"], normalize_whitespace(k["completion"])) for k in kept]
    assert len(keys) == len(set(keys))  # no duplicates after whitespace normalisation
    assert summary["capped"] == 0 and summary["duplicates"] > 0
    assert max(sum(k["prompt"] == p for k in kept) for p in PROMPTS) >= 2


def test_accept_hook_filters_after_the_verifier(model_and_tokenizer):
    model, tok = model_and_tokenizer
    config = RejectionConfig(num_samples=8, max_new_tokens=10, progress=False)
    seen = []

    def no_decimals(row, completion):
        seen.append(completion)
        return "." not in completion

    kept, summary = rejection_sample(model, tok, ROWS, math_reward, config, accept=no_decimals)
    assert all("." not in k["completion"] for k in kept)
    assert summary["filtered"] > 0
    assert all(score(c, "1") == 1.0 for c in seen)  # only verified completions reach the hook


def test_a_verifier_that_raises_rejects_and_is_counted(model_and_tokenizer):
    model, tok = model_and_tokenizer

    def broken(prompts, completions, **columns):
        raise RuntimeError("verifier down")

    config = RejectionConfig(num_samples=2, max_new_tokens=4, progress=False)
    kept, summary = rejection_sample(model, tok, ROWS[:2], broken, config)
    assert kept == [] and summary["rejected"] == 4 and summary["reward_errors"] == 4
    with pytest.raises(ValueError, match="max_new_tokens"):
        rejection_sample(model, tok, ROWS, math_reward, RejectionConfig())


def test_sample_command_output_trains_with_sft(model_and_tokenizer, tmp_path, capsys):
    model, tok = model_and_tokenizer
    model_dir = save_model(model, tok, tmp_path / "model")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "kept.jsonl"
    args = [
        "sample",
        "--model",
        str(model_dir),
        "--task",
        str(rows),
        "--output",
        str(out),
        "--num-samples",
        "4",
        "--max-new-tokens",
        "10",
        "--max-per-prompt",
        "2",
        "--no-progress",
    ]
    capsys.readouterr()
    main(args)
    summary = json.loads(capsys.readouterr().out)
    kept = read_jsonl(out)
    assert summary["kept"] == len(kept) > 0 and summary["prompts"] == 5
    assert all(
        k["reward"] == 1.0 and {"prompt", "completion", "answer", "id"} <= set(k) for k in kept
    )
    assert "--overwrite" in cli_error(args, capsys)

    # the kept lines are SFT data as they are
    run = tmp_path / "sft"
    main(
        [
            "sft",
            "--data",
            str(out),
            "--run-dir",
            str(run),
            "--steps",
            "2",
            "--batch-size",
            "2",
            *TINY_MODEL_FLAGS,
            "--no-progress",
        ]
    )
    assert (run / "model" / "config.json").exists()


def test_sample_command_on_a_task_and_on_bad_rows(model_and_tokenizer, tmp_path, capsys):
    model, tok = model_and_tokenizer
    model_dir = save_model(model, tok, tmp_path / "model")
    out = tmp_path / "arith.jsonl"
    capsys.readouterr()
    main(
        [
            "sample",
            "--model",
            str(model_dir),
            "--output",
            str(out),
            "--arithmetic.digits",
            "1",
            "--arithmetic.held-out-size",
            "5",
            "--num-prompts",
            "3",
            "--num-samples",
            "2",
            "--max-new-tokens",
            "6",
            "--no-progress",
        ]
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["prompts"] == 3 and summary["sampled"] == 6 and out.exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    args = [
        "sample",
        "--model",
        str(model_dir),
        "--task",
        str(bad),
        "--output",
        str(tmp_path / "x.jsonl"),
    ]
    assert cli_error(args, capsys).startswith(f"{bad}:2: missing field 'answer'")
