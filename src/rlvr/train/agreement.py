"""Sampler and learner agree, or the run says so at its first step.

On a step whose update starts on-policy (no rollout correction, no rollouts sampled ahead), the
loss's first pass scores the very tokens the engine sampled, with the weights that sampled
them: the ratio `exp(logp - old_logp)` must be 1 on every completion token. A forward plan
that scores them differently (a KV cache passed under a keyword the installed transformers
ignores, a prompt left out, a wrong temperature) trains on a ratio that is not 1 and collapses
slowly, without an error. The check takes the largest `|logp - old_logp|` over the first
pass's loss-mask tokens (no extra forward: the loss's own log-probs) and logs it every step as
`agreement/max_abs_log_ratio`.

Where the engine and the learner run the same numerics (the in-process and Ray engines, fp32
weights), a deviation past `FP32_TOLERANCE` stops the run before the optimizer step, with one
line naming both log-prob paths, the deviation and the library versions. Where they cannot
agree exactly (vLLM, bf16 or fp16 weights), the value is logged and a large one warned about
once, pointing at `--grpo.rollout-correction.mode`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.config import UserError
from rlvr.report.environment import environment

FP32_TOLERANCE = 1e-3
"""The largest first-pass |log ratio| an fp32 run may show before it stops. Measured on the
lab's 100 steps (every step's first pass): at most 1.2e-4, median 1.6e-5; the forward plans'
tests (tests/test_logprob_agreement.py) stay under 1e-4. The transformers fault this guards
against showed ratio 0.83 and approx. KL 1.28 at the lab's first step. Long completions on
larger models add fp32 rounding; 1e-3 leaves room for it and stays three orders of magnitude
below a real disagreement."""

WARN_ABOVE = 0.1
"""Where the engine cannot agree exactly: a first-pass |log ratio| above this is warned about
(once per run); below it bf16 rounding is the usual cause."""


class LogprobMismatchError(UserError):
    """The learner's first-pass log-probs disagree with the sampler's: the install computes
    the update on other numbers than the ones sampled (the run stops; nothing was updated)."""


@dataclass(frozen=True)
class AgreementCheck:
    """How a run checks its first pass: `tolerance` stops it (None: log and warn only);
    `engine` names the sampler's log-prob path for the message."""

    tolerance: float | None
    engine: str


def agreement_check(on_policy: bool, engine: object, dtype: torch.dtype) -> AgreementCheck | None:
    """The check a run with this `engine` and policy `dtype` makes; None when its first pass
    is not on-policy (a rollout correction or rollouts sampled ahead: the ratio is then not 1
    by design). An engine says it runs the learner's own numerics with `exact_logprobs =
    True`; it stops the run only with fp32 weights."""
    if not on_policy:
        return None
    exact = bool(getattr(engine, "exact_logprobs", False)) and dtype == torch.float32
    name = getattr(engine, "logprob_path", type(engine).__name__)
    return AgreementCheck(FP32_TOLERANCE if exact else None, name)


def check_agreement(
    check: AgreementCheck, max_abs_log_ratio: float, learner_path: str, step: int
) -> str | None:
    """Raise `LogprobMismatchError` when `max_abs_log_ratio` passes the check's tolerance.
    Without a tolerance, the warning to give (the caller gives it once per run) when it passes
    `WARN_ABOVE`; else None."""
    if check.tolerance is not None and not max_abs_log_ratio <= check.tolerance:  # NaN too
        raise LogprobMismatchError(
            f"sampler and learner disagree at step {step}: on-policy, where the ratio must be "
            f"1, the largest |log ratio| is {max_abs_log_ratio:.3g} (tolerance "
            f"{check.tolerance:g}) between the engine's log-probs ({check.engine}) and the "
            f"learner's forward ({learner_path}); {versions()}. Nothing was updated. Install "
            "the locked versions (constraints/lock.txt) or report this with the line above"
        )
    if check.tolerance is None and max_abs_log_ratio > WARN_ABOVE:
        return (
            f"the first pass's largest |log ratio| is {max_abs_log_ratio:.3g} between "
            f"{check.engine} and the learner ({learner_path}): the engine's numerics differ "
            "from the learner's; --grpo.rollout-correction.mode tis (or mis, icepop) corrects it"
        )
    return None


def versions() -> str:
    """`torch X, transformers Y` of this process (`report.environment`)."""
    env = environment()
    return f"torch {env['torch']}, transformers {env['transformers']}"
