"""Seeded learning test: GRPO lifts held-out accuracy of a small base by a real margin.

A 2-digit version of the lab: a small base is trained on solutions that usually (p = 0.8) drop
the carry, so it mostly gets carrying problems wrong; GRPO on the strict verifier's reward must
select the carrying procedure. Held-out problems are never trained on.
"""

from dataclasses import dataclass

import torch

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.run_dir import RunDirectory
from rlvr.tasks import arithmetic
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.train.config import GRPOConfig
from rlvr.train.evaluate import held_out_accuracy
from rlvr.train.grpo import train_grpo
from rlvr.train.sft import train_next_token
from rlvr.verifiers.math import math_reward


@dataclass
class Learned:
    """Held-out accuracies before and after GRPO, and the run's metric records."""

    before: float
    after: float
    before_sampled: float
    after_sampled: float
    records: list[dict]


def learn_carrying(tmp_path, **grpo: object) -> Learned:
    """Train the carry-dropping base (seeded) and run GRPO on it with `grpo` switches over
    this test's defaults; held-out greedy and sampled accuracy before and after."""
    torch.set_num_threads(2)
    task = ArithmeticTaskConfig(digits=2, held_out_size=150, held_out_seed=7)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=512),
        tokenizer,
        seed=0,
    )
    train_next_token(
        model,
        tokenizer,
        arithmetic.task_spec(task).corpus(0, 0.8),
        steps=BASE_STEPS,
        batch_size=16,
        lr=2e-3,
        progress=False,
    )
    held_out = arithmetic.rows(arithmetic.held_out_problems(task))

    def accuracy(m, temperature):
        return held_out_accuracy(
            m,
            tokenizer,
            held_out,
            arithmetic.task_spec(task).score,
            max_new_tokens=30,
            temperature=temperature,
            num_samples=1 if temperature == 0 else 4,
            seed=1,
        )

    before, before_sampled = accuracy(model, 0.0), accuracy(model, 1.0)
    switches = {"steps": GRPO_STEPS, "prompts_per_step": 16, "group_size": 8} | grpo
    config = GRPOConfig(max_new_tokens=30, lr=1e-4, eval_every=1000, **switches)
    rows = ({"prompt": p.prompt, "answer": p.answer} for p in arithmetic.train_problems(task, 99))
    records = train_grpo(
        model,
        tokenizer,
        rows,
        [math_reward],
        config,
        RunDirectory(tmp_path, "learn"),
        evaluate=lambda m: {},
        seed=0,
        progress=False,
    )
    after, after_sampled = accuracy(model, 0.0), accuracy(model, 1.0)
    return Learned(before, after, before_sampled, after_sampled, records)


def test_grpo_raises_held_out_accuracy(tmp_path):
    learned = learn_carrying(tmp_path)
    before, after = learned.before, learned.after
    before_sampled, after_sampled = learned.before_sampled, learned.after_sampled
    rewards = [r["reward/mean"] for r in learned.records if "reward/mean" in r]
    early, late = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(
        f"held-out greedy {before:.3f} -> {after:.3f}, sampled {before_sampled:.3f} -> "
        f"{after_sampled:.3f}; train reward {early:.3f} -> {late:.3f}"
    )
    assert before < 0.7, "the base should fail most carrying problems"
    # measured at these seeds: greedy 0.49 -> 0.93, sampled 0.40 -> 0.59;
    # the bounds leave room for platform noise
    assert after >= before + 0.25
    assert after_sampled >= before_sampled + 0.1
    assert late > early


BASE_STEPS = 400
GRPO_STEPS = 30
