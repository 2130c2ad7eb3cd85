"""Small helpers shared by the test files."""

from __future__ import annotations

import torch

TINY_MODEL_FLAGS = [
    "--tiny.hidden-size",
    "32",
    "--tiny.num-layers",
    "1",
    "--tiny.num-heads",
    "2",
    "--tiny.intermediate-size",
    "64",
]
"""CLI flags of the smallest tiny model the tests train (32 wide, one layer, two heads)."""

SMALL_TRAIN_FLAGS = [
    *TINY_MODEL_FLAGS,
    "--base.steps",
    "3",
    "--base.batch-size",
    "4",
    "--grpo.steps",
    "2",
    "--grpo.prompts-per-step",
    "2",
    "--grpo.group-size",
    "2",
    "--eval-samples",
    "1",
    "--no-progress",
]
"""`rlvr train` flags of a two-step run from a three-step tiny base: a task trains end to end."""


def close(actual, expected, atol: float = 1e-6, *, dtype: torch.dtype = torch.float32) -> None:
    """Assert that ``actual`` equals ``expected`` elementwise within ``atol`` (no relative slack).

    Both sides (tensors, numbers or nested lists) are converted to tensors of ``dtype`` first,
    so a hand-written list can be compared with a tensor of any dtype. Pass
    ``dtype=torch.float64`` to compare float64 results without rounding them to float32.
    """
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=dtype),
        torch.as_tensor(expected, dtype=dtype),
        atol=atol,
        rtol=0,
    )
