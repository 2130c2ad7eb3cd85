"""Padding never leaks: every registered loss, ratio level, surrogate, KL estimator, rollout
correction, reduction, advantage and DPO / distillation formula, run over one padded batch whose
padding holds -inf, +inf or NaN, gives exactly what it gives with 0 there, values and gradients,
and its gradient is finite and exactly 0 on padding.

The expected values are the 0-padding results themselves; the formulas' values on the real
tokens are derived by hand in the matching tests/test_algo_*.py files (and for the rollout
corrections with -inf / NaN padding in tests/test_algo_rollout_correction.py). A formula that
masks by multiplying (``-inf * 0 = nan``), or selects its output after a formula whose
derivative is NaN on padding (``0 * nan = nan`` in the backward), fails here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from rlvr import algo
from rlvr.algo.losses import RATIO_LEVELS, SURROGATES, ratio_spread, surrogate_conflicts
from rlvr.train.teacher import distill_metrics

INF, NAN = math.inf, math.nan

# 4 rows: 3, 2, 1 and 0 completion tokens (an all-padding row included).
MASK = torch.tensor(
    [[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
)
REAL = MASK.bool()
N, T = MASK.shape
_gen = torch.Generator().manual_seed(23)
LOGP = -0.3 - torch.rand(N, T, generator=_gen)  # log-probs in (-1.3, -0.3)
OLD = LOGP + 0.3 * torch.randn(N, T, generator=_gen)  # sampling / behaviour log-probs
REF = LOGP + 0.2 * torch.randn(N, T, generator=_gen)  # reference or teacher log-probs
ADV = torch.tensor([1.0, -0.5, 2.0, -1.5])  # one advantage per completion
ADV_TOKEN = torch.randn(N, T, generator=_gen)  # per-token advantages (GAE-like)
VALUES = torch.randn(N, T, generator=_gen)
RETURNS = torch.randn(N, T, generator=_gen)
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0])

PADDINGS = {
    "-inf,-inf": (-INF, -INF),  # logp - old = -inf - -inf = nan on padding
    "nan,nan": (NAN, NAN),
    "+inf,-inf": (INF, -INF),
    "-inf,0": (-INF, 0.0),
    "0,nan": (0.0, NAN),
}
"""(fill of the first kind of input, fill of the second) on the padding: the first kind is the
log-probs the gradient flows into, the second the detached ones beside them."""

Outputs = list
Grads = list[torch.Tensor]
Case = Callable[[float, float], tuple[Outputs, Grads]]


def pad(values: torch.Tensor, fill: float, grad: bool = False) -> torch.Tensor:
    """``values`` on the real tokens, ``fill`` on the padding (a fresh leaf when ``grad``)."""
    out = torch.where(REAL, values, torch.tensor(fill))
    return out.requires_grad_(True) if grad else out


def grads_of(total: torch.Tensor, inputs: list[torch.Tensor]) -> Grads:
    """d total / d each input (0 for an input the total does not use)."""
    found = torch.autograd.grad(total, inputs, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(found, inputs, strict=True)]


# ----------------------------------------------------------------------------- the cases

CASES: dict[str, Case] = {}


def _policy_case(surrogate: str, level: str, aggregation: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        outputs, grads = [], []
        clip_c = 3.0 if surrogate == "ppo-clip" else None
        for adv in (ADV, pad(ADV_TOKEN, b)):
            logp = pad(LOGP, a, grad=True)
            loss, metrics = algo.policy_loss(
                logp,
                pad(OLD, b),
                adv,
                MASK,
                beta=0.1,
                ref_logp=pad(REF, b),
                aggregation=aggregation,
                max_len=T,
                ratio_level=level,
                clip_ratio_c=clip_c,
                surrogate=surrogate,
                epsilon_low=0.2,
                epsilon_high=0.25,
            )
            outputs += [loss.detach(), metrics]
            grads += grads_of(loss, [logp])
        return outputs, grads

    return case


for _surrogate in SURROGATES:
    for _level in RATIO_LEVELS:
        if surrogate_conflicts(_surrogate, ratio_level=_level, clip_ratio_c=None):
            continue
        for _aggregation in algo.AGGREGATIONS:
            CASES[f"policy_loss/{_surrogate}/{_level}/{_aggregation}"] = _policy_case(
                _surrogate, _level, _aggregation
            )


def _kl_loss_case(estimator: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        logp = pad(LOGP, a, grad=True)
        loss, metrics = algo.policy_loss(
            logp, pad(OLD, b), ADV, MASK, beta=0.5, ref_logp=pad(REF, b), kl_estimator=estimator
        )
        return [loss.detach(), metrics], grads_of(loss, [logp])

    return case


def _kl_reward_case(estimator: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        outputs = []
        for rewards in (REWARDS, pad(algo.outcome_to_token_rewards(REWARDS, MASK), b)):
            outputs.append(
                algo.kl_in_reward(rewards, pad(LOGP, a), pad(REF, b), MASK, 0.1, estimator)
            )
        return outputs, []

    return case


for _estimator in algo.KL_ESTIMATORS:
    CASES[f"policy_loss/kl/{_estimator}"] = _kl_loss_case(_estimator)
    CASES[f"kl_in_reward/{_estimator}"] = _kl_reward_case(_estimator)


def _ratio_case(level: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        logp = pad(LOGP, a, grad=True)
        ratio = RATIO_LEVELS[level](logp, pad(OLD, b), MASK)
        return [ratio.detach()], grads_of(algo.masked_sum(ratio, MASK), [logp])

    return case


def _surrogate_case(surrogate: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        # the surrogate's own inputs, each a leaf with garbage on its padding
        ratio = pad((LOGP - OLD).exp(), a, grad=True)
        log_ratio = pad(LOGP - OLD, a, grad=True)
        logp = pad(LOGP, a, grad=True)
        outputs, grads = [], []
        for adv in (ADV, pad(ADV_TOKEN, b)):
            per_token, clipped, dual = SURROGATES[surrogate](
                ratio,
                adv,
                logp=logp,
                log_ratio=log_ratio,
                mask=MASK,
                epsilon_low=0.2,
                epsilon_high=0.25,
            )
            outputs += [per_token.detach(), clipped, dual]
            grads += grads_of(algo.masked_sum(per_token, MASK), [ratio, log_ratio, logp])
        return outputs, grads

    return case


for _level in RATIO_LEVELS:
    CASES[f"ratio/{_level}"] = _ratio_case(_level)
for _surrogate in SURROGATES:
    CASES[f"surrogate/{_surrogate}"] = _surrogate_case(_surrogate)


def _value_case(aggregation: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        outputs, grads = [], []
        for clip in (None, 0.2):
            values = pad(VALUES, a, grad=True)
            loss, metrics = algo.value_loss(
                values,
                pad(VALUES + 0.1, b),
                pad(RETURNS, b),
                MASK,
                clip,
                aggregation=aggregation,
                max_len=T,
            )
            outputs += [loss.detach(), metrics]
            grads += grads_of(loss, [values])
        return outputs, grads

    return case


def _aggregation_case(aggregation: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        del b
        per_token = pad(LOGP, a, grad=True)
        loss = algo.AGGREGATIONS[aggregation](per_token, MASK, max_len=T)
        return [loss.detach()], grads_of(loss, [per_token])

    return case


def _reduction_case(name: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        del b
        values = pad(VALUES, a, grad=True)
        if name == "masked_whiten":
            out = algo.masked_whiten(values, MASK)
            return [out.detach()], grads_of((out * RETURNS).sum(), [values])
        rows = getattr(algo, name)(values, MASK, dim=1)
        whole = getattr(algo, name)(values, MASK)
        return [rows.detach(), whole.detach()], grads_of(rows.sum() + whole, [values])

    return case


for _aggregation in algo.AGGREGATIONS:
    CASES[f"value_loss/{_aggregation}"] = _value_case(_aggregation)
    CASES[f"aggregation/{_aggregation}"] = _aggregation_case(_aggregation)
for _name in ("masked_sum", "masked_mean", "masked_whiten"):
    CASES[f"reduction/{_name}"] = _reduction_case(_name)


def _correction_case(mode: str, level: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        logp, behaviour = pad(LOGP, a), pad(OLD, b)
        weights, keep = algo.ROLLOUT_CORRECTIONS[mode](logp, behaviour, MASK, cap=1.2, level=level)
        outputs = [weights, keep, algo.importance_ratios(logp, behaviour, MASK, level)]
        for adv in (ADV, pad(ADV_TOKEN, b)):
            outputs += list(algo.corrected_advantages(adv, MASK, weights, keep))
        outputs.append(algo.mismatch_metrics(logp, behaviour, MASK, weights, keep, level))
        return outputs, []

    return case


for _mode in algo.ROLLOUT_CORRECTIONS:
    for _level in ("token", "sequence"):
        CASES[f"correction/{_mode}/{_level}"] = _correction_case(_mode, _level)


def _gae(a: float, b: float) -> tuple[Outputs, Grads]:
    rewards = pad(algo.outcome_to_token_rewards(REWARDS, MASK), a)
    advantages, returns = algo.gae_advantages(rewards, pad(VALUES, b), MASK, 0.99, 0.95)
    return [advantages, returns], []


def _reinforce_pp(a: float, b: float) -> tuple[Outputs, Grads]:
    del b
    rewards = pad(algo.outcome_to_token_rewards(REWARDS, MASK), a)
    advantages, returns = algo.reinforce_pp_token_advantages(rewards, MASK, 0.9)
    return [advantages, returns, algo.discounted_returns(rewards, MASK, 0.9)], []


def _dpo_case(loss_type: str) -> Case:
    def case(a: float, b: float) -> tuple[Outputs, Grads]:
        # rows 0, 1 chosen and rows 2, 3 rejected (row 3 is all padding: log-prob sum 0)
        token_logps = pad(LOGP, a, grad=True)
        policy = algo.sequence_logps(token_logps, MASK)
        ref = algo.sequence_logps(pad(REF, b), MASK)
        loss, metrics = algo.dpo_loss(policy[:2], policy[2:], ref[:2], ref[2:], 0.1, loss_type)
        return [policy.detach(), ref, loss.detach(), metrics], grads_of(loss, [token_logps])

    return case


def _distill(a: float, b: float) -> tuple[Outputs, Grads]:
    student, teacher = pad(OLD, a), pad(REF, b)
    kl_adv = algo.reverse_kl_advantages(student, teacher, MASK)
    outputs = [kl_adv, distill_metrics(SimpleNamespace(logprobs=student), teacher, MASK)]
    for reward_adv in (ADV, pad(ADV_TOKEN, b)):
        outputs.append(algo.mixed_advantages(pad(kl_adv, a), reward_adv, MASK, 1.0, 0.5))
    return outputs, []


def _ratio_spread(a: float, b: float) -> tuple[Outputs, Grads]:
    return [ratio_spread(pad(LOGP, a), pad(OLD, b), MASK)], []


CASES["gae"] = _gae
CASES["reinforce_pp_token"] = _reinforce_pp
for _loss_type in algo.DPO_LOSSES:
    CASES[f"dpo/{_loss_type}"] = _dpo_case(_loss_type)
CASES["distill"] = _distill
CASES["ratio_spread"] = _ratio_spread


# ----------------------------------------------------------------------------- the test


def _assert_same(got: object, expected: object, where: str) -> None:
    """Exactly equal (NaN equals nothing, so a NaN anywhere fails)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape, where
        assert torch.equal(got, expected), f"{where}: {got} != {expected}"
    else:
        assert got == expected, f"{where}: {got} != {expected}"


@pytest.mark.parametrize("fills", list(PADDINGS.values()), ids=list(PADDINGS))
@pytest.mark.parametrize("name", list(CASES))
def test_nonfinite_padding_changes_nothing(name: str, fills: tuple[float, float]) -> None:
    expected, expected_grads = CASES[name](0.0, 0.0)
    got, got_grads = CASES[name](*fills)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        _assert_same(g, e, f"{name} output {i}")
    for i, (g, e) in enumerate(zip(got_grads, expected_grads, strict=True)):
        assert torch.isfinite(g).all(), f"{name} gradient {i}: {g}"
        assert torch.equal(g, e), f"{name} gradient {i}: {g} != {e}"
        assert (g[~REAL] == 0).all(), f"{name} gradient {i} on padding: {g}"


def test_the_table_covers_every_registry() -> None:
    """A registry entry added later gets a row here without anyone remembering to add it."""
    names = set(CASES)
    for surrogate in SURROGATES:
        assert f"surrogate/{surrogate}" in names
        assert any(n.startswith(f"policy_loss/{surrogate}/") for n in names)
    for registry, prefix in (
        (RATIO_LEVELS, "ratio"),
        (algo.AGGREGATIONS, "aggregation"),
        (algo.KL_ESTIMATORS, "kl_in_reward"),
        (algo.KL_ESTIMATORS, "policy_loss/kl"),
        (algo.DPO_LOSSES, "dpo"),
    ):
        assert {f"{prefix}/{key}" for key in registry} <= names
    assert {f"correction/{mode}/sequence" for mode in algo.ROLLOUT_CORRECTIONS} <= names
    # the batch really has padding, an empty row, and garbage that is not finite
    assert (~REAL).any() and not REAL[-1].any()
    assert not torch.isfinite(pad(LOGP, -INF)).all()


def test_the_issue_23_example() -> None:
    """Issue 23, finding 4, verbatim: [[nan, nan, nan]] before; the sequence log-ratio is
    (-1 - -1.1) + (-2 - -1.9) = 0.1 - 0.1 = 0, so the weight is exp(0) = 1 on both real tokens
    and 0 on the padding."""
    for mode in ("tis", "mis", "icepop"):
        weights, keep = algo.ROLLOUT_CORRECTIONS[mode](
            torch.tensor([[-1.0, -2.0, 0.0]]),
            torch.tensor([[-1.1, -1.9, -INF]]),
            torch.tensor([[1.0, 1.0, 0.0]]),
            cap=2.0,
            level="sequence",
        )
        torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 0.0]]), atol=1e-6, rtol=0)
        assert keep.tolist() == [[True, True, False]], mode
