"""SFT: completion-only labels, the loss's divisor by hand, truncation, chat templates, JSONL
errors, LoRA merging, a seeded learning check and the `rlvr sft` command."""

import itertools
import json
import math
from collections import Counter

import pytest
import torch

from rlvr.cli import main
from rlvr.config import RunPlace
from rlvr.models.chat import format_prompt
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, load_model
from rlvr.pipelines.sft import SFTConfig, add_lora, run_sft
from rlvr.report.run_dir import read_jsonl
from rlvr.tasks import arithmetic
from rlvr.tasks.arithmetic import ArithmeticTaskConfig, worked_solution
from rlvr.tasks.jsonl import JSONLError, load_pairs
from rlvr.train.sft import (
    IGNORE_INDEX,
    completion_loss,
    completion_nll,
    pairs_loss,
    shuffled_epochs,
    supervised_batch,
    train_next_token,
)
from tests.helpers import TINY_MODEL_FLAGS
from tests.test_cli import cli_error

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
QUIET_PLACE = RunPlace(progress=False)
X = IGNORE_INDEX


def write_pairs(path, pairs):
    path.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in pairs))
    return path


def test_supervised_batch_labels_only_completion_and_eos():
    tok = build_char_tokenizer()
    ids = {ch: tok.convert_tokens_to_ids(ch) for ch in "abcxy"}
    eos, pad = tok.eos_token_id, tok.pad_token_id
    batch = supervised_batch(tok, ["ab", "c"], ["x", "y"])
    # row 0: a b | x EOS; row 1: c | y EOS, then one pad
    assert batch["input_ids"].tolist() == [
        [ids["a"], ids["b"], ids["x"], eos],
        [ids["c"], ids["y"], eos, pad],
    ]
    assert batch["labels"].tolist() == [[X, X, ids["x"], eos], [X, ids["y"], eos, X]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert batch["truncated"].tolist() == [False, False]


def test_supervised_batch_cuts_long_sequences_on_the_right_and_flags_them():
    tok = build_char_tokenizer()
    batch = supervised_batch(tok, ["ab", "c"], ["xyz", "y"], max_length=4)
    # row 0 is a b x y z EOS (6 tokens): cut to a b x y, its end (z, EOS) is not trained on
    assert batch["input_ids"].shape == (2, 4)
    assert batch["labels"][0].tolist() == [X, X] + tok.convert_tokens_to_ids(["x", "y"])
    assert batch["truncated"].tolist() == [True, False]


def test_completion_loss_divides_by_completion_tokens():
    # V = 3. Targets sit at labels[:, 1:]; position t's logits predict labels[t + 1].
    labels = torch.tensor([[X, X, 1, 2], [X, 0, X, X]])  # 3 completion tokens (one row padded)
    logits = torch.zeros(2, 4, 3)  # uniform: -log p = ln 3
    logits[0, 1] = torch.tensor([0.0, math.log(2.0), 0.0])  # predicts label 1 with p = 2/4
    logits[1, 2:] = 100.0 * torch.tensor([1.0, -1.0, 0.0])  # padding: must not count
    logits[:, 3] = 7.0  # the last position predicts nothing
    loss, n = completion_loss(logits, labels)
    # targets: row 0 -> 1 (ln 2) and 2 (ln 3); row 1 -> 0 (ln 3); divisor 3
    assert n == 3
    assert loss.item() == pytest.approx((math.log(2) + 2 * math.log(3)) / 3, abs=1e-6)
    # no completion tokens: 0, not NaN
    empty, zero = completion_loss(logits, torch.full_like(labels, X))
    assert (empty.item(), zero) == (0.0, 0)


def test_pairs_loss_matches_the_models_own_loss():
    tok = build_char_tokenizer()
    model = build_tiny_model(TINY, tok, seed=0)
    pairs = [("12+3=", "15"), ("7+8=", "15 #### 15")]
    loss, n, _ = pairs_loss(model, tok, pairs)
    inputs = supervised_batch(tok, *zip(*pairs))
    reference = model(**{k: v for k, v in inputs.items() if k != "truncated"}).loss
    assert n == len("15") + 1 + len("15 #### 15") + 1
    assert loss.item() == pytest.approx(reference.item(), abs=1e-5)


def test_chat_template_wraps_the_prompt_only_when_there_is_one():
    tok = build_char_tokenizer()
    assert format_prompt(tok, "2+3=", chat_template=True) == "2+3="  # the tiny one has none
    tok.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    assert format_prompt(tok, "2+3=", chat_template=True) == "<user>2+3=<assistant>"
    assert format_prompt(tok, "2+3=", chat_template=False) == "2+3="


def test_malformed_jsonl_names_file_line_and_field(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "1+1=", "completion": "2"}\n\n{"prompt": "2+2="}\n')
    with pytest.raises(JSONLError, match=r"pairs.jsonl:3: missing field 'completion'") as err:
        load_pairs(path)
    assert (err.value.line, err.value.field) == (3, "completion")
    path.write_text('{"prompt": "1+1=", "completion": "2"}\n{"prompt": "2+2=", "completion": 4}\n')
    with pytest.raises(JSONLError, match=r"pairs.jsonl:2: field 'completion' must be a string"):
        load_pairs(path)
    path.write_text('\n{"prompt": "1+1=", "completion": "  "}\n')
    with pytest.raises(JSONLError, match=r"pairs.jsonl:2: field 'completion' is empty"):
        load_pairs(path)


def test_sft_raises_held_out_likelihood_beyond_letter_frequencies(tmp_path):
    """40 one-digit worked solutions, 40 steps: held-out loss falls far below what any fixed
    letter distribution (a constant predictor) can reach, so the model learned structure."""
    task = ArithmeticTaskConfig(digits=1, held_out_size=16, held_out_seed=3)
    stream = dict.fromkeys(itertools.islice(arithmetic.train_problems(task, 0), 400))
    train = [(p.prompt, worked_solution(p)) for p in list(stream)[:40]]
    held = [(p.prompt, worked_solution(p)) for p in arithmetic.held_out_problems(task)]
    # the best constant predictor: training letter frequencies (EOS as "\0"), scored on held-out
    counts = Counter(ch for _, c in train for ch in c + "\0")
    held_text = "".join(c + "\0" for _, c in held)
    unigram = -sum(math.log(counts[ch] / counts.total()) for ch in held_text) / len(held_text)
    config = SFTConfig(
        data=str(write_pairs(tmp_path / "train.jsonl", train)),
        eval_data=str(write_pairs(tmp_path / "held.jsonl", held)),
        steps=40,
        batch_size=8,
        lr=3e-3,
        place=QUIET_PLACE,
        tiny=TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, intermediate_size=192),
    )
    model_dir = run_sft(config, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    before, after = summary["eval_before"]["loss"], summary["eval_after"]["loss"]
    print(f"held-out loss {before:.3f} -> {after:.3f}; letter-frequency baseline {unigram:.3f}")
    # measured at these seeds: 4.52 -> 1.58, baseline 2.42
    assert before > 4.0  # a fresh model: about ln(vocabulary)
    assert after < 0.8 * unigram
    # the saved model is the trained one
    model, tok = load_model(model_dir)
    assert completion_nll(model, tok, held) == pytest.approx(after, abs=1e-4)


def test_lora_trains_adapters_only_and_merges_exactly(tmp_path):
    pytest.importorskip("peft")
    tok = build_char_tokenizer()
    model = add_lora(build_tiny_model(TINY, tok, seed=0), rank=4, alpha=8)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    pairs = [("1+1=", "#### 2"), ("2+2=", "#### 4")]
    train_next_token(
        model,
        tok,
        shuffled_epochs(pairs, 0),
        steps=5,
        batch_size=2,
        lr=1e-2,
        warmup_steps=1,
        progress=False,
    )
    ids = supervised_batch(tok, *zip(*pairs))["input_ids"]
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            original = model(input_ids=ids).logits
        merged = model.merge_and_unload()(input_ids=ids).logits
    assert not torch.allclose(adapted, original, atol=1e-4)  # the adapters learned something
    assert torch.allclose(merged, adapted, atol=1e-5)  # merging keeps the adapted function

    data = write_pairs(tmp_path / "pairs.jsonl", pairs)
    out = run_sft(
        SFTConfig(data=str(data), steps=2, batch_size=2, lora_rank=2, tiny=TINY, place=QUIET_PLACE),
        tmp_path / "lora",
    )
    assert not (out / "adapter_config.json").exists()  # a plain HF directory
    load_model(out)


def test_lora_without_peft_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_peft(name, *args, **kwargs):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(ImportError, match=r"pip install rlvr\[lora\]"):
        add_lora(torch.nn.Linear(2, 2), rank=2, alpha=None)


def test_sft_command_writes_a_run_directory(tmp_path, capsys):
    data = write_pairs(tmp_path / "pairs.jsonl", [("1+1=", "2"), ("2+2=", "4"), ("3+3=", "6")])
    run = tmp_path / "sft"
    args = [
        "sft",
        "--data",
        str(data),
        "--run-dir",
        str(run),
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--max-length",
        "5",
        *TINY_MODEL_FLAGS,
        "--no-progress",
    ]
    main(args)
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "loss_curve.png",
        "summary.json",
        "model/config.json",
        "model/tokenizer.json",
    ):
        assert (run / name).exists(), name
    metrics = read_jsonl(run / "metrics.jsonl")
    # 3 pairs, 2 epochs, batches of 2: ceil(6 / 2) = 3 steps, each with a loss
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["loss"] > 0 and m["tokens/completion"] > 0 for m in metrics)
    summary = json.loads((run / "summary.json").read_text())
    # every sequence is 4 prompt + 1 answer + EOS = 6 tokens > 5: all 6 sequences were cut
    assert summary["steps"] == 3 and summary["truncated_sequences"] == 6
    load_model(run / "model")
    assert "--overwrite" in cli_error(args, capsys)
    assert "exactly one of --data" in cli_error(
        ["sft", "--run-dir", str(tmp_path / "none")], capsys
    )
