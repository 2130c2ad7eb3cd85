"""On-policy distillation's advantages: teacher minus student per token, 0 on padding, mixed
with the verifier's; with them the policy loss's gradient is the reverse KL's gradient."""

import math

import pytest
import torch

from rlvr import algo
from rlvr.algo.distill import mixed_advantages, reverse_kl_advantages
from tests.helpers import close

NAN, INF = float("nan"), float("inf")
STUDENT = torch.tensor([[-1.0, -2.0, 7.0], [-0.5, NAN, NAN]])  # padding holds garbage
TEACHER = torch.tensor([[-0.5, -3.0, 99.0], [-0.25, 5.0, INF]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_the_advantage_is_teacher_minus_student_on_tokens_and_0_on_padding():
    student = STUDENT.clone().requires_grad_()
    advantages = reverse_kl_advantages(student, TEACHER, MASK)
    close(advantages, [[0.5, -1.0, 0.0], [0.25, 0.0, 0.0]])
    assert not advantages.requires_grad  # an advantage carries no gradient
    assert torch.isfinite(advantages).all()


def test_shapes_that_differ_are_refused():
    with pytest.raises(ValueError, match="one shape"):
        reverse_kl_advantages(STUDENT, TEACHER[:, :2], MASK)


def test_mixing_weighs_both_terms_and_broadcasts_a_completion_advantage():
    kl = reverse_kl_advantages(STUDENT, TEACHER, MASK)
    mixed = mixed_advantages(kl, torch.tensor([1.0, -2.0]), MASK, kl_coef=0.5, reward_coef=2.0)
    # 0.5 x [0.5, -1] + 2 x 1 ; 0.5 x 0.25 + 2 x -2 ; padding 0
    close(mixed, [[2.25, 1.5, 0.0], [-3.875, 0.0, 0.0]])
    per_token = torch.tensor([[1.0, 3.0, NAN], [-1.0, NAN, NAN]])
    close(mixed_advantages(kl, per_token, MASK, 1.0, 1.0), [[1.5, 2.0, 0.0], [-0.75, 0.0, 0.0]])


def test_pure_distillation_ignores_the_reward_term_whatever_it_holds():
    kl = reverse_kl_advantages(STUDENT, TEACHER, MASK)
    pure = mixed_advantages(kl, torch.tensor([NAN, 5.0]), MASK, kl_coef=2.0, reward_coef=0.0)
    close(pure, [[1.0, -2.0, 0.0], [0.5, 0.0, 0.0]])
    with pytest.raises(ValueError, match="one per completion"):
        mixed_advantages(kl, torch.ones(3), MASK, 1.0, 1.0)


def test_the_policy_loss_gradient_with_these_advantages_is_the_reverse_kl_gradient():
    # one-token completions from p = (1/2, 1/4, 1/8, 1/8): 8 rows in exactly those proportions
    # are the expectation under p, so the token-mean loss's gradient is exact, not sampled
    theta = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125])).requires_grad_()
    teacher = torch.log_softmax(torch.tensor([0.3, -1.0, 2.0, 0.1]), dim=0)
    tokens = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3])
    logp_all = torch.log_softmax(theta, dim=0)
    garbage = torch.full((8, 1), 123.0)  # a padded second position
    logp = torch.cat([logp_all[tokens].unsqueeze(1), garbage], dim=1)  # [8, 2]
    teacher_logp = torch.cat([teacher[tokens].unsqueeze(1), -garbage], dim=1)
    mask = torch.tensor([[1.0, 0.0]] * 8)
    advantages = reverse_kl_advantages(logp.detach(), teacher_logp, mask)
    loss, _ = algo.policy_loss(logp, logp.detach(), advantages, mask, aggregation="token-mean")
    (loss_grad,) = torch.autograd.grad(loss, theta)

    theta_exact = theta.detach().clone().requires_grad_()
    p_log = torch.log_softmax(theta_exact, dim=0)
    reverse_kl = (p_log.exp() * (p_log - teacher)).sum()  # KL(p || q), exactly
    (kl_grad,) = torch.autograd.grad(reverse_kl, theta_exact)
    close(loss_grad, kl_grad)
    assert kl_grad.abs().sum() > 0.1  # a gradient to compare, not zeros
    # and a small step along it lowers the reverse KL
    step = theta.detach() - 0.1 * loss_grad
    after = torch.log_softmax(step, dim=0)
    assert (after.exp() * (after - teacher)).sum() < reverse_kl.item() - 1e-3
    assert math.isfinite(reverse_kl.item())
