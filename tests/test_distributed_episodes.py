"""`torchrun --nproc-per-node 2 -m rlvr train --env FILE.py:NAME`: two gloo ranks on 127.0.0.1
train on rank 0's episodes (broadcast to both) and log what one process logs for the same
multi-turn run: the action mask and its divisors hold across ranks. The environment
(tests/data/envs/chatty.py) rewards distinct characters, so the untrained model's groups have
spread and the gradients compared are not zero."""

import random
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
from rlvr.train.sft import train_next_token
from tests.test_distributed_lab import records, train_on_two_ranks

ENV = f"{Path(__file__).parent / 'data' / 'envs' / 'chatty.py'}:Chatty"
ARGS = [
    "--env",
    ENV,
    "--grpo.steps",
    "2",
    "--grpo.prompts-per-step",
    "2",
    "--grpo.group-size",
    "4",
    "--grpo.eval-every",
    "4",
    "--grpo.cpu-workers",
    "1",
    "--grpo.max-new-tokens",
    "8",
    "--eval-samples",
    "1",
    "--no-progress",
]


def short_replies():
    rng = random.Random(0)
    while True:
        reply = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 4)))
        yield f"{rng.randrange(40)}:", reply


COMPARED = ("reward/mean", "env/turns_mean", "env/env_token_frac", "completion/len_mean")


@pytest.mark.dist
def test_two_ranks_log_what_one_process_logs_on_episodes(tmp_path):
    runs, model = tmp_path / "runs", tmp_path / "model"
    tokenizer = build_char_tokenizer()
    size = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    policy = build_tiny_model(size, tokenizer, seed=0)
    train_next_token(
        policy, tokenizer, short_replies(), steps=40, batch_size=8, lr=1e-2, progress=False, seed=0
    )  # replies of a few characters, then EOS
    save_model(policy, tokenizer, model)
    common = ["--runs-dir", str(runs), "--model", str(model), *ARGS]
    main(["train", "--run-name", "one", *common])
    train_on_two_ranks(["--run-name", "two", *common])
    one, two = records(runs / "one"), records(runs / "two")
    assert len(one) == len(two) == 2
    for a, b in zip(one, two):
        assert a["env/env_token_frac"] > 0  # the episodes had environment tokens
        assert a["grad_norm"] > 0 and a["reward/std"] > 0
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4, abs=1e-6)
