"""Held-out accuracy: the fraction of sampled (or greedy) completions a verifier accepts."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlvr.rollout.sampler import sample_completions
from rlvr.workers import default_workers


def held_out_accuracy(
    model: torch.nn.Module,
    tokenizer,
    rows: list[dict[str, str]],
    score: Callable[[str, dict], float],
    max_new_tokens: int,
    temperature: float = 0.0,
    num_samples: int = 1,
    seed: int = 0,
    batch_size: int = 256,
    workers: int = 0,
) -> float:
    """Mean of `score(completion, row)` over `num_samples` completions per row.

    `temperature == 0` is greedy decoding (then one sample per row is enough); with
    `temperature > 0` the result is pass@1 at that temperature, averaged over the samples. The
    divisor is `len(rows) * num_samples`. `workers` sampling threads (0: one per torch thread
    on a CPU, `rlvr.workers.default_workers`).
    """
    workers = default_workers(model, workers)
    generator = torch.Generator().manual_seed(seed)
    per_call = max(1, batch_size // num_samples)
    correct = 0.0
    for start in range(0, len(rows), per_call):
        chunk = rows[start : start + per_call]
        batch = sample_completions(
            model,
            tokenizer,
            [r["prompt"] for r in chunk],
            num_samples=num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=generator,
            workers=workers,
        )
        repeated = [r for r in chunk for _ in range(num_samples)]
        correct += sum(score(c, r) for c, r in zip(batch.completions, repeated, strict=True))
    return correct / (len(rows) * num_samples)
