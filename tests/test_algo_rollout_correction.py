"""Rollout-correction weights and masks against values worked out by hand, with padding."""

import math

import pytest
import torch

from rlvr.algo.rollout_correction import (
    ROLLOUT_CORRECTIONS,
    corrected_advantages,
    importance_ratios,
    mismatch_metrics,
)
from tests.helpers import close

E = math.e
# log-ratios logp - behaviour: row 0 [0, -1, +1, pad], row 1 [ln 3, -ln 4, pad, pad]
LOGP = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.2, -3.0, 0.0, 0.0]])
BEHAVIOUR = torch.tensor(
    [[-1.0, -1.0, -1.5, 5.0], [-0.2 - math.log(3), -3.0 + math.log(4), -7.0, 9.0]]
)
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def run(mode: str, **kwargs):
    return ROLLOUT_CORRECTIONS[mode](LOGP, BEHAVIOUR, MASK, **kwargs)


def test_token_ratios_and_padding():
    close(importance_ratios(LOGP, BEHAVIOUR, MASK), [[1, 1 / E, E, 0], [3, 0.25, 0, 0]], 1e-5)


def test_sequence_ratio_is_the_product_over_real_tokens():
    # row 0: exp(0 - 1 + 1) = 1; row 1: exp(ln 3 - ln 4) = 0.75; padding 0
    expected = [[1, 1, 1, 0], [0.75, 0.75, 0, 0]]
    close(importance_ratios(LOGP, BEHAVIOUR, MASK, "sequence"), expected, 1e-5)
    with pytest.raises(ValueError, match="token' or 'sequence"):
        importance_ratios(LOGP, BEHAVIOUR, MASK, "group")


def test_tis_truncates_at_the_cap_and_keeps_every_real_token():
    weights, keep = run("tis", cap=2.0)
    close(weights, [[1, 1 / E, 2, 0], [2, 0.25, 0, 0]], 1e-5)
    assert torch.equal(keep, MASK.bool())
    weights, keep = run("tis", cap=0.9, level="sequence")
    close(weights, [[0.9, 0.9, 0.9, 0], [0.75, 0.75, 0, 0]], 1e-5)


def test_mis_drops_tokens_above_the_cap_from_the_mask():
    weights, keep = run("mis", cap=2.0)
    assert keep.tolist() == [[True, True, False, False], [False, True, False, False]]
    close(weights, [[1, 1 / E, 0, 0], [0, 0.25, 0, 0]], 1e-5)
    weights, keep = run("mis", cap=0.9, level="sequence")  # row 0 (ratio 1) goes whole
    assert keep.tolist() == [[False, False, False, False], [True, True, False, False]]
    close(weights, [[0, 0, 0, 0], [0.75, 0.75, 0, 0]], 1e-5)


def test_icepop_keeps_the_band_and_weights_by_the_ratio():
    weights, keep = run("icepop", low=0.5, cap=5.0)
    assert keep.tolist() == [[True, False, True, False], [True, False, False, False]]
    close(weights, [[1, 0, E, 0], [3, 0, 0, 0]], 1e-5)


def test_none_is_one_on_real_tokens():
    weights, keep = run("none")
    close(weights, MASK, 0.0)
    assert torch.equal(keep, MASK.bool())


def test_no_gradient_flows_through_the_weights():
    logp = LOGP.clone().requires_grad_(True)
    weights, _ = ROLLOUT_CORRECTIONS["tis"](logp, BEHAVIOUR, MASK)
    assert not weights.requires_grad


def test_mismatch_metrics_by_hand():
    weights, keep = run("tis", cap=2.0)
    metrics = mismatch_metrics(LOGP, BEHAVIOUR, MASK, weights, keep)
    log_ratios = [0.0, -1.0, 1.0, math.log(3), -math.log(4)]
    rhos = [math.exp(x) for x in log_ratios]
    w = [1, 1 / E, 2, 2, 0.25]
    assert metrics["mismatch/kl"] == pytest.approx(-sum(log_ratios) / 5, abs=1e-6)  # 0.0575
    k3 = sum(r - 1 - x for r, x in zip(rhos, log_ratios)) / 5
    assert metrics["mismatch/k3"] == pytest.approx(k3, abs=1e-6)  # 0.5248
    ess = sum(w) ** 2 / (5 * sum(x * x for x in w))
    assert metrics["mismatch/ess"] == pytest.approx(ess, abs=1e-6)  # 0.6863
    assert metrics["mismatch/dropped_frac"] == 0.0
    assert metrics["mismatch/capped_frac"] == pytest.approx(2 / 5)  # e and 3 capped at 2
    weights, keep = run("mis", cap=2.0)
    dropped = mismatch_metrics(LOGP, BEHAVIOUR, MASK, weights, keep)["mismatch/dropped_frac"]
    assert dropped == pytest.approx(2 / 5)
    weights, keep = run("tis", cap=0.9, level="sequence")
    seq = mismatch_metrics(LOGP, BEHAVIOUR, MASK, weights, keep, level="sequence")
    assert seq["mismatch/capped_frac"] == pytest.approx(3 / 5)  # row 0's three tokens
    assert mismatch_metrics(LOGP, BEHAVIOUR, torch.zeros_like(MASK), weights, keep) == {}


def test_an_engine_that_agrees_gives_weight_one_and_full_ess():
    weights, keep = ROLLOUT_CORRECTIONS["tis"](LOGP, LOGP.clone(), MASK)
    close(weights, MASK, 1e-7)
    metrics = mismatch_metrics(LOGP, LOGP.clone(), MASK, weights, keep)
    assert metrics["mismatch/kl"] == 0.0 and metrics["mismatch/ess"] == pytest.approx(1.0)


def test_corrected_advantages_scale_kept_tokens_and_drop_the_rest_from_the_mask():
    from rlvr.algo.rollout_correction import corrected_advantages

    # MIS at cap 2 on the module's tensors: row 0 keeps tokens 0, 1 (rho 1, 1/e), drops 2
    # (rho e > 2); row 1 drops token 0 (rho 3), keeps token 1 (rho 0.25); padding never kept
    weights, keep = run("mis", cap=2.0)
    advantages = torch.tensor([2.0, -1.0])  # one per row, broadcast over its tokens
    adv, mask = corrected_advantages(advantages, MASK, weights, keep)
    close(adv, [[2.0, 2 / E, 0, 0], [0, -0.25, 0, 0]], 1e-5)
    close(mask, [[1, 1, 0, 0], [0, 1, 0, 0]], 0)
    # per-token advantages (GAE's [N, T]) are scaled token by token
    per_token = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 6.0, 9.0]])
    adv, _ = corrected_advantages(per_token, MASK, weights, keep)
    close(adv, [[1.0, 2 / E, 0, 0], [0, 1.25, 0, 0]], 1e-5)


def test_weighted_advantage_is_the_weighted_ppo_term_and_dropped_tokens_leave_the_divisor():
    from rlvr.algo.losses import policy_loss, ratio_surrogate
    from rlvr.algo.rollout_correction import corrected_advantages

    # current policy moved from pi_old (= LOGP) by +0.3 / -0.4 per token: both clip branches
    logp = LOGP + torch.tensor([[0.3, -0.4, 0.3, 0.0], [-0.4, 0.3, 0.0, 0.0]])
    advantages = torch.tensor([1.5, -2.0])
    weights, keep = run("tis", cap=2.0)
    adv, mask = corrected_advantages(advantages, MASK, weights, keep)
    loss, _ = policy_loss(logp, LOGP, adv, mask, clip_ratio_c=3.0)
    # by hand: w_t times the plain per-token loss, summed over kept tokens, / kept tokens (5)
    plain, _, _ = ratio_surrogate(torch.exp(logp - LOGP), advantages, 0.2, 0.2, clip_ratio_c=3.0)
    expected = (plain * weights * MASK).sum() / MASK.sum()
    close(loss, expected, 1e-6)
    # MIS drops 2 of the 5 real tokens: they leave the divisor (3 kept), not only the sum
    weights, keep = run("mis", cap=2.0)
    adv, mask = corrected_advantages(advantages, MASK, weights, keep)
    loss, _ = policy_loss(logp, LOGP, adv, mask)
    plain, _, _ = ratio_surrogate(torch.exp(logp - LOGP), advantages, 0.2, 0.2)
    kept = keep.float()
    close(loss, (plain * weights * kept).sum() / 3.0, 1e-6)
    assert int(kept.sum()) == 3


@pytest.mark.parametrize("fill", [-math.inf, math.inf, math.nan])
def test_nonfinite_padding_gives_the_hand_computed_weights(fill):
    # the module's batch with `fill` on every padded position of both log-prob tensors, so
    # logp - behaviour there is -inf - -inf, inf - inf or nan: NaN, which multiplying by the
    # mask kept (0 * nan = nan) and the sequence sum spread over the row. The weights are those
    # derived by hand above for the finite padding, 0 on padding.
    logp = torch.where(MASK.bool(), LOGP, fill)
    behaviour = torch.where(MASK.bool(), BEHAVIOUR, fill)
    close(importance_ratios(logp, behaviour, MASK), [[1, 1 / E, E, 0], [3, 0.25, 0, 0]], 1e-5)
    expected_seq = [[1, 1, 1, 0], [0.75, 0.75, 0, 0]]
    close(importance_ratios(logp, behaviour, MASK, "sequence"), expected_seq, 1e-5)
    expected = {  # (mode, options) -> weights
        ("tis", (("cap", 2.0),)): [[1, 1 / E, 2, 0], [2, 0.25, 0, 0]],
        ("tis", (("cap", 0.9), ("level", "sequence"))): [[0.9, 0.9, 0.9, 0], [0.75, 0.75, 0, 0]],
        ("mis", (("cap", 2.0),)): [[1, 1 / E, 0, 0], [0, 0.25, 0, 0]],
        ("mis", (("cap", 0.9), ("level", "sequence"))): [[0, 0, 0, 0], [0.75, 0.75, 0, 0]],
        ("icepop", (("low", 0.5), ("cap", 5.0))): [[1, 0, E, 0], [3, 0, 0, 0]],
        ("none", ()): MASK.tolist(),
    }
    for (mode, options), weights_by_hand in expected.items():
        weights, keep = ROLLOUT_CORRECTIONS[mode](logp, behaviour, MASK, **dict(options))
        close(weights, weights_by_hand, 1e-5)
        assert not (keep & ~MASK.bool()).any()
    # corrected advantages with the padding of per-token advantages non-finite too: MIS at cap
    # 2 keeps (0,0), (0,1), (1,1) (the test above), A * w there, 0 elsewhere
    weights, keep = ROLLOUT_CORRECTIONS["mis"](logp, behaviour, MASK, cap=2.0)
    per_token = torch.tensor([[1.0, 2.0, 3.0, fill], [4.0, 5.0, fill, fill]])
    adv, mask = corrected_advantages(per_token, MASK, weights, keep)
    close(adv, [[1.0, 2 / E, 0, 0], [0, 1.25, 0, 0]], 1e-5)
    close(mask, [[1, 1, 0, 0], [0, 1, 0, 0]], 0)
    metrics = mismatch_metrics(logp, behaviour, MASK, weights, keep)
    assert metrics == mismatch_metrics(LOGP, BEHAVIOUR, MASK, *run("mis", cap=2.0))
