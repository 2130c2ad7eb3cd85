"""Tests of ratio levels (token / GSPO / GSPO-token), dual clip, per-token advantages and the
clipped value loss; every expected number derived by hand in a comment."""

import math

import pytest
import torch

from rlvr.algo.losses import (
    RATIO_LEVELS,
    policy_loss,
    ratio_gspo_token,
    ratio_sequence,
    ratio_surrogate,
    ratio_token,
    value_loss,
)
from rlvr.algo.reductions import AGGREGATIONS
from tests.helpers import close

GARBAGE = 1e6
LOG_HALF = math.log(0.5)


# Row 0: 3 completion tokens with log-ratios 0.3, -0.1, 0.4; row 1: 1 token with log-ratio 0.1.
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
LOG_RATIOS = torch.tensor([[0.3, -0.1, 0.4, 0.0], [0.1, 0.0, 0.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])
# token ratios: exp(0.3) = 1.3498588, exp(-0.1) = 0.9048374, exp(0.4) = 1.4918247,
#               exp(0.1) = 1.1051709
# GSPO: s_0 = exp((0.3 - 0.1 + 0.4) / 3) = exp(0.2) = 1.2214028, s_1 = exp(0.1 / 1) = 1.1051709
S0, S1 = 1.2214028, 1.1051709
WIDE = {"epsilon_low": 10.0, "epsilon_high": 10.0}  # nothing clips


def _inputs(log_ratios=LOG_RATIOS, garbage=True):
    """old_logp = log 0.5; logp = old + log-ratio; padding gets +-1e6 garbage if asked."""
    keep = MASK.bool()
    old = torch.full(log_ratios.shape, LOG_HALF)
    logp = old + log_ratios
    if garbage:
        logp = torch.where(keep, logp, GARBAGE)
        old = torch.where(keep, old, -GARBAGE)
    return logp.requires_grad_(True), old


class TestRatioLevels:
    def test_registry(self):
        assert RATIO_LEVELS == {
            "token": ratio_token,
            "sequence": ratio_sequence,
            "gspo-token": ratio_gspo_token,
        }

    def test_token_ratio(self):
        logp, old = _inputs(garbage=False)
        close(ratio_token(logp, old, MASK), LOG_RATIOS.exp())

    def test_sequence_ratio_is_exp_mean_log_ratio_by_hand(self):
        # row 0: mean of (0.3, -0.1, 0.4) = 0.6 / 3 = 0.2 -> exp 1.2214028 on every position
        # row 1: mean of (0.1) = 0.1 -> exp 1.1051709; the padding garbage never enters the mean
        logp, old = _inputs()
        ratio = ratio_sequence(logp, old, MASK)
        close(ratio, [[S0] * 4, [S1] * 4])
        # the same as the length-normalised sequence ratio (pi(y) / pi_old(y)) ** (1 / |y|):
        close(ratio[0, 0], (math.exp(0.3) * math.exp(-0.1) * math.exp(0.4)) ** (1 / 3))

    def test_gspo_token_value_equals_sequence_gradient_differs(self):
        logp_s, old = _inputs()
        logp_t, _ = _inputs()
        seq = ratio_sequence(logp_s, old, MASK)
        tok = ratio_gspo_token(logp_t, old, MASK)
        close(tok, seq)
        # d/dlogp of the row-0 token-0 ratio: sequence s_0 / |y_0| = 1.2214028 / 3 = 0.4071343 on
        # each of row 0's three tokens; gspo-token s_0 = 1.2214028 on token 0 only
        seq[0, 0].backward()
        tok[0, 0].backward()
        close(logp_s.grad, [[S0 / 3, S0 / 3, S0 / 3, 0.0], [0.0] * 4])
        close(logp_t.grad, [[S0, 0.0, 0.0, 0.0], [0.0] * 4])

    @pytest.mark.parametrize("fill", [-math.inf, math.nan])
    def test_nonfinite_padding_is_selected_away_before_the_ratio(self, fill):
        # logp and old_logp both `fill` on padding: logp - old_logp is NaN there, and exp's
        # derivative too, so selecting the ratio afterwards would still back-propagate
        # 0 * nan = nan. Selected away first: token ratios exp(0.3) = 1.3498588,
        # exp(-0.1) = 0.9048374, exp(0.4) = 1.4918247 and exp(0.1) = 1.1051709, exp(0) = 1 on
        # padding; d(sum of real ratios)/dlogp = the ratio itself on real tokens, 0 on padding.
        keep = MASK.bool()
        old = torch.where(keep, torch.full(MASK.shape, LOG_HALF), fill)
        tokens = [[1.3498588, 0.9048374, 1.4918247, 1.0], [1.1051709, 1.0, 1.0, 1.0]]
        expected = {
            "token": (tokens, [[1.3498588, 0.9048374, 1.4918247, 0.0], [1.1051709, 0.0, 0.0, 0.0]]),
            # s_i on every position; d(sum_t s_i)/dlogp_t = |y_i| * s_i / |y_i| = s_i
            "sequence": ([[S0] * 4, [S1] * 4], [[S0, S0, S0, 0.0], [S1, 0.0, 0.0, 0.0]]),
            # gspo-token: the value s_i, the gradient s_i at each real token
            "gspo-token": ([[S0] * 4, [S1] * 4], [[S0, S0, S0, 0.0], [S1, 0.0, 0.0, 0.0]]),
        }
        for level, (values, grad) in expected.items():
            logp = torch.where(keep, old + LOG_RATIOS, fill).requires_grad_(True)
            ratio = RATIO_LEVELS[level](logp, old, MASK)
            close(ratio.detach(), values)
            torch.where(keep, ratio, 0.0).sum().backward()
            close(logp.grad, grad)

    def test_empty_row_ratio_is_one(self):
        logp = torch.full((1, 3), GARBAGE)
        old = torch.full((1, 3), -GARBAGE)
        close(ratio_sequence(logp, old, torch.zeros(1, 3)), [[1.0, 1.0, 1.0]])


class TestPolicyLossRatioLevels:
    def test_values_with_clip_each_level(self):
        # epsilon 0.2 / 0.2, token-mean over 4 tokens
        # token: row 0 (A = +1): 1.35 -> clipped -1.2; 0.905 -> -0.9048374; 1.49 -> clipped -1.2;
        #   row 1 (A = -1): 1.105 -> 1.1051709; (-1.2 - 0.9048374 - 1.2 + 1.1051709) / 4
        #   = -0.5499166
        # sequence and gspo-token: row 0 s_0 = 1.221 > 1.2 with A = +1 -> -1.2 on 3 tokens;
        #   row 1 s_1 -> 1.1051709; (-3.6 + 1.1051709) / 4 = -0.6237073
        expected = {"token": -0.5499166, "sequence": -0.6237073, "gspo-token": -0.6237073}
        for level, value in expected.items():
            logp, old = _inputs()
            loss, _ = policy_loss(logp, old, ADV, MASK, ratio_level=level)
            close(loss.detach(), value)
            loss.backward()
            assert torch.isfinite(logp.grad).all()
        # clip_frac: token level clips (0,0) and (0,2): 2/4; sequence levels clip all of row 0:
        # 3/4. ratio_mean: token (1.3498588 + 0.9048374 + 1.4918247 + 1.1051709) / 4 = 1.2129230;
        # sequence (3 * 1.2214028 + 1.1051709) / 4 = 1.1923448
        _, m_tok = policy_loss(*_inputs(), ADV, MASK)
        _, m_seq = policy_loss(*_inputs(), ADV, MASK, ratio_level="sequence")
        assert m_tok["policy/clip_frac"] == pytest.approx(0.5)
        assert m_seq["policy/clip_frac"] == pytest.approx(0.75)
        assert m_tok["policy/ratio_mean"] == pytest.approx(1.2129230, abs=1e-6)
        assert m_seq["policy/ratio_mean"] == pytest.approx(1.1923448, abs=1e-6)

    def test_gspo_small_clip_range(self):
        # GSPO's 3e-4 / 4e-4: row 0 s_0 = 1.221 > 1.0004 with A = +1 -> clipped, -1.0004 per
        # token, gradient 0; row 1 A = -1 clips only below 0.9997, s_1 = 1.105 -> loss 1.1051709
        # seq-mean-token-mean: (-1.0004 + 1.1051709) / 2 = 0.0523855
        logp, old = _inputs()
        loss, _ = policy_loss(
            logp,
            old,
            ADV,
            MASK,
            ratio_level="sequence",
            epsilon_low=3e-4,
            epsilon_high=4e-4,
            aggregation="seq-mean-token-mean",
        )
        close(loss.detach(), 0.0523855)
        loss.backward()
        # row 1: d(-A s_1)/dlogp = s_1 = 1.1051709 (|y| = 1), / 2 seqs = 0.5525855
        close(logp.grad, [[0.0, 0.0, 0.0, 0.0], [0.5525855, 0.0, 0.0, 0.0]])

    def test_per_sequence_advantage_sequence_equals_gspo_token(self):
        # With A_it = A_i and no clipping the two levels give the same loss and gradient under
        # every aggregation (GSPO paper, section on GSPO-token).
        for aggregation in AGGREGATIONS:
            kwargs = dict(aggregation=aggregation, max_len=4, **WIDE)
            logp_s, old = _inputs()
            logp_t, _ = _inputs()
            loss_s, _ = policy_loss(logp_s, old, ADV, MASK, ratio_level="sequence", **kwargs)
            loss_t, _ = policy_loss(logp_t, old, ADV, MASK, ratio_level="gspo-token", **kwargs)
            loss_s.backward()
            loss_t.backward()
            close(loss_t.detach(), loss_s.detach())
            close(logp_t.grad, logp_s.grad)

    def test_per_token_advantages_levels_differ(self):
        # Row 0 advantages (1, 2, 3), row 1 (-1); padding advantage is garbage and ignored.
        adv = torch.tensor([[1.0, 2.0, 3.0, GARBAGE], [-1.0, GARBAGE, GARBAGE, GARBAGE]])
        # Unclipped, token-mean over 4 tokens; loss = -sum(A * ratio) / 4:
        # token: -(1.3498588 + 2 * 0.9048374 + 3 * 1.4918247 - 1.1051709) / 4 = -1.6324592
        #   grad -A_t r_t / 4: -0.3374647, -0.4524187, -1.1188685; row 1 1.1051709 / 4 = 0.2762927
        # sequence: -(6 * 1.2214028 - 1.1051709) / 4 = -1.5558114
        #   grad of -sum_t A_t s_0 w.r.t. each row-0 token: -(1 + 2 + 3) * s_0 / 3 / 4 = -0.6107014
        # gspo-token: same value -1.5558114; grad -A_t s_0 / 4 = -0.3053507, -0.6107014,
        #   -0.9160521
        expected = {
            "token": (-1.6324592, [-0.3374647, -0.4524187, -1.1188685]),
            "sequence": (-1.5558114, [-0.6107014] * 3),
            "gspo-token": (-1.5558114, [-0.3053507, -0.6107014, -0.9160521]),
        }
        grads = {}
        for level, (value, row0) in expected.items():
            logp, old = _inputs()
            loss, _ = policy_loss(logp, old, adv, MASK, ratio_level=level, **WIDE)
            loss.backward()
            close(loss.detach(), value)
            close(logp.grad, [row0 + [0.0], [0.2762927, 0.0, 0.0, 0.0]])
            grads[level] = logp.grad
        assert not torch.allclose(grads["token"], grads["sequence"])
        assert not torch.allclose(grads["sequence"], grads["gspo-token"])

    def test_per_sequence_advantages_equal_constant_per_token(self):
        adv_tok = torch.tensor([[1.0, 1.0, 1.0, GARBAGE], [-1.0, -GARBAGE, 0.0, 7.0]])
        for level in RATIO_LEVELS:
            logp_a, old = _inputs()
            logp_b, _ = _inputs()
            loss_a, m_a = policy_loss(logp_a, old, ADV, MASK, ratio_level=level)
            loss_b, m_b = policy_loss(logp_b, old, adv_tok, MASK, ratio_level=level)
            loss_a.backward()
            loss_b.backward()
            close(loss_b.detach(), loss_a.detach())
            close(logp_b.grad, logp_a.grad)
            assert m_a == pytest.approx(m_b)

    @pytest.mark.parametrize("level", list(RATIO_LEVELS))
    def test_token_mean_microbatch_invariance(self, level):
        # 4 rows of lengths 3, 1, 2, 4 (10 tokens) split 2 + 2 and 1 + 3; with num_tokens = 10
        # the micro-batch losses add up to the full-batch loss, gradient included.
        gen = torch.Generator().manual_seed(0)
        mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
        old = -torch.rand(4, 4, generator=gen) - 0.5
        base = old + 0.3 * torch.randn(4, 4, generator=gen)
        adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
        adv_tok = torch.randn(4, 4, generator=gen)
        kwargs = dict(ratio_level=level, epsilon_low=0.1, epsilon_high=0.15, clip_ratio_c=3.0)
        for advantages in (adv, adv_tok):
            full_in = base.clone().requires_grad_(True)
            full, _ = policy_loss(full_in, old, advantages, mask, **kwargs)
            full.backward()
            for split in (2, 1):
                parts_in = base.clone().requires_grad_(True)
                total = 0.0
                for rows in (slice(0, split), slice(split, 4)):
                    part, _ = policy_loss(
                        parts_in[rows],
                        old[rows],
                        advantages[rows],
                        mask[rows],
                        num_tokens=10,
                        **kwargs,
                    )
                    total = total + part
                total.backward()
                close(total.detach(), full.detach())
                close(parts_in.grad, full_in.grad)

    @pytest.mark.parametrize("level", list(RATIO_LEVELS))
    def test_padding_garbage_does_not_matter(self, level):
        logp_clean, old_clean = _inputs(garbage=False)
        logp_dirty, old_dirty = _inputs(garbage=True)
        loss_c, m_c = policy_loss(logp_clean, old_clean, ADV, MASK, ratio_level=level)
        loss_d, m_d = policy_loss(logp_dirty, old_dirty, ADV, MASK, ratio_level=level)
        loss_c.backward()
        loss_d.backward()
        close(loss_d.detach(), loss_c.detach())
        close(logp_dirty.grad, logp_clean.grad)
        assert m_d == pytest.approx(m_c)


class TestDualClip:
    def test_caps_negative_advantage_for_huge_ratio(self):
        # ratios 10, 2, 10 (log-ratios ln 10, ln 2, ln 10); A = -1, -1, +1; c = 3, eps 0.2
        # token 0, A = -1, r = 10: PPO max(10, 1.2) = 10, dual min(10, 3) = 3, gradient 0
        # token 1, A = -1, r = 2: PPO max(2, 1.2) = 2 < 3 -> 2, gradient -A r = 2
        # token 2, A = +1, r = 10: ordinary clip -1.2, gradient 0 (dual clip only for A < 0)
        log_r = torch.tensor([[math.log(10.0), math.log(2.0), math.log(10.0)]])
        adv = torch.tensor([[-1.0, -1.0, 1.0]])
        logp = log_r.clone().requires_grad_(True)
        loss, clipped, dual = ratio_surrogate(logp.exp(), adv, 0.2, 0.2, clip_ratio_c=3.0)
        close(loss.detach(), [[3.0, 2.0, -1.2]])
        assert torch.equal(dual, torch.tensor([[True, False, False]]))
        assert torch.equal(clipped, torch.tensor([[False, False, True]]))
        loss.sum().backward()
        # d(-A r)/dlogp = -A r: token 1 -> 2.0; tokens 0 and 2 are constant
        close(logp.grad, [[0.0, 2.0, 0.0]])
        # without the dual clip token 0's loss is 10 and grows with the ratio; nothing dual-clipped
        loss_plain, _, dual_plain = ratio_surrogate(log_r.exp(), adv, 0.2, 0.2)
        close(loss_plain, [[10.0, 2.0, -1.2]])
        assert not dual_plain.any()

    def test_cap_scales_with_advantage_and_policy_loss_metric(self):
        # row 0: 2 tokens, ratio 1e3 (log-ratio ln 1000) on both, A = -2: each capped at
        # -A * c = 2 * 3 = 6; row 1: 1 token, ratio 1, A = +1: loss -1.
        # token-mean: (6 + 6 - 1) / 3 = 3.6666667; dual_clip_frac 2/3
        mask = torch.tensor([[1, 1], [1, 0]])
        old = torch.zeros(2, 2)
        logp = torch.tensor([[math.log(1000.0)] * 2, [0.0, GARBAGE]], requires_grad=True)
        adv = torch.tensor([-2.0, 1.0])
        loss, metrics = policy_loss(logp, old, adv, mask, clip_ratio_c=3.0)
        close(loss.detach(), 11 / 3)
        assert metrics["policy/dual_clip_frac"] == pytest.approx(2 / 3)
        loss.backward()
        # capped tokens: 0; row 1 token: d(-A r)/dlogp = -1 * 1 / 3 tokens = -0.3333333
        close(logp.grad, [[0.0, 0.0], [-1 / 3, 0.0]])
        # the default (no dual clip) leaves the loss at (2000 + 2000 - 1) / 3 and adds no metric
        loss_plain, m_plain = policy_loss(logp, old, adv, mask)
        close(loss_plain.detach(), 3999 / 3, atol=1e-3)
        assert "policy/dual_clip_frac" not in m_plain

    @pytest.mark.parametrize("level", list(RATIO_LEVELS))
    def test_all_levels_cap(self, level):
        # one row of 2 tokens with log-ratio ln 10 each: token and sequence ratios are all 10;
        # A = -1, c = 3 -> loss 3 on both tokens, token-mean 3, gradient 0
        logp = torch.full((1, 2), math.log(10.0), requires_grad=True)
        loss, _ = policy_loss(
            logp,
            torch.zeros(1, 2),
            torch.tensor([-1.0]),
            torch.ones(1, 2),
            clip_ratio_c=3.0,
            ratio_level=level,
        )
        close(loss.detach(), 3.0, atol=1e-5)
        loss.backward()
        close(logp.grad, [[0.0, 0.0]])

    def test_bad_values_raise(self):
        logp = torch.zeros(2, 4)
        with pytest.raises(ValueError, match="clip_ratio_c"):
            policy_loss(logp, logp, ADV, MASK, clip_ratio_c=1.0)
        with pytest.raises(ValueError, match="ratio_level"):
            policy_loss(logp, logp, ADV, MASK, ratio_level="sentence")
        with pytest.raises(ValueError):
            policy_loss(logp, logp, torch.zeros(2, 3), MASK)


# Value loss batch: row 0 three tokens, row 1 one token, clip 0.2.
V_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
VALUES = torch.tensor([[1.0, 2.0, 0.5, GARBAGE], [3.0, GARBAGE, GARBAGE, GARBAGE]])
OLD_VALUES = torch.tensor([[0.5, 2.1, 0.5, -GARBAGE], [1.0, 0.0, 0.0, 0.0]])
RETURNS = torch.tensor([[1.5, 1.0, 0.0, GARBAGE], [2.0, GARBAGE, 0.0, 0.0]])
# per token, V_clip = V_old + clip(V - V_old, -0.2, 0.2), loss 0.5 * max((V-R)^2, (V_clip-R)^2):
# (0,0): (1 - 1.5)^2 = 0.25; V_clip = 0.5 + 0.2 = 0.7, (0.7 - 1.5)^2 = 0.64 -> 0.32 (clipped)
# (0,1): (2 - 1)^2 = 1; V_clip = 2.1 - 0.1 = 2.0 (inside the range) -> 1 -> 0.5
# (0,2): (0.5 - 0)^2 = 0.25; V_clip = 0.5 -> 0.125
# (1,0): (3 - 2)^2 = 1; V_clip = 1 + 0.2 = 1.2, (1.2 - 2)^2 = 0.64 < 1 -> 0.5 (not clipped)


class TestValueLoss:
    def test_clipped_hand_values_and_gradient(self):
        values = VALUES.clone().requires_grad_(True)
        loss, metrics = value_loss(values, OLD_VALUES, RETURNS, V_MASK, 0.2)
        # token-mean: (0.32 + 0.5 + 0.125 + 0.5) / 4 = 1.445 / 4 = 0.36125
        close(loss.detach(), 0.36125)
        loss.backward()
        # d 0.5 (V - R)^2 / dV = V - R, / 4: (0,1) 1/4, (0,2) 0.5/4, (1,0) 1/4; (0,0) clipped -> 0
        close(values.grad, [[0.0, 0.25, 0.125, 0.0], [0.25, 0.0, 0.0, 0.0]])
        # clip_frac 1/4; mse (0.25 + 1 + 0.25 + 1) / 4 = 0.625
        assert metrics == pytest.approx({"value/clip_frac": 0.25, "value/mse": 0.625})

    def test_unclipped(self):
        values = VALUES.clone().requires_grad_(True)
        loss, metrics = value_loss(values, OLD_VALUES, RETURNS, V_MASK)
        # 0.5 * (0.25 + 1 + 0.25 + 1) / 4 = 0.3125; gradient (V - R) / 4, (0,0): -0.5 / 4
        close(loss.detach(), 0.3125)
        loss.backward()
        close(values.grad, [[-0.125, 0.25, 0.125, 0.0], [0.25, 0.0, 0.0, 0.0]])
        assert metrics["value/clip_frac"] == 0.0

    def test_aggregation_divisors(self):
        # seq-mean-token-mean: row means (0.32 + 0.5 + 0.125) / 3 = 0.315 and 0.5, / 2 = 0.4075
        loss, _ = value_loss(
            VALUES, OLD_VALUES, RETURNS, V_MASK, 0.2, aggregation="seq-mean-token-mean"
        )
        close(loss, 0.4075)
        # token-mean with the step's 8 tokens: 1.445 / 8 = 0.180625
        loss, _ = value_loss(VALUES, OLD_VALUES, RETURNS, V_MASK, 0.2, num_tokens=8)
        close(loss, 0.180625)
        # seq-mean-token-sum-norm, max_len 4: (0.945 / 4 + 0.5 / 4) / 2 = 0.180625
        loss, _ = value_loss(
            VALUES,
            OLD_VALUES,
            RETURNS,
            V_MASK,
            0.2,
            aggregation="seq-mean-token-sum-norm",
            max_len=4,
        )
        close(loss, 0.180625)

    def test_bad_inputs(self):
        with pytest.raises(ValueError, match="clip_range_value"):
            value_loss(VALUES, OLD_VALUES, RETURNS, V_MASK, 0.0)
        with pytest.raises(ValueError, match="aggregation"):
            value_loss(VALUES, OLD_VALUES, RETURNS, V_MASK, aggregation="sum")
        with pytest.raises(ValueError):
            value_loss(VALUES, OLD_VALUES[:, :3], RETURNS, V_MASK)
