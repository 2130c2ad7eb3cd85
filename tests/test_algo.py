"""Tests of rlvr.algo: every expected tensor is written out by hand, with its derivation."""

import math

import pytest
import torch

from rlvr.algo import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    advantages_dr_grpo,
    advantages_grpo,
    advantages_rloo,
    aggregate_seq_mean_token_mean,
    aggregate_seq_mean_token_sum_norm,
    aggregate_token_mean,
    kl_k1,
    kl_k2,
    kl_k3,
    masked_mean,
    masked_sum,
    policy_loss,
    ratio_surrogate,
    zero_std_group_fraction,
)
from tests.helpers import close

GARBAGE = 1e6  # written into padded positions; must never show up in a result or a gradient

# Shared padded batch: row 0 has 3 completion tokens, row 1 has 1.
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, GARBAGE], [4.0, GARBAGE, GARBAGE, GARBAGE]])

LOG_HALF = math.log(0.5)
LOG_QUARTER = math.log(0.25)
LN2 = math.log(2.0)  # 0.693147


# ----------------------------------------------------------------------------- reductions


class TestMaskedReductions:
    def test_masked_sum(self):
        # all: 1 + 2 + 3 + 4 = 10; rows: 1 + 2 + 3 = 6 and 4; columns: 1+4, 2, 3, 0
        close(masked_sum(PER_TOKEN, MASK), 10.0)
        close(masked_sum(PER_TOKEN, MASK, dim=1), [6.0, 4.0])
        close(masked_sum(PER_TOKEN, MASK, dim=0), [5.0, 2.0, 3.0, 0.0])

    def test_masked_mean(self):
        # all: 10 / 4 tokens = 2.5; rows: 6 / 3 = 2 and 4 / 1 = 4
        close(masked_mean(PER_TOKEN, MASK), 2.5)
        close(masked_mean(PER_TOKEN, MASK, dim=1), [2.0, 4.0])

    def test_masked_mean_empty_row_is_zero_not_nan(self):
        values = torch.tensor([[1.0, 2.0], [GARBAGE, GARBAGE]])
        mask = torch.tensor([[1, 1], [0, 0]])
        # row 0: 3 / 2 = 1.5; row 1: no token -> 0 (count clamped to 1, masked sum 0)
        close(masked_mean(values, mask, dim=1), [1.5, 0.0])
        close(masked_mean(values, torch.zeros_like(mask)), 0.0)

    def test_bool_and_float_masks_agree(self):
        for mask in (MASK.bool(), MASK.float()):
            close(masked_mean(PER_TOKEN, mask), 2.5)

    def test_nonfinite_padding_does_not_leak(self):
        values = PER_TOKEN.clone()
        values[0, 3] = float("inf")
        values[1, 1] = float("nan")
        values.requires_grad_(True)
        out = masked_mean(values, MASK)
        out.backward()
        close(out.detach(), 2.5)
        # d(sum/4)/dv = 1/4 on the 4 tokens, 0 on padding (and no nan)
        close(values.grad, [[0.25, 0.25, 0.25, 0.0], [0.25, 0.0, 0.0, 0.0]])

    def test_shape_mismatch_raises(self):
        with pytest.raises(ValueError):
            masked_sum(PER_TOKEN, MASK[:, :3])


class TestAggregations:
    def test_token_mean(self):
        # (1 + 2 + 3 + 4) / 4 masked tokens = 2.5
        close(aggregate_token_mean(PER_TOKEN, MASK), 2.5)
        # explicit divisor: 10 / 8 = 1.25
        close(aggregate_token_mean(PER_TOKEN, MASK, num_tokens=8), 1.25)

    def test_seq_mean_token_mean(self):
        # row means 6/3 = 2 and 4/1 = 4; (2 + 4) / B=2 = 3.0
        close(aggregate_seq_mean_token_mean(PER_TOKEN, MASK), 3.0)
        # (2 + 4) / num_seqs=4 = 1.5
        close(aggregate_seq_mean_token_mean(PER_TOKEN, MASK, num_seqs=4), 1.5)

    def test_seq_mean_token_sum_norm(self):
        # row sums 6 and 4, each / max_len=4 -> 1.5 and 1.0; (1.5 + 1.0) / B=2 = 1.25
        close(aggregate_seq_mean_token_sum_norm(PER_TOKEN, MASK, max_len=4), 1.25)
        # max_len=10: 0.6 and 0.4; (0.6 + 0.4) / num_seqs=4 = 0.25
        close(aggregate_seq_mean_token_sum_norm(PER_TOKEN, MASK, max_len=10, num_seqs=4), 0.25)

    def test_registry_uniform_call_and_modes_differ(self):
        # Same batch through the registry with the same keywords: 2.5, 3.0 and 1.25 (see above).
        expected = {"token-mean": 2.5, "seq-mean-token-mean": 3.0, "seq-mean-token-sum-norm": 1.25}
        assert set(AGGREGATIONS) == set(expected)
        results = {}
        for name, fn in AGGREGATIONS.items():
            results[name] = fn(PER_TOKEN, MASK, num_tokens=None, num_seqs=None, max_len=4).item()
            close(results[name], expected[name])
        assert len({round(v, 6) for v in results.values()}) == 3

    def test_sum_norm_requires_max_len(self):
        with pytest.raises(ValueError, match="max_len"):
            AGGREGATIONS["seq-mean-token-sum-norm"](PER_TOKEN, MASK)

    @pytest.mark.parametrize(
        "name,kwargs",
        [
            ("token-mean", {"num_tokens": 0}),
            ("seq-mean-token-mean", {"num_seqs": -1}),
            ("seq-mean-token-sum-norm", {"max_len": 0}),
        ],
    )
    def test_nonpositive_divisor_raises(self, name, kwargs):
        with pytest.raises(ValueError, match="must be > 0"):
            AGGREGATIONS[name](PER_TOKEN, MASK, **kwargs)

    @pytest.mark.parametrize("name", list(AGGREGATIONS))
    def test_padding_values_do_not_matter(self, name):
        # Same completion tokens, padding 0 vs 1e6: identical loss and gradient.
        clean = torch.where(MASK.bool(), PER_TOKEN, 0.0).requires_grad_(True)
        dirty = PER_TOKEN.clone().requires_grad_(True)
        loss_clean = AGGREGATIONS[name](clean, MASK, max_len=4)
        loss_dirty = AGGREGATIONS[name](dirty, MASK, max_len=4)
        loss_clean.backward()
        loss_dirty.backward()
        close(loss_dirty.detach(), loss_clean.detach())
        close(dirty.grad, clean.grad)
        assert (dirty.grad[~MASK.bool()] == 0).all()

    def test_token_mean_gradient_accumulation_invariance(self):
        # Optimizer step of 4 rows split into two micro-batches of 2.
        per_token = torch.tensor(
            [
                [1.0, 2.0, 3.0, GARBAGE],  # 3 tokens, sum 6
                [4.0, GARBAGE, GARBAGE, GARBAGE],  # 1 token, sum 4
                [5.0, 6.0, GARBAGE, GARBAGE],  # 2 tokens, sum 11
                [7.0, 8.0, 9.0, 10.0],  # 4 tokens, sum 34
            ]
        )
        mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
        total_tokens = 10  # 3 + 1 + 2 + 4

        full_in = per_token.clone().requires_grad_(True)
        full = aggregate_token_mean(full_in, mask)
        full.backward()
        # (6 + 4 + 11 + 34) / 10 = 5.5; gradient 1/10 on every token
        close(full.detach(), 5.5)
        close(full_in.grad, mask.float() / 10)

        acc_in = per_token.clone().requires_grad_(True)
        first = aggregate_token_mean(acc_in[:2], mask[:2], num_tokens=total_tokens)
        second = aggregate_token_mean(acc_in[2:], mask[2:], num_tokens=total_tokens)
        (first + second).backward()
        # (6 + 4) / 10 = 1.0 and (11 + 34) / 10 = 4.5; 1.0 + 4.5 = 5.5
        close(first.detach(), 1.0)
        close(second.detach(), 4.5)
        close((first + second).detach(), full.detach())
        close(acc_in.grad, full_in.grad)

        # Without the step-wide count each half is averaged over its own tokens (the bias DAPO
        # fixes): 10 / 4 = 2.5 and 45 / 6 = 7.5; sum 10.0, mean over micro-batches 5.0, not 5.5.
        naive = aggregate_token_mean(per_token[:2], mask[:2]) + aggregate_token_mean(
            per_token[2:], mask[2:]
        )
        close(naive, 10.0)

    def test_seq_mean_gradient_accumulation_with_num_seqs(self):
        # seq-mean-token-mean over the same 2 rows, split 1 + 1, num_seqs=2:
        # row means 2 and 4 -> halves 2/2 = 1.0 and 4/2 = 2.0, sum 3.0 = full value
        halves = [
            aggregate_seq_mean_token_mean(PER_TOKEN[i : i + 1], MASK[i : i + 1], num_seqs=2)
            for i in range(2)
        ]
        close(halves[0], 1.0)
        close(halves[1], 2.0)
        close(halves[0] + halves[1], aggregate_seq_mean_token_mean(PER_TOKEN, MASK))


# ----------------------------------------------------------------------------- advantages


class TestGrpoAdvantages:
    def test_two_groups(self):
        rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
        group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        # group 0: mean 0.5, deviations +-0.5, sum of squares 4 * 0.25 = 1,
        #   unbiased var 1 / (4 - 1) = 1/3, std sqrt(1/3) = 0.5773503,
        #   A = +-0.5 / (0.5773503 + 1e-4) = +-0.8658754
        # group 1: all rewards equal -> 0
        a = 0.8658754
        expected = [a, -a, -a, a, 0.0, 0.0, 0.0, 0.0]
        close(advantages_grpo(rewards, group_ids), expected)
        close(advantages_grpo(rewards, group_ids, eps=1e-4), expected)

    def test_non_contiguous_ids_unequal_sizes(self):
        rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 2.0, 5.0])
        group_ids = torch.tensor([7, 3, 7, 3, 7, 42])
        # group 7 = {1, 0, 2} at positions 0, 2, 4: mean 1, deviations 0, -1, +1,
        #   var (0 + 1 + 1) / 2 = 1, std 1, A = 0, -1/(1 + 1e-4), +1/(1 + 1e-4) = 0, -0.9999, 0.9999
        # group 3 = {2, 4} at positions 1, 3: mean 3, deviations -1, +1,
        #   var (1 + 1) / 1 = 2, std 1.4142136, A = -+1 / (1.4142136 + 1e-4) = -+0.7070568
        # group 42 = {5}: size 1 -> 0
        expected = [0.0, -0.7070568, -0.9999000, 0.7070568, 0.9999000, 0.0]
        close(advantages_grpo(rewards, group_ids), expected)

    def test_unscaled_dr_grpo(self):
        rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
        group_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        # r - group mean: group 0 mean 0.5 -> +-0.5; group 1 mean 1 -> 0
        expected = [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
        close(advantages_dr_grpo(rewards, group_ids), expected)

    def test_zero_variance_is_exactly_zero_even_with_eps_zero(self):
        # 0.1 * 3 / 3 != 0.1 in floating point; a constant group must still give exactly 0,
        # and eps=0 must not give 0/0 = nan.
        rewards = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.7], dtype=torch.float64)
        group_ids = torch.tensor([5, 5, 5, 9, 9])
        # group 9: mean 0.5, deviations -+0.2, var 0.08 / 1, std 0.2828427, A = -+0.7071068
        out = advantages_grpo(rewards, group_ids, eps=0.0)
        assert (out[:3] == 0).all()
        close(out[3:], [-0.7071068, 0.7071068])

    def test_integer_rewards(self):
        # int rewards {1, 0} in one group: mean 0.5, var 0.5 / 1, std 0.7071068, unscaled +-0.5
        out = advantages_dr_grpo(torch.tensor([1, 0]), torch.tensor([2, 2]))
        assert out.dtype.is_floating_point
        close(out, [0.5, -0.5])

    def test_matches_per_group_loop(self):
        gen = torch.Generator().manual_seed(0)
        rewards = torch.rand(40, generator=gen, dtype=torch.float64)
        group_ids = torch.randint(0, 9, (40,), generator=gen) * 11  # sparse ids
        out = advantages_grpo(rewards, group_ids)
        for g in group_ids.unique():
            sel = group_ids == g
            r = rewards[sel]
            ref = (r - r.mean()) / (r.std() + 1e-4) if r.numel() > 1 else torch.zeros_like(r)
            torch.testing.assert_close(out[sel], ref)

    def test_bad_inputs_raise(self):
        with pytest.raises(ValueError):
            advantages_grpo(torch.zeros(4), torch.zeros(3, dtype=torch.long))
        with pytest.raises(ValueError):
            advantages_grpo(torch.zeros(4), torch.zeros(4))  # float ids
        with pytest.raises(ValueError):
            advantages_grpo(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))


class TestRloo:
    def test_hand_values(self):
        rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.0, 5.0, 3.0, 3.0])
        group_ids = torch.tensor([0, 1, 0, 1, 0, 2, 3, 3])
        # group 0 = {1, 0, 0}: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice)
        # group 1 = {2, 4}: 2 - 4 = -2; 4 - 2 = 2
        # group 2 = {5}: size 1 -> 0
        # group 3 = {3, 3}: 3 - 3 = 0
        expected = [1.0, -2.0, -0.5, 2.0, -0.5, 0.0, 0.0, 0.0]
        close(advantages_rloo(rewards, group_ids), expected)

    def test_is_rescaled_grpo_unscaled(self):
        # RLOO = N_g / (N_g - 1) * (r - mean_g): group 0 above, 3/2 * (1 - 1/3) = 1
        rewards = torch.tensor([1.0, 0.0, 0.0])
        ids = torch.tensor([4, 4, 4])
        close(advantages_rloo(rewards, ids), 1.5 * advantages_dr_grpo(rewards, ids))


class TestZeroStdFraction:
    def test_fraction(self):
        # groups {1,0,0,1} (varies) and {1,1,1,1} (constant): 1 of 2 groups
        rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
        assert zero_std_group_fraction(rewards, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])) == 0.5
        # ids 7 {1,0,2} varies, 3 {2,4} varies, 42 {5} size 1 counts as constant: 1 of 3 groups
        rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 2.0, 5.0])
        frac = zero_std_group_fraction(rewards, torch.tensor([7, 3, 7, 3, 7, 42]))
        assert isinstance(frac, float)
        assert frac == pytest.approx(1 / 3)

    def test_empty(self):
        assert zero_std_group_fraction(torch.zeros(0), torch.zeros(0, dtype=torch.long)) == 0.0


# ----------------------------------------------------------------------------- KL


class TestKl:
    # Row 0: logp = log 0.5, ref = log 0.25 -> log_r = ref - logp = -ln 2, r = 0.5
    # Row 1: logp = log 0.25, ref = log 0.5 -> log_r = +ln 2, r = 2
    # Column 1: equal log-probs -> log_r = 0
    LOGP = torch.tensor([[LOG_HALF, -1.0], [LOG_QUARTER, -3.0]])
    REF = torch.tensor([[LOG_QUARTER, -1.0], [LOG_HALF, -3.0]])

    def test_k1(self):
        # -log_r: ln 2 = 0.6931472 and -ln 2
        close(kl_k1(self.LOGP, self.REF), [[LN2, 0.0], [-LN2, 0.0]])

    def test_k2(self):
        # 0.5 * (ln 2)^2 = 0.5 * 0.4804530 = 0.2402265 for both rows
        close(kl_k2(self.LOGP, self.REF), [[0.2402265, 0.0], [0.2402265, 0.0]])

    def test_k3(self):
        # row 0: r - 1 - log r = 0.5 - 1 + 0.6931472 = 0.1931472
        # row 1: 2 - 1 - 0.6931472 = 0.3068528
        # equal log-probs: 1 - 1 - 0 = 0 exactly
        out = kl_k3(self.LOGP, self.REF)
        close(out, [[0.1931472, 0.0], [0.3068528, 0.0]])
        assert (out[:, 1] == 0).all()

    def test_k3_nonnegative(self):
        gen = torch.Generator().manual_seed(0)
        logp = torch.randn(64, 32, generator=gen) * 3
        ref = torch.randn(64, 32, generator=gen) * 3
        assert (kl_k3(logp, ref) >= 0).all()
        assert (kl_k2(logp, ref) >= 0).all()

    def test_registry(self):
        assert KL_ESTIMATORS == {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


# ----------------------------------------------------------------------------- losses

# Ratios for the clip tests: row 0 has A = +1, row 1 has A = -1.
RATIOS = torch.tensor([[1.5, 0.5, 1.0, 1.1], [0.5, 1.5, 1.0, 0.9]])
ADV = torch.tensor([1.0, -1.0])


def _logps(ratios: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """old_logp = log 0.5 everywhere, logp = old + log ratio (so exp(logp - old) = ratio)."""
    old = torch.full_like(ratios, LOG_HALF)
    return (old + ratios.log()).requires_grad_(True), old


class TestRatioSurrogate:
    def test_values_clip_mask_and_gradient(self):
        logp, old = _logps(RATIOS)
        loss, is_clipped, _ = ratio_surrogate(torch.exp(logp - old), ADV, 0.2, 0.2)
        # loss = -min(ratio * A, clip(ratio, 0.8, 1.2) * A)
        # row 0, A = +1: 1.5 -> -min(1.5, 1.2) = -1.2 (clipped); 0.5 -> -min(0.5, 0.8) = -0.5;
        #   1.0 -> -1.0; 1.1 -> -1.1
        # row 1, A = -1: 0.5 -> -min(-0.5, -0.8) = 0.8 (clipped); 1.5 -> -min(-1.5, -1.2) = 1.5;
        #   1.0 -> 1.0; 0.9 -> 0.9
        close(loss.detach(), [[-1.2, -0.5, -1.0, -1.1], [0.8, 1.5, 1.0, 0.9]])
        expected_clip = torch.tensor([[True, False, False, False], [True, False, False, False]])
        assert torch.equal(is_clipped, expected_clip)
        loss.sum().backward()
        # unclipped: d(-ratio * A)/dlogp = -A * ratio; clipped: 0
        # row 0: 0, -0.5, -1.0, -1.1; row 1: 0, 1.5, 1.0, 0.9
        close(logp.grad, [[0.0, -0.5, -1.0, -1.1], [0.0, 1.5, 1.0, 0.9]])

    def test_asymmetric_clip_higher(self):
        # ratio 1.25 with A = +1 and ratio 0.75 with A = -1
        logp, old = _logps(torch.tensor([[1.25], [0.75]]))
        # eps_high 0.2: 1.25 > 1.2 -> clipped, loss -1.2, grad 0
        # eps_low 0.2: 0.75 < 0.8 -> clipped, loss -(0.8 * -1) = 0.8, grad 0
        loss, clipped, _ = ratio_surrogate(torch.exp(logp - old), ADV, 0.2, 0.2)
        close(loss.detach(), [[-1.2], [0.8]])
        assert clipped.all()
        # eps_high 0.28 (DAPO clip-higher): 1.25 < 1.28 -> not clipped, loss -1.25, grad -1.25;
        # the low side still clips at 0.8
        logp.grad = None
        loss, clipped, _ = ratio_surrogate(torch.exp(logp - old), ADV, 0.2, 0.28)
        close(loss.detach(), [[-1.25], [0.8]])
        assert torch.equal(clipped, torch.tensor([[False], [True]]))
        loss.sum().backward()
        close(logp.grad, [[-1.25], [0.0]])

    def test_zero_advantage_not_clipped(self):
        logp, old = _logps(torch.tensor([[3.0, 0.1]]))
        loss, clipped, _ = ratio_surrogate(torch.exp(logp - old), torch.tensor([0.0]), 0.2, 0.2)
        close(loss.detach(), [[0.0, 0.0]])
        assert not clipped.any()


class TestPolicyLoss:
    MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])

    def test_clip_metrics_and_gradient(self):
        logp, old = _logps(RATIOS)
        loss, metrics = policy_loss(logp, old, ADV, self.MASK)
        # masked per-token losses (see TestRatioSurrogate): row 0 -1.2, -0.5, -1.0; row 1 0.8
        # token-mean: (-1.2 - 0.5 - 1.0 + 0.8) / 4 = -1.9 / 4 = -0.475
        close(loss.detach(), -0.475)
        loss.backward()
        # per-token gradient / 4: row 0 (0, -0.5, -1.0) / 4; row 1 token 0 clipped -> 0
        close(logp.grad, [[0.0, -0.125, -0.25, 0.0], [0.0, 0.0, 0.0, 0.0]])
        # clipped tokens: (0,0) and (1,0) -> 2 / 4
        assert metrics["policy/clip_frac"] == pytest.approx(0.5)
        # ratios 1.5, 0.5, 1.0, 0.5 -> 3.5 / 4 = 0.875
        assert metrics["policy/ratio_mean"] == pytest.approx(0.875)
        # k3(old, new) = r - 1 - log r: 1.5 -> 0.0945349; 0.5 -> 0.1931472 (x2); 1.0 -> 0
        # (0.0945349 + 2 * 0.1931472) / 4 = 0.1202073
        assert metrics["policy/approx_kl"] == pytest.approx(0.1202073, abs=1e-6)
        assert "policy/kl_ref" not in metrics
        assert all(isinstance(v, float) for v in metrics.values())

    def test_aggregation_modes(self):
        # ratio 1 everywhere, so per-token loss = -A: row 0 -1 (3 tokens), row 1 +1 (1 token)
        logp = torch.full((2, 4), LOG_HALF)
        cases = {
            "token-mean": -0.5,  # (-3 + 1) / 4 tokens
            "seq-mean-token-mean": 0.0,  # (-1 + 1) / 2 seqs
            "seq-mean-token-sum-norm": -0.25,  # (-3/4 + 1/4) / 2 seqs, max_len 4
        }
        for name, expected in cases.items():
            loss, _ = policy_loss(logp, logp, ADV, self.MASK, aggregation=name, max_len=4)
            close(loss, expected)
        # step-wide divisors: -2 / 8 tokens = -0.25; (-1 + 1) / 4 = 0; (-3/4 + 1/4) / 4 = -0.125
        loss, _ = policy_loss(logp, logp, ADV, self.MASK, num_tokens=8)
        close(loss, -0.25)
        loss, _ = policy_loss(
            logp, logp, ADV, self.MASK, aggregation="seq-mean-token-sum-norm", max_len=4, num_seqs=4
        )
        close(loss, -0.125)

    @pytest.mark.parametrize("estimator,kl", [("k1", LN2), ("k2", 0.2402265), ("k3", 0.1931472)])
    def test_beta_adds_beta_times_kl(self, estimator, kl):
        # ratio 1 -> surrogate -A; logp = log 0.5, ref = log 0.25 on every token, so the chosen
        # estimator is the constant `kl` (see TestKl row 0) on every token.
        logp = torch.full((2, 4), LOG_HALF, requires_grad=True)
        ref = torch.full((2, 4), LOG_QUARTER)
        loss0, m0 = policy_loss(logp, logp.detach(), ADV, self.MASK)
        loss, metrics = policy_loss(
            logp, logp.detach(), ADV, self.MASK, beta=0.1, ref_logp=ref, kl_estimator=estimator
        )
        # token-mean of (-A + 0.1 * kl) = -0.5 + 0.1 * kl
        close(loss0.detach(), -0.5)
        close(loss.detach(), -0.5 + 0.1 * kl)
        assert metrics["policy/kl_ref"] == pytest.approx(kl, abs=1e-6)
        assert metrics["policy/clip_frac"] == 0.0
        assert metrics["policy/approx_kl"] == 0.0
        assert metrics["policy/ratio_mean"] == pytest.approx(1.0)

    def test_k3_penalty_gradient(self):
        # d/dlogp [-A * ratio + beta * (exp(ref - logp) - (ref - logp) - 1)]
        #   = -A * ratio + beta * (1 - exp(ref - logp)) = -A + 0.1 * (1 - 0.5) = -A + 0.05
        # token-mean over 4 tokens: row 0 (-1 + 0.05) / 4 = -0.2375; row 1 (1 + 0.05) / 4 = 0.2625
        logp = torch.full((2, 4), LOG_HALF, requires_grad=True)
        ref = torch.full((2, 4), LOG_QUARTER)
        loss, _ = policy_loss(logp, logp.detach(), ADV, self.MASK, beta=0.1, ref_logp=ref)
        loss.backward()
        close(logp.grad, [[-0.2375, -0.2375, -0.2375, 0.0], [0.2625, 0.0, 0.0, 0.0]])

    @pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
    def test_padding_garbage_does_not_matter(self, aggregation):
        keep = self.MASK.bool()
        logp_clean, old = _logps(RATIOS)
        ref = torch.full((2, 4), LOG_QUARTER)
        # Same completion tokens; padding gets +-1e6 (exp of which overflows to inf).
        logp_dirty = torch.where(keep, logp_clean.detach(), GARBAGE).requires_grad_(True)
        old_dirty = torch.where(keep, old, -GARBAGE)
        ref_dirty = torch.where(keep, ref, -GARBAGE)
        kwargs = dict(beta=0.04, aggregation=aggregation, max_len=4)
        loss_c, m_c = policy_loss(logp_clean, old, ADV, self.MASK, ref_logp=ref, **kwargs)
        loss_d, m_d = policy_loss(
            logp_dirty, old_dirty, ADV, self.MASK, ref_logp=ref_dirty, **kwargs
        )
        loss_c.backward()
        loss_d.backward()
        close(loss_d.detach(), loss_c.detach())
        assert torch.isfinite(logp_dirty.grad).all()
        close(logp_dirty.grad, logp_clean.grad)
        assert (logp_dirty.grad[~keep] == 0).all()
        assert m_d == pytest.approx(m_c)

    def test_value_errors(self):
        logp = torch.zeros(2, 4)
        with pytest.raises(ValueError, match="ref_logp"):
            policy_loss(logp, logp, ADV, self.MASK, beta=0.1)
        with pytest.raises(ValueError, match="aggregation"):
            policy_loss(logp, logp, ADV, self.MASK, aggregation="sum")
        with pytest.raises(ValueError, match="kl_estimator"):
            policy_loss(logp, logp, ADV, self.MASK, kl_estimator="k4")
        with pytest.raises(ValueError, match="max_len"):
            policy_loss(logp, logp, ADV, self.MASK, aggregation="seq-mean-token-sum-norm")
        with pytest.raises(ValueError, match="beta"):
            policy_loss(logp, logp, ADV, self.MASK, beta=-1.0, ref_logp=logp)
        with pytest.raises(ValueError):
            policy_loss(logp, logp[:, :3], ADV, self.MASK)
        with pytest.raises(ValueError):
            policy_loss(logp, logp, torch.zeros(3), self.MASK)
