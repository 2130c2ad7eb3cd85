"""Tests of the advantage-estimator registry: every expected number derived by hand."""

from functools import partial

import pytest
import torch

from rlvr.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    GROUP_BASELINE_ESTIMATORS,
    REWARD_SCALES,
    advantages_dr_grpo,
    advantages_grpo,
    advantages_reinforce_pp,
    advantages_reinforce_pp_baseline,
    advantages_rloo,
    scale_by_batch_std,
    scale_by_group_std,
    scale_none,
)
from tests import helpers

# REWARDS are float64: compare them without rounding to float32
close = partial(helpers.close, dtype=torch.float64)


# One hand-made batch, groups interleaved and of unequal sizes (3, 2, 1, 2):
#   group 0 = {1, 0, 0} at positions 0, 2, 4   mean 1/3
#   group 1 = {2, 4}    at positions 1, 3      mean 3
#   group 2 = {5}       at position 5          size 1
#   group 3 = {3, 3}    at positions 6, 7      constant
REWARDS = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.0, 5.0, 3.0, 3.0], dtype=torch.float64)
GROUP_IDS = torch.tensor([0, 1, 0, 1, 0, 2, 3, 3])

# r - group mean: group 0 -> 2/3, -1/3, -1/3; group 1 -> -1, +1; groups 2 and 3 -> 0
CENTRED = [2 / 3, -1.0, -1 / 3, 1.0, -1 / 3, 0.0, 0.0, 0.0]

# Group stds (unbiased):
#   group 0: squares 4/9 + 1/9 + 1/9 = 2/3, / (3 - 1) = 1/3, std sqrt(1/3) = 0.5773503
#   group 1: squares 1 + 1 = 2, / (2 - 1) = 2, std 1.4142136
#   group 2: size 1 -> std 0; group 3: constant -> std 0
GROUP_STD = [0.5773503, 1.4142136, 0.5773503, 1.4142136, 0.5773503, 0.0, 0.0, 0.0]

# Batch std of the raw rewards: mean 18 / 8 = 2.25, deviations -1.25, -0.25, -2.25, 1.75,
# -2.25, 2.75, 0.75, 0.75, squares 1.5625 + 0.0625 + 5.0625 + 3.0625 + 5.0625 + 7.5625
# + 0.5625 + 0.5625 = 23.5, var 23.5 / 7 = 3.3571429, std 1.8322508.
BATCH_STD = 1.8322508

# Batch std of the group-centred rewards: squares 4/9 + 1 + 1/9 + 1 + 1/9 = 8/3, mean of CENTRED
# is 0, var (8/3) / 7 = 0.3809524, std 0.6172134.
CENTRED_BATCH_STD = 0.6172134

EPS = 1e-4

EXPECTED = {
    # (r - mean_g) / (std_g + 1e-4):
    #   group 0: (2/3) / 0.5774503 = 1.1545006, (-1/3) / 0.5774503 = -0.5772503
    #   group 1: -+1 / 1.4143136 = -+0.7070568; groups 2 and 3: exactly 0
    "grpo": [1.1545006, -0.7070568, -0.5772503, 0.7070568, -0.5772503, 0.0, 0.0, 0.0],
    # r - mean_g (CENTRED)
    "dr_grpo": CENTRED,
    # r - mean of the others: group 0: 1 - (0 + 0)/2 = 1, 0 - (1 + 0)/2 = -0.5 (twice);
    # group 1: 2 - 4 = -2, 4 - 2 = 2; group 2 (no other member) and group 3: 0
    "rloo": [1.0, -2.0, -0.5, 2.0, -0.5, 0.0, 0.0, 0.0],
    # (r - 2.25) / (1.8322508 + 1e-4 = 1.8323508): -1.25 -> -0.6821838, -0.25 -> -0.1364368,
    # -2.25 -> -1.2279308, 1.75 -> 0.9550573, 2.75 -> 1.5008044, 0.75 -> 0.4093103
    "reinforce++": [
        -0.6821838,
        -0.1364368,
        -1.2279308,
        0.9550573,
        -1.2279308,
        1.5008044,
        0.4093103,
        0.4093103,
    ],
    # CENTRED / (0.6172134 + 1e-4 = 0.6173134): 2/3 -> 1.0799485, -1 -> -1.6199227,
    # -1/3 -> -0.5399742, 1 -> 1.6199227, zeros stay 0
    "reinforce++-baseline": [
        1.0799485,
        -1.6199227,
        -0.5399742,
        1.6199227,
        -0.5399742,
        0.0,
        0.0,
        0.0,
    ],
}


class TestRegistry:
    def test_keys_and_functions(self):
        assert ADVANTAGE_ESTIMATORS == {
            "grpo": advantages_grpo,
            "dr_grpo": advantages_dr_grpo,
            "rloo": advantages_rloo,
            "reinforce++": advantages_reinforce_pp,
            "reinforce++-baseline": advantages_reinforce_pp_baseline,
        }
        assert REWARD_SCALES == {
            "group": scale_by_group_std,
            "batch": scale_by_batch_std,
            "none": scale_none,
        }

    @pytest.mark.parametrize("name", list(EXPECTED))
    def test_hand_values_uniform_call(self, name):
        out = ADVANTAGE_ESTIMATORS[name](REWARDS, GROUP_IDS, scale_rewards="group", eps=EPS)
        assert out.shape == REWARDS.shape
        close(out, EXPECTED[name])

    def test_estimators_differ_on_one_batch(self):
        outs = {name: fn(REWARDS, GROUP_IDS) for name, fn in ADVANTAGE_ESTIMATORS.items()}
        names = list(outs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                assert not torch.allclose(outs[a], outs[b], atol=1e-3), (a, b)

    def test_defaults(self):
        # defaults are scale_rewards="group", eps=1e-4
        for name, fn in ADVANTAGE_ESTIMATORS.items():
            close(fn(REWARDS, GROUP_IDS), EXPECTED[name])

    @pytest.mark.parametrize("name", list(EXPECTED))
    def test_unknown_scale_raises_everywhere(self, name):
        with pytest.raises(ValueError, match="scale_rewards"):
            ADVANTAGE_ESTIMATORS[name](REWARDS, GROUP_IDS, scale_rewards="std")

    @pytest.mark.parametrize("name", ["dr_grpo", "rloo", "reinforce++", "reinforce++-baseline"])
    def test_fixed_scale_estimators_ignore_scale_rewards(self, name):
        fn = ADVANTAGE_ESTIMATORS[name]
        for scale in ("batch", "none"):
            close(fn(REWARDS, GROUP_IDS, scale_rewards=scale), EXPECTED[name])


class TestRewardScales:
    def test_divisors(self):
        # group: std_g + 1e-4 (GROUP_STD above; size-1 and constant groups: 0 + 1e-4)
        close(scale_by_group_std(REWARDS, GROUP_IDS, eps=EPS), [s + EPS for s in GROUP_STD])
        # batch: 1.8322508 + 1e-4 for everyone
        close(scale_by_batch_std(REWARDS, GROUP_IDS, eps=EPS), [BATCH_STD + EPS] * 8)
        # none: exactly 1, eps ignored
        assert torch.equal(
            scale_none(REWARDS, GROUP_IDS, eps=EPS), torch.ones(8, dtype=torch.float64)
        )

    def test_grpo_scale_batch(self):
        # CENTRED / (1.8322508 + 1e-4 = 1.8323508): 2/3 -> 0.3638314, -1 -> -0.5457470,
        # -1/3 -> -0.1819157, 1 -> 0.5457470, zeros stay exactly 0
        out = advantages_grpo(REWARDS, GROUP_IDS, scale_rewards="batch")
        close(out, [0.3638314, -0.545747, -0.1819157, 0.545747, -0.1819157, 0.0, 0.0, 0.0])
        assert (out[5:] == 0).all()

    def test_grpo_scale_none_is_dr_grpo(self):
        out = advantages_grpo(REWARDS, GROUP_IDS, scale_rewards="none")
        close(out, CENTRED)
        torch.testing.assert_close(out, advantages_dr_grpo(REWARDS, GROUP_IDS))

    def test_batch_of_one_and_eps_zero(self):
        # one reward: batch std 0 (not nan); the lone group is constant -> advantage exactly 0
        one = torch.tensor([2.0])
        ids = torch.tensor([0])
        close(scale_by_batch_std(one, ids, eps=0.0), [0.0])
        assert advantages_grpo(one, ids, scale_rewards="batch", eps=0.0).item() == 0.0

    def test_batch_scale_all_constant_groups_exact_zero_with_eps_zero(self):
        # two constant groups {1, 1} and {0, 0}: batch std > 0 but every centred value is 0
        r = torch.tensor([1.0, 1.0, 0.0, 0.0])
        ids = torch.tensor([0, 0, 1, 1])
        assert (advantages_grpo(r, ids, scale_rewards="batch", eps=0.0) == 0).all()


class TestRlooIdentity:
    def test_rloo_is_g_over_g_minus_1_times_centred(self):
        # Per element, with its own group size N_g: RLOO = N_g / (N_g - 1) * (r - mean_g).
        # group 0 (N=3): 3/2 * (2/3, -1/3, -1/3) = (1, -0.5, -0.5)
        # group 1 (N=2): 2/1 * (-1, +1) = (-2, 2)
        # group 3 (N=2): 2 * 0 = 0; group 2 (N=1): the factor is undefined, both are 0
        sizes = torch.tensor([3.0, 2.0, 3.0, 2.0, 3.0, 1.0, 2.0, 2.0], dtype=torch.float64)
        factor = torch.where(sizes > 1, sizes / (sizes - 1).clamp(min=1), torch.zeros_like(sizes))
        rloo = ADVANTAGE_ESTIMATORS["rloo"](REWARDS, GROUP_IDS)
        centred = ADVANTAGE_ESTIMATORS["grpo"](REWARDS, GROUP_IDS, scale_rewards="none")
        torch.testing.assert_close(rloo, factor * centred)
        close(rloo, EXPECTED["rloo"])


class TestGroupsOfOne:
    # group_size 1: five completions, each its own group, rewards all different
    SINGLE = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0], dtype=torch.float64)
    IDS = torch.arange(5)

    @pytest.mark.parametrize("scale", list(REWARD_SCALES))
    @pytest.mark.parametrize("name", sorted(GROUP_BASELINE_ESTIMATORS))
    def test_group_baseline_estimators_give_all_zeros(self, name, scale):
        # the baseline of a one-row group is the row's own reward (mean_g = r_i; RLOO has no
        # other member), so every advantage is exactly 0, whatever the divisor
        out = ADVANTAGE_ESTIMATORS[name](self.SINGLE, self.IDS, scale_rewards=scale)
        assert torch.equal(out, torch.zeros(5, dtype=torch.float64))

    def test_batch_baseline_is_not_listed(self):
        # reinforce++ subtracts the batch mean 2.5 / 5 = 0.5: deviations 0.5, -0.5, 0, 1.5, -1.5,
        # squares 0.25 + 0.25 + 0 + 2.25 + 2.25 = 5, var 5 / 4 = 1.25, std 1.1180340;
        # A = deviation / (1.1180340 + 1e-4 = 1.1181340)
        out = ADVANTAGE_ESTIMATORS["reinforce++"](self.SINGLE, self.IDS)
        close(out, [0.4471736, -0.4471736, 0.0, 1.3415208, -1.3415208])
        # the constant lists exactly the estimators that give all zeros on groups of one
        all_zero = {
            name
            for name, fn in ADVANTAGE_ESTIMATORS.items()
            if torch.equal(fn(self.SINGLE, self.IDS), torch.zeros(5, dtype=torch.float64))
        }
        assert all_zero == GROUP_BASELINE_ESTIMATORS
        assert GROUP_BASELINE_ESTIMATORS == {"grpo", "dr_grpo", "rloo", "reinforce++-baseline"}


class TestReinforcePP:
    def test_constant_group_nonzero_but_constant_batch_zero(self):
        # Global baseline: group 3 = {3, 3} is constant yet gets (3 - 2.25) / 1.8323508 = 0.4093103
        out = advantages_reinforce_pp(REWARDS, GROUP_IDS)
        close(out[6:], [0.4093103, 0.4093103])
        # A constant batch gives exactly 0, even with eps = 0 (no 0/0)
        flat = torch.full((5,), 0.7)
        ids = torch.arange(5)
        assert (advantages_reinforce_pp(flat, ids, eps=0.0) == 0).all()

    def test_batch_normalised(self):
        # mean 0 and (unbiased) std 1 up to the eps in the divisor
        out = advantages_reinforce_pp(REWARDS, GROUP_IDS, eps=0.0)
        close(out.mean(), 0.0)
        close(out.std(), 1.0)

    def test_baseline_variant_divides_by_std_of_centred_not_raw(self):
        # std of CENTRED is 0.6172134 (not the raw 1.8322508): with eps = 0, the
        # advantages have unbiased batch std exactly 1 and zero-variance groups stay 0
        out = advantages_reinforce_pp_baseline(REWARDS, GROUP_IDS, eps=0.0)
        close(out.std(), 1.0)
        close(out * CENTRED_BATCH_STD, CENTRED)
        assert (out[5:] == 0).all()

    def test_all_constant_groups_give_zero_not_nan(self):
        # groups {1, 1} and {0, 0}: every centred reward is 0, batch std of c is 0; eps = 0
        r = torch.tensor([1.0, 1.0, 0.0, 0.0])
        ids = torch.tensor([0, 0, 1, 1])
        assert (advantages_reinforce_pp_baseline(r, ids, eps=0.0) == 0).all()

    def test_empty_batch(self):
        empty = torch.zeros(0)
        ids = torch.zeros(0, dtype=torch.long)
        for fn in ADVANTAGE_ESTIMATORS.values():
            assert fn(empty, ids).shape == (0,)


class TestInputs:
    @pytest.mark.parametrize("name", list(EXPECTED))
    def test_integer_rewards_and_bad_ids(self, name):
        fn = ADVANTAGE_ESTIMATORS[name]
        out = fn(REWARDS.long(), GROUP_IDS)
        assert out.dtype.is_floating_point
        close(out, EXPECTED[name], atol=1e-5)
        with pytest.raises(ValueError):
            fn(REWARDS, GROUP_IDS.float())
        with pytest.raises(ValueError):
            fn(REWARDS, GROUP_IDS[:3])
