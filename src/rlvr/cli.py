"""`rlvr` command line: thin wrappers that parse a config dataclass and call the library."""

from __future__ import annotations

import os

# Before torch is imported: with OpenMP's default busy-wait, two threads sharing the CPU with
# another process ran ten times slower per step (measured); passive waiting avoids that.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import tyro  # noqa: E402

from rlvr.pipelines.lab import LabConfig  # noqa: E402
from rlvr.tasks.arithmetic import ArithmeticTaskConfig  # noqa: E402


@dataclass(frozen=True)
class EvalConfig:
    """`rlvr eval`: held-out accuracy of a local model on the arithmetic task."""

    model: str
    """A local Hugging Face model directory (for example runs/lab/model)."""
    max_new_tokens: int = 48
    """Completion budget in tokens."""
    temperature: float = 0.0
    """0 is greedy; > 0 gives sampled pass@1 at that temperature."""
    num_samples: int = 1
    """Completions per problem (averaged) when sampling."""
    seed: int = 0
    """Sampling seed."""
    task: ArithmeticTaskConfig = field(default_factory=ArithmeticTaskConfig)


@dataclass(frozen=True)
class VerifyConfig:
    """`rlvr verify`: grade one completion with the strict math verifier and explain it."""

    completion: str
    """The model's completion text."""
    answer: str
    """The reference answer."""
    marker: str = "####"
    """The task's final-answer marker."""


def lab(config: LabConfig) -> None:
    from rlvr.pipelines.lab import run_lab

    run_lab(config)


def evaluate(config: EvalConfig) -> None:
    from rlvr.models.tiny import load_model
    from rlvr.tasks import arithmetic
    from rlvr.train.evaluate import held_out_accuracy
    from rlvr.verifiers.math import score

    model, tokenizer = load_model(config.model)
    rows = arithmetic.rows(arithmetic.held_out_problems(config.task))
    accuracy = held_out_accuracy(
        model, tokenizer, rows, score, config.max_new_tokens,
        temperature=config.temperature, num_samples=config.num_samples, seed=config.seed,
    )  # fmt: skip
    mode = "greedy" if config.temperature == 0 else f"sampled at T={config.temperature}"
    print(json.dumps({"model": config.model, "mode": mode, "problems": len(rows),
                      "accuracy": accuracy}))  # fmt: skip


def verify(config: VerifyConfig) -> None:
    from rlvr.verifiers.math import verify as verify_math

    reward, parts = verify_math(config.completion, config.answer, marker=config.marker)
    print(json.dumps({"reward": reward, **parts}))


COMMANDS = {
    "lab": (lab, LabConfig, "Build a tiny base model and watch GRPO's reward curve climb."),
    "eval": (evaluate, EvalConfig, "Held-out accuracy of a local model."),
    "verify": (verify, VerifyConfig, "Grade one completion with the strict math verifier."),
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(COMMANDS)
        if argv and not argv[0].startswith("-"):
            print(f"rlvr: unknown command {argv[0]!r}; choose one of: {names}", file=sys.stderr)
            raise SystemExit(2)
        print(f"usage: rlvr {{{names}}} [--help]\n")
        for name, (_, _, text) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-file load/save bars drown rlvr's own progress
    run, config_type, text = COMMANDS[argv[0]]
    config = tyro.cli(config_type, args=argv[1:], prog=f"rlvr {argv[0]}", description=text)
    run(config)


if __name__ == "__main__":
    main()
