"""Tests of the KL penalty in the reward (rlvr.algo.kl.kl_in_reward) and reference sync."""

import math

import pytest
import torch
from torch import nn

from rlvr.algo.gae import outcome_to_token_rewards
from rlvr.algo.kl import kl_in_reward
from rlvr.train.reference import sync_reference
from tests.helpers import close

GARBAGE = 1e6
LN2 = math.log(2.0)  # 0.6931472


# Row 0: 3 completion tokens, row 1: 1. logp = log 0.5, ref = log 0.25 on every completion token:
# k1 = logp - ref = ln 2 = 0.6931472; k3 = r - 1 - log r with r = 0.5: 0.1931472.
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
KEEP = MASK.bool()
LOGP = torch.where(KEEP, torch.full((2, 4), math.log(0.5)), GARBAGE)
REF = torch.where(KEEP, torch.full((2, 4), math.log(0.25)), -GARBAGE)
OUTCOME = torch.tensor([1.0, -1.0])


class TestKlInReward:
    def test_token_rewards(self):
        # beta 0.1, k1: penalty 0.0693147 on each completion token; the outcome sits on the last
        # row 0: -0.0693147, -0.0693147, 1 - 0.0693147 = 0.9306853; row 1: -1 - 0.0693147
        token = outcome_to_token_rewards(OUTCOME, MASK)
        out = kl_in_reward(token, LOGP, REF, MASK, beta=0.1)
        p = 0.1 * LN2
        close(out, [[-p, -p, 1 - p, 0.0], [-1 - p, 0.0, 0.0, 0.0]])

    def test_outcome_rewards_keep_shape_and_sum_the_penalty(self):
        # [B] in -> [B] out, the per-token penalties summed (not averaged) over the completion:
        # row 0: 1 - 3 * 0.0693147 = 0.7920558; row 1: -1 - 0.0693147 = -1.0693147
        out = kl_in_reward(OUTCOME, LOGP, REF, MASK, beta=0.1)
        close(out, [1 - 0.3 * LN2, -1 - 0.1 * LN2])
        # ... which is what the per-token rewards add up to
        token = kl_in_reward(outcome_to_token_rewards(OUTCOME, MASK), LOGP, REF, MASK, beta=0.1)
        close(out, token.sum(dim=1))

    def test_estimator_choice_and_beta_zero(self):
        # k3: penalty 0.1 * 0.1931472 = 0.0193147 per token; row 0: 1 - 3 * 0.0193147 = 0.9420558
        out = kl_in_reward(OUTCOME, LOGP, REF, MASK, beta=0.1, estimator="k3")
        close(out, [1 - 0.3 * 0.1931472, -1 - 0.1 * 0.1931472])
        # beta 0 gives the rewards back
        close(kl_in_reward(OUTCOME, LOGP, REF, MASK, beta=0.0), OUTCOME)

    def test_detached(self):
        logp = LOGP.clone().requires_grad_(True)
        assert not kl_in_reward(OUTCOME, logp, REF, MASK, beta=0.1).requires_grad

    def test_bad_inputs(self):
        with pytest.raises(ValueError, match="estimator"):
            kl_in_reward(OUTCOME, LOGP, REF, MASK, beta=0.1, estimator="k4")
        with pytest.raises(ValueError, match="beta"):
            kl_in_reward(OUTCOME, LOGP, REF, MASK, beta=-0.1)
        with pytest.raises(ValueError):
            kl_in_reward(torch.zeros(3), LOGP, REF, MASK, beta=0.1)
        with pytest.raises(ValueError):
            kl_in_reward(OUTCOME, LOGP, REF[:, :3], MASK, beta=0.1)


def _linear(weight, bias):
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weight]))
        layer.bias.copy_(torch.tensor([bias]))
    return layer


class TestSyncReference:
    def test_hard_copy(self):
        ref = _linear([0.0, 4.0], 1.0)
        policy = _linear([2.0, 0.0], -1.0)
        sync_reference(ref, policy, 1.0)
        close(ref.weight, [[2.0, 0.0]])
        close(ref.bias, [-1.0])
        # copies, not aliases: moving the policy afterwards leaves the reference alone
        with torch.no_grad():
            policy.weight.add_(1.0)
        close(ref.weight, [[2.0, 0.0]])

    def test_soft_update(self):
        # alpha 0.25: ref = 0.25 * policy + 0.75 * ref
        # weight: 0.25 * (2, 0) + 0.75 * (0, 4) = (0.5, 3.0); bias 0.25 * -1 + 0.75 * 1 = 0.5
        ref = _linear([0.0, 4.0], 1.0)
        policy = _linear([2.0, 0.0], -1.0)
        sync_reference(ref, policy, 0.25)
        close(ref.weight, [[0.5, 3.0]])
        close(ref.bias, [0.5])
        # the policy is untouched, and no autograd history is recorded on the reference
        close(policy.weight, [[2.0, 0.0]])
        assert ref.weight.grad_fn is None

    def test_errors(self):
        ref = _linear([0.0, 4.0], 1.0)
        with pytest.raises(ValueError, match="alpha"):
            sync_reference(ref, _linear([1.0, 1.0], 0.0), 0.0)
        with pytest.raises(ValueError, match="alpha"):
            sync_reference(ref, _linear([1.0, 1.0], 0.0), 1.5)
        with pytest.raises(ValueError, match="names"):
            sync_reference(ref, nn.Sequential(_linear([1.0, 1.0], 0.0)), 1.0)
        with pytest.raises(ValueError, match="shape"):
            sync_reference(ref, nn.Linear(3, 1), 1.0)
