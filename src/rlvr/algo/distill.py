"""On-policy distillation's advantages: the teacher's per-token log-probs on the student's own
samples, the sampled reverse KL as a per-token advantage, optionally mixed with the verifier's.

Thinking Machines' "On-Policy Distillation" (Lu et al. 2025; tinker-cookbook's
``on_policy_distillation``), verl's and Trinity's ``on_policy_distill`` advantage: the student
samples ``y ~ pi`` and the teacher scores the same tokens, then each token ``t`` gets::

    A_t = log q(y_t | y_<t) - log pi(y_t | y_<t)     (teacher minus student)

which is minus the one-sample (k1) estimate of the reverse KL ``KL(pi || q)`` at that token.
With the PPO ratio at 1 (the first pass over a batch) the policy loss's gradient is
``-E_pi[sum_t A_t grad log pi(y_t)]``, the gradient of ``E_pi[sum_t log pi - log q]``
token by token (the future tokens' terms dropped: discount 0, as tinker's default): the
student is pushed toward what the teacher would have written, on the states it reaches itself
(mode seeking, where SFT on the teacher's samples is mean seeking and off-policy).

Nothing here averages: each token's advantage is its own, and the policy loss's aggregation
(``rlvr.algo.reductions``) divides the per-token terms by its divisor.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["mixed_advantages", "reverse_kl_advantages"]


def reverse_kl_advantages(student_logp: Tensor, teacher_logp: Tensor, mask: Tensor) -> Tensor:
    """Per-token advantage ``teacher_logp - student_logp`` on completion tokens, 0 on padding.

    ``student_logp`` are the log-probs the student sampled its tokens with (the behaviour's, at
    the sampling temperature) and ``teacher_logp`` the teacher's on the same tokens (at the same
    temperature). Their difference is minus the sampled reverse KL ``log pi - log q`` at each
    token: positive where the teacher finds the token likelier than the student did. Detached
    (an advantage carries no gradient); padded positions may hold any value, NaN included: they
    are selected away, not multiplied.

    Args:
        student_logp (Tensor): ``[N, T]`` the student's log-probs of its sampled tokens.
        teacher_logp (Tensor): ``[N, T]`` the teacher's log-probs of the same tokens.
        mask (Tensor): ``[N, T]``, 1 on the tokens that count, 0 on padding.

    Returns:
        Tensor: ``[N, T]`` advantages, float, no grad; exactly 0 where ``mask`` is 0.
    """
    if not student_logp.shape == teacher_logp.shape == mask.shape:
        raise ValueError(
            f"student_logp {tuple(student_logp.shape)}, teacher_logp "
            f"{tuple(teacher_logp.shape)} and mask {tuple(mask.shape)} must have one shape [N, T]"
        )
    difference = (teacher_logp - student_logp).detach().float()
    return difference.where(mask.bool(), 0.0)


def mixed_advantages(
    kl_adv: Tensor,
    reward_adv: Tensor,
    mask: Tensor,
    kl_coef: float = 1.0,
    reward_coef: float = 0.0,
) -> Tensor:
    """``kl_coef * kl_adv + reward_coef * reward_adv`` per token, 0 on padding.

    ``kl_adv`` is :func:`reverse_kl_advantages`'s dense teacher signal; ``reward_adv`` the
    verifier's advantages (a group estimator's one per completion, ``[N]``, broadcast over the
    completion's tokens, or already per token, ``[N, T]``). ``reward_coef = 0`` is pure
    distillation (``reward_adv`` then adds nothing, whatever it holds on the masked tokens);
    ``> 0`` adds the outcome reward's signal to every token of its completion, as tinker adds
    its KL penalty to the environment's advantages after their normalisation. Nothing is
    averaged or normalised here.

    Args:
        kl_adv (Tensor): ``[N, T]`` per-token reverse-KL advantages.
        reward_adv (Tensor): ``[N]`` or ``[N, T]`` the verifier's advantages.
        mask (Tensor): ``[N, T]``, 1 on the tokens that count, 0 on padding.
        kl_coef (float): weight of the teacher's term.
        reward_coef (float): weight of the verifier's term.

    Returns:
        Tensor: ``[N, T]`` advantages, float, no grad; exactly 0 where ``mask`` is 0.
    """
    if reward_adv.dim() == 1:
        reward_adv = reward_adv.unsqueeze(1)  # [N, 1]: one advantage per completion
    if reward_adv.shape[0] != kl_adv.shape[0]:
        raise ValueError(
            f"reward_adv has {reward_adv.shape[0]} rows and kl_adv {kl_adv.shape[0]}: one per "
            "completion"
        )
    mixed = kl_coef * kl_adv.detach().float()
    if reward_coef != 0:
        mixed = mixed + reward_coef * reward_adv.detach().float()
    return mixed.where(mask.bool(), 0.0)
