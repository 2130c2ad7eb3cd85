"""Tests of per-token credit assignment (rlvr.algo.gae) and masked_whiten, numbers by hand."""

import pytest
import torch

from rlvr.algo.advantages import advantages_reinforce_pp
from rlvr.algo.gae import (
    discounted_returns,
    gae_advantages,
    outcome_to_token_rewards,
    reinforce_pp_token_advantages,
)
from rlvr.algo.reductions import masked_whiten
from tests.helpers import close

GARBAGE = 1e6  # written into padded positions; must never show up in a result


# Row 0: 3 completion tokens, outcome reward 1; row 1: 1 token, outcome reward -1.
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
OUTCOME = torch.tensor([1.0, -1.0])
TOKEN_REWARDS = torch.tensor([[0.0, 0.0, 1.0, GARBAGE], [-1.0, GARBAGE, GARBAGE, GARBAGE]])
VALUES = torch.tensor([[0.5, 0.25, 0.5, GARBAGE], [0.25, GARBAGE, GARBAGE, GARBAGE]])

# GAE with gamma = lam = 0.5 (gamma * lam = 0.25), backwards, V and A after the end are 0:
# row 0, t=2: delta = 1 + 0.5 * 0 - 0.5 = 0.5,               A = 0.5
#        t=1: delta = 0 + 0.5 * 0.5 - 0.25 = 0,              A = 0 + 0.25 * 0.5 = 0.125
#        t=0: delta = 0 + 0.5 * 0.25 - 0.5 = -0.375,         A = -0.375 + 0.25 * 0.125 = -0.34375
#        returns A + V: -0.34375 + 0.5 = 0.15625, 0.125 + 0.25 = 0.375, 0.5 + 0.5 = 1.0
# row 1, t=0: delta = -1 + 0 - 0.25 = -1.25,                 A = -1.25, return -1.0
GAE_ADV = [[-0.34375, 0.125, 0.5, 0.0], [-1.25, 0.0, 0.0, 0.0]]
GAE_RET = [[0.15625, 0.375, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0]]


class TestOutcomeToTokenRewards:
    def test_last_completion_token(self):
        mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]])
        out = outcome_to_token_rewards(torch.tensor([1.0, -1.0, 2.0, 3.0]), mask)
        # row 0: last token at t=2; row 1: t=0; row 2: no token -> reward dropped;
        # row 3 (a hole at t=1): last masked position is t=2
        expected = [
            [0.0, 0.0, 1.0, 0.0],
            [-1.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 3.0, 0.0],
        ]
        close(out, expected)

    def test_integer_rewards_and_shape_check(self):
        out = outcome_to_token_rewards(torch.tensor([1, 0]), MASK)
        assert out.dtype.is_floating_point
        close(out, [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
        with pytest.raises(ValueError):
            outcome_to_token_rewards(torch.tensor([1.0]), MASK)


class TestGae:
    def test_hand_values_with_padding_garbage(self):
        adv, ret = gae_advantages(TOKEN_REWARDS, VALUES, MASK, gamma=0.5, lam=0.5)
        close(adv, GAE_ADV)
        close(ret, GAE_RET)

    def test_outcome_placement_then_gae(self):
        rewards = outcome_to_token_rewards(OUTCOME, MASK)
        adv, ret = gae_advantages(rewards, VALUES, MASK, gamma=0.5, lam=0.5)
        close(adv, GAE_ADV)
        close(ret, GAE_RET)

    def test_right_padding_equals_unpadded(self):
        # Row 0 alone, unpadded [1, 3], against the padded [2, 4] batch and a [1, 7] padding.
        adv_u, ret_u = gae_advantages(
            TOKEN_REWARDS[:1, :3], VALUES[:1, :3], MASK[:1, :3], gamma=0.5, lam=0.5
        )
        close(adv_u, [GAE_ADV[0][:3]])
        close(ret_u, [GAE_RET[0][:3]])
        long_r = torch.cat([TOKEN_REWARDS[:1, :3], torch.full((1, 4), GARBAGE)], dim=1)
        long_v = torch.cat([VALUES[:1, :3], torch.full((1, 4), -GARBAGE)], dim=1)
        long_m = torch.tensor([[1, 1, 1, 0, 0, 0, 0]])
        adv_p, ret_p = gae_advantages(long_r, long_v, long_m, gamma=0.5, lam=0.5)
        close(adv_p[:, :3], adv_u)
        close(ret_p[:, :3], ret_u)
        assert (adv_p[:, 3:] == 0).all() and (ret_p[:, 3:] == 0).all()

    def test_left_padding_and_holes_are_skipped(self):
        # Row 0's three tokens at t = 1, 2, 3 (left padding), and at t = 0, 2, 3 (a hole at 1):
        # the masked positions are skipped, so the same three numbers come out.
        r = torch.tensor([[GARBAGE, 0.0, 0.0, 1.0], [0.0, GARBAGE, 0.0, 1.0]])
        v = torch.tensor([[GARBAGE, 0.5, 0.25, 0.5], [0.5, GARBAGE, 0.25, 0.5]])
        m = torch.tensor([[0, 1, 1, 1], [1, 0, 1, 1]])
        adv, ret = gae_advantages(r, v, m, gamma=0.5, lam=0.5)
        close(adv, [[0.0, -0.34375, 0.125, 0.5], [-0.34375, 0.0, 0.125, 0.5]])
        close(ret, [[0.0, 0.15625, 0.375, 1.0], [0.15625, 0.0, 0.375, 1.0]])

    def test_gamma_lam_one_is_reward_to_go_minus_value(self):
        # gamma = lam = 1: A_t = (sum of rewards from t) - V_t; row 0: 1 - (0.5, 0.25, 0.5),
        # row 1: -1 - 0.25; returns = reward-to-go = 1, 1, 1 and -1
        adv, ret = gae_advantages(TOKEN_REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
        close(adv, [[0.5, 0.75, 0.5, 0.0], [-1.25, 0.0, 0.0, 0.0]])
        close(ret, [[1.0, 1.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0]])

    def test_lam_zero_is_one_step_td(self):
        # lam = 0: A_t = delta_t; row 0 deltas -0.375, 0, 0.5 (see GAE_ADV derivation)
        adv, _ = gae_advantages(TOKEN_REWARDS, VALUES, MASK, gamma=0.5, lam=0.0)
        close(adv, [[-0.375, 0.0, 0.5, 0.0], [-1.25, 0.0, 0.0, 0.0]])

    def test_no_grad_and_bad_inputs(self):
        values = VALUES.clone().requires_grad_(True)
        adv, ret = gae_advantages(TOKEN_REWARDS, values, MASK, gamma=1.0, lam=0.95)
        assert not adv.requires_grad and not ret.requires_grad
        with pytest.raises(ValueError):
            gae_advantages(TOKEN_REWARDS, VALUES[:, :3], MASK, gamma=1.0, lam=1.0)
        with pytest.raises(ValueError):
            gae_advantages(TOKEN_REWARDS, VALUES, MASK, gamma=1.5, lam=1.0)


class TestReturnsAndReinforcePP:
    def test_discounted_returns(self):
        # gamma 0.5 over rewards (1, 0, 2): G2 = 2, G1 = 0 + 0.5 * 2 = 1, G0 = 1 + 0.5 * 1 = 1.5;
        # row 1 has one token with reward 3 -> 3; padding 0
        r = torch.tensor([[1.0, 0.0, 2.0], [3.0, GARBAGE, GARBAGE]])
        m = torch.tensor([[1, 1, 1], [1, 0, 0]])
        close(discounted_returns(r, m, gamma=0.5), [[1.5, 1.0, 2.0], [3.0, 0.0, 0.0]])

    def test_reinforce_pp_token_whitens_over_tokens(self):
        # Outcome rewards 1 (3 tokens) and -1 (1 token), gamma = 1: token returns 1, 1, 1, -1.
        # Pooled over the 4 tokens: mean 0.5, deviations 0.5 (x3), -1.5, squares 0.75 + 2.25 = 3,
        # var 3 / 3 = 1, std 1; A = dev / (1 + 1e-4) = 0.49995 (x3), -1.49985
        adv, ret = reinforce_pp_token_advantages(outcome_to_token_rewards(OUTCOME, MASK), MASK)
        close(ret, [[1.0, 1.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0]])
        close(adv, [[0.49995, 0.49995, 0.49995, 0.0], [-1.49985, 0.0, 0.0, 0.0]])
        # The sequence-level estimator weighs each completion once: mean 0, std sqrt(2),
        # A = +-1 / (1.4142136 + 1e-4) = +-0.7070568 -- a different number, by design.
        seq = advantages_reinforce_pp(OUTCOME, torch.tensor([0, 1]))
        close(seq, [0.7070568, -0.7070568])


class TestMaskedWhiten:
    def test_hand_values(self):
        values = torch.tensor([[1.0, 2.0, 3.0, GARBAGE], [4.0, GARBAGE, GARBAGE, GARBAGE]])
        # over the 4 masked values: mean 2.5, deviations -1.5, -0.5, 0.5, 1.5,
        # squares 2.25 + 0.25 + 0.25 + 2.25 = 5, var 5 / 3, std 1.2909944
        # eps = 0: -1.1618950, -0.3872983, 0.3872983, 1.1618950; padding 0
        out = masked_whiten(values, MASK, eps=0.0)
        close(out, [[-1.161895, -0.3872983, 0.3872983, 0.0], [1.161895, 0.0, 0.0, 0.0]])

    def test_single_and_no_token(self):
        # one token: deviation 0, std 0 -> 0 (not nan), even with eps = 0; no token: all 0
        one = masked_whiten(torch.tensor([[5.0, GARBAGE]]), torch.tensor([[1, 0]]), eps=0.0)
        close(one, [[0.0, 0.0]])
        none = masked_whiten(torch.tensor([[5.0, GARBAGE]]), torch.tensor([[0, 0]]), eps=0.0)
        close(none, [[0.0, 0.0]])
