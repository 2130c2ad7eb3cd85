"""DPO / IPO loss (rlvr.algo.dpo): hand-computed values and gradients on a padded 2-pair batch."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algo import dpo_loss, sequence_logps

NAN = float("nan")

# Per-token log-probs [P=2, T=3]; the mask keeps 2 tokens of pair 0 and 1 of pair 1 for the
# chosen, 3 and 2 for the rejected. Padding holds garbage (nan, inf, 1e6) that must not count.
POLICY_CHOSEN = [[-1.0, -2.0, NAN], [-0.5, float("inf"), 1e6]]  # sums -3, -0.5
CHOSEN_MASK = [[1, 1, 0], [1, 0, 0]]
POLICY_REJECTED = [[-1.0, -1.0, -1.0], [-2.0, -1.0, NAN]]  # sums -3, -3
REJECTED_MASK = [[1, 1, 1], [1, 1, 0]]
REF_CHOSEN = torch.tensor([-4.0, -1.0])
REF_REJECTED = torch.tensor([-2.0, -3.0])
# h = (pc - pr) - (rc - rr): pair 0: (−3 + 3) − (−4 + 2) = 2; pair 1: (−0.5 + 3) − (−1 + 3) = 0.5
BETA = 0.5


def _inputs():
    pc_tok = torch.tensor(POLICY_CHOSEN, requires_grad=True)
    pr_tok = torch.tensor(POLICY_REJECTED, requires_grad=True)
    pc = sequence_logps(pc_tok, torch.tensor(CHOSEN_MASK))
    pr = sequence_logps(pr_tok, torch.tensor(REJECTED_MASK))
    return pc_tok, pr_tok, pc, pr


def test_sequence_logps_sums_masked_tokens_and_ignores_padding_garbage():
    _, _, pc, pr = _inputs()
    assert pc.tolist() == [-3.0, -0.5]
    assert pr.tolist() == [-3.0, -3.0]


def test_sigmoid_loss_value_and_gradient_by_hand():
    pc_tok, pr_tok, pc, pr = _inputs()
    loss, metrics = dpo_loss(pc, pr, REF_CHOSEN, REF_REJECTED, BETA)
    # per pair -log sigmoid(beta h): log(1 + e^-1) = 0.3132617, log(1 + e^-0.25) = 0.5759394
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(-0.25))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(0.4446006, abs=1e-6)
    loss.backward()
    # d loss / d pc_p = -(beta / P) sigmoid(-beta h_p) = -0.25 * [0.2689414, 0.4378235]
    g = [-0.25 / (1 + math.exp(1.0)), -0.25 / (1 + math.exp(0.25))]
    torch.testing.assert_close(pc_tok.grad, torch.tensor([[g[0], g[0], 0.0], [g[1], 0.0, 0.0]]))
    # the rejected gets the opposite gradient, on its own masked tokens only
    torch.testing.assert_close(
        pr_tok.grad, torch.tensor([[-g[0], -g[0], -g[0]], [-g[1], -g[1], 0.0]])
    )
    # implicit rewards beta (log pi - log ref): chosen [0.5, 0.25], rejected [-0.5, 0]
    assert metrics["rewards/chosen"] == pytest.approx(0.375)
    assert metrics["rewards/rejected"] == pytest.approx(-0.25)
    assert metrics["rewards/margin"] == pytest.approx(0.625)  # mean of beta h = (1 + 0.25) / 2
    assert metrics["rewards/accuracy"] == 1.0


def test_ipo_loss_value_and_gradient_by_hand():
    pc_tok, _, pc, pr = _inputs()
    loss, _ = dpo_loss(pc, pr, REF_CHOSEN, REF_REJECTED, BETA, loss_type="ipo")
    # (h - 1/(2 beta))^2 with target 1: (2 - 1)^2 = 1, (0.5 - 1)^2 = 0.25; mean 0.625
    assert loss.item() == pytest.approx(0.625)
    loss.backward()
    # d/d pc_p = 2 (h_p - 1) / P = [1, -0.5]
    torch.testing.assert_close(pc_tok.grad, torch.tensor([[1.0, 1.0, 0.0], [-0.5, 0.0, 0.0]]))


def test_label_smoothing_adds_eps_beta_h():
    _, _, pc, pr = _inputs()
    loss, _ = dpo_loss(pc, pr, REF_CHOSEN, REF_REJECTED, BETA, label_smoothing=0.1)
    # -(1-eps) log s(x) - eps log s(-x) = -log s(x) + eps x, x = beta h = [1, 0.25]
    expected = (0.3132617 + 0.1 * 1.0 + 0.5759394 + 0.1 * 0.25) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="sigmoid"):
        dpo_loss(pc, pr, REF_CHOSEN, REF_REJECTED, BETA, loss_type="ipo", label_smoothing=0.1)


def test_micro_batches_with_the_step_divisor_add_up_to_the_full_loss():
    _, _, pc, pr = _inputs()
    full, _ = dpo_loss(pc, pr, REF_CHOSEN, REF_REJECTED, BETA)
    parts = [
        dpo_loss(
            pc[i : i + 1],
            pr[i : i + 1],
            REF_CHOSEN[i : i + 1],
            REF_REJECTED[i : i + 1],
            BETA,
            num_pairs=2,
        )[0]
        for i in range(2)
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), abs=1e-7)


def test_accuracy_counts_pairs_whose_chosen_reward_is_higher_and_reference_is_frozen():
    pc = torch.tensor([-1.0, -5.0], requires_grad=True)
    pr = torch.tensor([-2.0, -1.0])
    ref = torch.tensor([-1.0, -1.0], requires_grad=True)
    loss, metrics = dpo_loss(pc, pr, ref, ref, 1.0)
    assert metrics["rewards/accuracy"] == 0.5  # pair 0: 0 > -1; pair 1: -4 < 0
    loss.backward()
    assert ref.grad is None  # the reference's log-probs are detached


def test_bad_arguments_are_refused():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(x, x, x, x, 0.1, loss_type="hinge")
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(x, x, x, x, 0.0)
    with pytest.raises(ValueError, match="shape"):
        dpo_loss(x, torch.zeros(3), x, x, 0.1)
