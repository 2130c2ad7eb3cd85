"""CISPO and GMPO as `policy_loss(..., surrogate=...)`: hand-derived values and gradients with
padding in the tensors, the contrast with PPO-clip, the aggregation divisors, GMPO against a
literal transcription of its reference code, the surrogate configs (each reaching
`policy_loss` with its clips; YAML, `--set` and CLI spellings and their errors), and two training
steps of each recipe. Every expected number is derived in a comment."""

import dataclasses
import math

import pytest
import torch
import yaml

from rlvr.algo import ROLLOUT_CORRECTIONS, corrected_advantages
from rlvr.algo.losses import (
    SURROGATES,
    policy_loss,
    surrogate_cispo,
    surrogate_gmpo,
    surrogate_ppo_clip,
)
from rlvr.config import ConfigError, apply_overrides, from_dict, to_dict
from rlvr.train.config import (
    CISPO,
    GMPO,
    SURROGATE_CONFIGS,
    GRPOConfig,
    PPOClip,
    build_plan,
    check_grpo_config,
)
from rlvr.train.recipes import RECIPES, describe_recipe, recipe_config
from tests.helpers import close
from tests.test_algo_losses import ADV, GARBAGE, LOG_HALF, LOG_RATIOS, MASK

# CISPO batch, test_algo_losses's: MASK [[1, 1, 1, 0], [1, 0, 0, 0]]; row 0: 3 completion
# tokens with log-ratios 0.3, -0.1, 0.4 and A = +1; row 1: 1 token with log-ratio 0.1 and
# A = -1; old_logp = log 0.5 = -0.6931472 everywhere, so logp = -0.3931472, -0.7931472,
# -0.2931472 (row 0) and -0.5931472 (row 1).
# ratios: exp(0.3) = 1.3498588, exp(-0.1) = 0.9048374, exp(0.4) = 1.4918247, exp(0.1) = 1.1051709
# The IS weight in [1 - 1, 1 + 0.2] = [0, 1.2]: w = 1.2 (clipped), 0.9048374, 1.2 (clipped),
# 1.1051709. Per-token loss -w * A * logp:
#   (0,0) -1.2 * 1 * -0.3931472 = 0.4717766      (0,1) 0.9048374 * 0.7931472 = 0.7176692
#   (0,2) -1.2 * 1 * -0.2931472 = 0.3517766      (1,0) -1.1051709 * -1 * -0.5931472 = -0.6555290
# sum 0.8856934
CISPO_CLIP = {"epsilon_low": 1.0, "epsilon_high": 0.2}


def _inputs(log_ratios=LOG_RATIOS, mask=MASK, garbage=True):
    """old_logp = log 0.5; logp = old + log-ratio; padding gets +-1e6 garbage if asked."""
    keep = mask.bool()
    old = torch.full(log_ratios.shape, LOG_HALF)
    logp = old + log_ratios
    if garbage:
        logp = torch.where(keep, logp, GARBAGE)
        old = torch.where(keep, old, -GARBAGE)
    return logp.requires_grad_(True), old


def test_registry_and_surrogate_configs():
    assert SURROGATES == {
        "ppo-clip": surrogate_ppo_clip,
        "cispo": surrogate_cispo,
        "gmpo": surrogate_gmpo,
    }
    assert set(SURROGATE_CONFIGS) == set(SURROGATES)
    for name, cls in SURROGATE_CONFIGS.items():
        assert cls().name == name
    # each holds only its own clips, with its paper's defaults
    assert (PPOClip().epsilon_low, PPOClip().epsilon_high, PPOClip().clip_ratio_c) == (
        0.2,
        0.2,
        None,
    )
    assert (CISPO().epsilon_low, CISPO().epsilon_high) == (1.0, 4.0)
    assert (GMPO().epsilon_low, GMPO().epsilon_high) == (0.4, 0.4)
    assert not hasattr(CISPO(), "clip_ratio_c") and not hasattr(GMPO(), "clip_ratio_c")


class TestCISPO:
    def test_value_and_gradient_token_mean(self):
        logp, old = _inputs()
        loss, metrics = policy_loss(logp, old, ADV, MASK, surrogate="cispo", **CISPO_CLIP)
        # token-mean over the 4 completion tokens: 0.8856934 / 4 = 0.2214234
        close(loss.detach(), 0.2214234)
        loss.backward()
        # d/dlogp = -w * A / 4 on every token, the two clipped ones included:
        # -1.2 / 4 = -0.3, -0.9048374 / 4 = -0.2262094, -0.3; row 1: 1.1051709 / 4 = 0.2762927
        close(logp.grad, [[-0.3, -0.2262094, -0.3, 0.0], [0.2762927, 0.0, 0.0, 0.0]])
        # the IS weight was clipped on (0,0) and (0,2): 2 / 4
        assert metrics["policy/clip_frac"] == pytest.approx(0.5)
        assert "policy/dual_clip_frac" not in metrics

    def test_clipped_tokens_keep_their_gradient_unlike_ppo_clip(self):
        # Same batch and clip range under PPO-clip: (0,0) and (0,2) have A = +1 and
        # r > 1.2, so min(r A, 1.2 A) is the constant 1.2: gradient 0. The unclipped tokens get
        # -A r / 4: -0.9048374 / 4 = -0.2262094 and 1.1051709 / 4 = 0.2762927, as in CISPO
        # (there w = r).
        logp_ppo, old = _inputs()
        loss, _ = policy_loss(logp_ppo, old, ADV, MASK, surrogate="ppo-clip", **CISPO_CLIP)
        loss.backward()
        close(logp_ppo.grad, [[0.0, -0.2262094, 0.0, 0.0], [0.2762927, 0.0, 0.0, 0.0]])
        logp_cispo, _ = _inputs()
        loss, _ = policy_loss(logp_cispo, old, ADV, MASK, surrogate="cispo", **CISPO_CLIP)
        loss.backward()
        clipped = torch.tensor([[True, False, True, False], [False] * 4])
        assert (logp_cispo.grad[clipped] != 0).all() and (logp_ppo.grad[clipped] == 0).all()
        close(logp_cispo.grad[~clipped], logp_ppo.grad[~clipped])

    def test_clip_frac_counts_a_clipped_weight_whatever_the_advantage_sign(self):
        # One row, 2 tokens, r = 2 (log-ratio ln 2, old_logp 0, so logp = ln 2 = 0.6931472),
        # A = -1. PPO-clip clips a negative advantage only below 1 - epsilon_low: not clipped,
        # gradient -A r / 2 = 1.0 per token. CISPO: the weight 2 is capped at 1.2 (clipped),
        # loss -1.2 * -1 * 0.6931472 = 0.8317766 per token, mean 0.8317766, gradient 1.2 / 2 = 0.6
        logp = torch.full((1, 2), math.log(2.0), requires_grad=True)
        args = (torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2))
        loss, m_cispo = policy_loss(logp, *args, surrogate="cispo", **CISPO_CLIP)
        close(loss.detach(), 0.8317766)
        loss.backward()
        close(logp.grad, [[0.6, 0.6]])
        _, m_ppo = policy_loss(logp, *args, surrogate="ppo-clip", **CISPO_CLIP)
        assert m_cispo["policy/clip_frac"] == 1.0 and m_ppo["policy/clip_frac"] == 0.0

    def test_aggregation_divisors(self):
        # seq-mean-token-mean: row means (0.4717766 + 0.7176692 + 0.3517766) / 3 = 0.5137408
        # and -0.6555290, divided by 2 rows: -0.0708941; gradient -w A / (|y_i| * 2):
        # -1.2 / 6 = -0.2, -0.9048374 / 6 = -0.1508062; row 1 1.1051709 / 2 = 0.5525855
        logp, old = _inputs()
        loss, _ = policy_loss(
            logp, old, ADV, MASK, surrogate="cispo", aggregation="seq-mean-token-mean", **CISPO_CLIP
        )
        close(loss.detach(), -0.0708941)
        loss.backward()
        close(logp.grad, [[-0.2, -0.1508062, -0.2, 0.0], [0.5525855, 0.0, 0.0, 0.0]])
        # seq-mean-token-sum-norm, max_len 5: (1.5412224 / 5 - 0.6555290 / 5) / 2
        # = 0.8856934 / 10 = 0.0885693; gradient -w A / (5 * 2): -0.12, -0.0904837, -0.12, 0.1105171
        logp, old = _inputs()
        loss, _ = policy_loss(
            logp,
            old,
            ADV,
            MASK,
            surrogate="cispo",
            aggregation="seq-mean-token-sum-norm",
            max_len=5,
            **CISPO_CLIP,
        )
        close(loss.detach(), 0.0885693)
        loss.backward()
        close(logp.grad, [[-0.12, -0.0904837, -0.12, 0.0], [0.1105171, 0.0, 0.0, 0.0]])
        # token-mean over the step's 8 tokens (gradient accumulation): 0.8856934 / 8 = 0.1107117
        loss, _ = policy_loss(*_inputs(), ADV, MASK, surrogate="cispo", num_tokens=8, **CISPO_CLIP)
        close(loss.detach(), 0.1107117)

    def test_sequence_level_weight_has_no_cross_token_gradient(self):
        # ratio_level sequence: s_0 = exp(0.6 / 3) = 1.2214028 > 1.2 -> w = 1.2 on row 0,
        # s_1 = 1.1051709. The weight's gradient is stopped, so each token gets -w A / 4 of its
        # own log-prob: -0.3 on each of row 0's tokens, 0.2762927 on row 1's. (GSPO's PPO-clip
        # gives row 0 nothing: s_0 is clipped with A > 0.)
        logp, old = _inputs()
        loss, _ = policy_loss(
            logp, old, ADV, MASK, surrogate="cispo", ratio_level="sequence", **CISPO_CLIP
        )
        loss.backward()
        close(logp.grad, [[-0.3, -0.3, -0.3, 0.0], [0.2762927, 0.0, 0.0, 0.0]])


# GMPO batch, clip 0.4 in log space. Row 0: 4 tokens (no padding), log-ratios 0.3, -0.1, 0.7, 0.2,
# A = +1; row 1: 2 tokens and 2 padding, log-ratios -0.6, 0.2, A = -2.
G_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
G_LOG_RATIOS = torch.tensor([[0.3, -0.1, 0.7, 0.2], [-0.6, 0.2, 0.0, 0.0]])
G_ADV = torch.tensor([1.0, -2.0])
GMPO_CLIP = {"epsilon_low": 0.4, "epsilon_high": 0.4}
# Row 0 (A >= 0, cap at +0.4): clipped log-ratios 0.3, -0.1, 0.4 (clipped), 0.2; mean 0.8 / 4
#   = 0.2; rho_0 = exp(0.2) = 1.2214028; L_0 = -1 * 1.2214028 = -1.2214028
# Row 1 (A < 0, floor at -0.4): -0.4 (clipped), 0.2; mean -0.2 / 2 = -0.1;
#   rho_1 = exp(-0.1) = 0.9048374; L_1 = 2 * 0.9048374 = 1.8096748
# dL_i / dlogp_t = -A_i rho_i / |y_i| where the clip is not active, else 0:
#   row 0: -1.2214028 / 4 = -0.3053507 on tokens 0, 1, 3; row 1: 2 * 0.9048374 / 2 = 0.9048374
#   on token 1


class TestGMPO:
    def test_value_and_gradient_seq_mean(self):
        logp, old = _inputs(G_LOG_RATIOS, G_MASK)
        loss, metrics = policy_loss(
            logp,
            old,
            G_ADV,
            G_MASK,
            surrogate="gmpo",
            aggregation="seq-mean-token-mean",
            **GMPO_CLIP,
        )
        # GMPO's 1/G sum_i L_i: (-1.2214028 + 1.8096748) / 2 = 0.2941360
        close(loss.detach(), 0.2941360)
        loss.backward()
        # the gradients above / 2 sequences: -0.1526754 and 0.4524187
        g0, g1 = -0.1526754, 0.4524187
        close(logp.grad, [[g0, g0, 0.0, g0], [0.0, g1, 0.0, 0.0]])
        # clipped tokens (0,2) and (1,0): 2 / 6; ratio_mean of the token ratios exp(0.3),
        # exp(-0.1), exp(0.7), exp(0.2), exp(-0.6), exp(0.2): 7.2600661 / 6 = 1.2100110
        assert metrics["policy/clip_frac"] == pytest.approx(2 / 6)
        assert metrics["policy/ratio_mean"] == pytest.approx(1.2100110, abs=1e-6)

    def test_aggregation_divisors(self):
        # token-mean puts L_i on each of the row's tokens: (4 L_0 + 2 L_1) / 6
        # = (-4.8856110 + 3.6193496) / 6 = -0.2110436; gradient 4 * -0.3053507 / 6 = -0.2035671
        # on row 0's unclipped tokens, 2 * 0.9048374 / 6 = 0.3016125 on row 1's
        logp, old = _inputs(G_LOG_RATIOS, G_MASK)
        loss, _ = policy_loss(logp, old, G_ADV, G_MASK, surrogate="gmpo", **GMPO_CLIP)
        close(loss.detach(), -0.2110436)
        loss.backward()
        g0, g1 = -0.2035671, 0.3016125
        close(logp.grad, [[g0, g0, 0.0, g0], [0.0, g1, 0.0, 0.0]])
        # seq-mean-token-sum-norm, max_len 4: (4 L_0 / 4 + 2 L_1 / 4) / 2
        # = (-1.2214028 + 0.9048374) / 2 = -0.1582827
        loss, _ = policy_loss(
            *_inputs(G_LOG_RATIOS, G_MASK),
            G_ADV,
            G_MASK,
            surrogate="gmpo",
            aggregation="seq-mean-token-sum-norm",
            max_len=4,
            **GMPO_CLIP,
        )
        close(loss.detach(), -0.1582827)
        # seq-mean-token-mean over the step's 4 sequences: 0.5882720 / 4 = 0.1470680
        loss, _ = policy_loss(
            *_inputs(G_LOG_RATIOS, G_MASK),
            G_ADV,
            G_MASK,
            surrogate="gmpo",
            aggregation="seq-mean-token-mean",
            num_seqs=4,
            **GMPO_CLIP,
        )
        close(loss.detach(), 0.1470680)

    def test_without_clipping_is_the_plain_geometric_mean(self):
        # clip 10: row 0 mean (0.3 - 0.1 + 0.7 + 0.2) / 4 = 0.275, L_0 = -exp(0.275) = -1.3165307;
        # row 1 (-0.6 + 0.2) / 2 = -0.2, L_1 = 2 exp(-0.2) = 1.6374615; (L_0 + L_1) / 2 = 0.1604654
        loss, metrics = policy_loss(
            *_inputs(G_LOG_RATIOS, G_MASK),
            G_ADV,
            G_MASK,
            surrogate="gmpo",
            aggregation="seq-mean-token-mean",
            epsilon_low=10.0,
            epsilon_high=10.0,
        )
        close(loss.detach(), 0.1604654)
        assert metrics["policy/clip_frac"] == 0.0

    def test_per_token_advantages_are_averaged_over_the_row(self):
        # [B, T] advantages: row 0 constant 1, row 1 (-3, -1) -> mean -2 (padding garbage
        # ignored): the same loss and gradient as G_ADV.
        adv_tok = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-3.0, -1.0, GARBAGE, -GARBAGE]])
        kwargs = dict(surrogate="gmpo", aggregation="seq-mean-token-mean", **GMPO_CLIP)
        logp_a, old = _inputs(G_LOG_RATIOS, G_MASK)
        logp_b, _ = _inputs(G_LOG_RATIOS, G_MASK)
        loss_a, _ = policy_loss(logp_a, old, G_ADV, G_MASK, **kwargs)
        loss_b, _ = policy_loss(logp_b, old, adv_tok, G_MASK, **kwargs)
        loss_a.backward()
        loss_b.backward()
        close(loss_b.detach(), 0.2941360)
        close(logp_b.grad, logp_a.grad)

    def test_rollout_correction_weights_enter_as_their_arithmetic_mean(self):
        # on policy (logp = pi_old: rho_i = 1, nothing clipped), TIS weights pi_old / mu of
        # 0.5, 2, 1 (row 0, A = +1) and 4, 0.25 (row 1, A = -2); -inf on all padding.
        # corrected_advantages folds w into A and GMPO averages the row's advantages:
        # row 0: 1 * (0.5 + 2 + 1) / 3 = 1.1666667 -> L_0 = -1.1666667
        # row 1: -2 * (4 + 0.25) / 2 = -4.25 -> L_1 = 4.25; seq-mean (L_0 + L_1) / 2 = 1.5416667
        # (verl's geo_mean multiplies by the weights' geometric mean instead, 1 in both rows
        # here: (-1 + 2) / 2 = 0.5). Gradient -A_i mean(w) rho_i / |y_i| / 2 rows:
        # row 0: -1.1666667 / 3 / 2 = -0.1944444; row 1: 4.25 / 2 / 2 = 1.0625
        mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
        keep = mask.bool()
        old = torch.where(keep, torch.full((2, 4), LOG_HALF), -math.inf)
        w = torch.tensor([[0.5, 2.0, 1.0, 1.0], [4.0, 0.25, 1.0, 1.0]])
        behaviour = torch.where(keep, old - w.log(), -math.inf)

        def loss_of(level: str):
            weights, kept = ROLLOUT_CORRECTIONS["tis"](old, behaviour, mask, cap=10.0, level=level)
            adv, loss_mask = corrected_advantages(torch.tensor([1.0, -2.0]), mask, weights, kept)
            logp = old.clone().requires_grad_(True)
            loss, _ = policy_loss(
                logp,
                old,
                adv,
                loss_mask,
                surrogate="gmpo",
                aggregation="seq-mean-token-mean",
                **GMPO_CLIP,
            )
            loss.backward()
            return loss.detach(), logp.grad

        loss, grad = loss_of("token")
        close(loss, 1.5416667)
        close(grad, [[-0.1944444] * 3 + [0.0], [1.0625, 1.0625, 0.0, 0.0]])
        # one weight per row (level="sequence": exp(log 0.5 + log 2 + log 1) = 1 and
        # exp(log 4 + log 0.25) = 1): the arithmetic and geometric means agree, verl's 0.5
        loss, _ = loss_of("sequence")
        close(loss, 0.5)

    def test_matches_a_transcription_of_the_reference_code(self):
        # callsys/GMPO train_zero_math_gmpo.py, one sequence per micro-batch, losses averaged over
        # the batch by gradient accumulation; compared on seeded random rows of lengths 5, 2, 7, 1
        gen = torch.Generator().manual_seed(0)
        lengths = [5, 2, 7, 1]
        mask = torch.zeros(4, 8, dtype=torch.long)
        for row, n in enumerate(lengths):
            mask[row, :n] = 1
        old = -torch.rand(4, 8, generator=gen) - 0.5
        base = old + 0.5 * torch.randn(4, 8, generator=gen)
        adv = torch.tensor([1.5, -0.7, 0.3, -2.0])

        ref_in = base.clone().requires_grad_(True)
        total = 0.0
        for row, n in enumerate(lengths):
            a, cliprange = adv[row].item(), 0.4
            sgn = -1 if a >= 0 else 1
            sgn_diff = sgn * (ref_in[row, :n] - old[row, :n])
            sgn_diff_max = torch.max(sgn_diff, torch.clamp(sgn_diff, -cliprange, cliprange))
            ratio = torch.exp((sgn * sgn_diff_max).sum() / n)
            total = total + (-a * ratio) / len(lengths)
        total.backward()

        ours_in = base.clone().requires_grad_(True)
        loss, _ = policy_loss(
            ours_in,
            old,
            adv,
            mask,
            surrogate="gmpo",
            aggregation="seq-mean-token-mean",
            **GMPO_CLIP,
        )
        loss.backward()
        close(loss.detach(), total.detach())
        close(ours_in.grad, ref_in.grad)
        assert (ours_in.grad == 0).any()  # some token was clipped: the test covers the clip

    def test_zero_advantage_row_has_no_loss_and_no_gradient(self):
        logp, old = _inputs(G_LOG_RATIOS, G_MASK)
        loss, _ = policy_loss(
            logp,
            old,
            torch.tensor([0.0, -2.0]),
            G_MASK,
            surrogate="gmpo",
            aggregation="seq-mean-token-mean",
            **GMPO_CLIP,
        )
        # only L_1 = 1.8096748 counts, / 2 = 0.9048374
        close(loss.detach(), 0.9048374)
        loss.backward()
        close(logp.grad[0], [0.0] * 4)


@pytest.mark.parametrize("surrogate", ["cispo", "gmpo"])
def test_padding_garbage_changes_nothing(surrogate):
    batches = {"cispo": (LOG_RATIOS, MASK, ADV), "gmpo": (G_LOG_RATIOS, G_MASK, G_ADV)}
    log_ratios, mask, adv = batches[surrogate]
    kwargs = dict(surrogate=surrogate, epsilon_low=0.4, epsilon_high=0.2, beta=0.1)
    logp_c, old_c = _inputs(log_ratios, mask, garbage=False)
    logp_d, old_d = _inputs(log_ratios, mask, garbage=True)
    ref_c = old_c.clone()
    ref_d = torch.where(mask.bool(), old_c, -GARBAGE)
    loss_c, m_c = policy_loss(logp_c, old_c, adv, mask, ref_logp=ref_c, **kwargs)
    loss_d, m_d = policy_loss(logp_d, old_d, adv, mask, ref_logp=ref_d, **kwargs)
    loss_c.backward()
    loss_d.backward()
    assert torch.isfinite(loss_d) and torch.isfinite(logp_d.grad).all()
    close(loss_d.detach(), loss_c.detach())
    close(logp_d.grad, logp_c.grad)
    assert m_d == pytest.approx(m_c)


@pytest.mark.parametrize(
    ("surrogate", "aggregation"), [("cispo", "token-mean"), ("gmpo", "seq-mean-token-mean")]
)
def test_micro_batches_add_up_to_the_batch(surrogate, aggregation):
    # 4 rows of lengths 3, 1, 2, 4 (10 tokens) split 2 + 2 and 1 + 3; with the whole batch's
    # divisor (10 tokens, 4 sequences) the micro-batch losses add up to the full-batch loss.
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    old = -torch.rand(4, 4, generator=gen) - 0.5
    base = old + 0.3 * torch.randn(4, 4, generator=gen)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    kwargs = dict(surrogate=surrogate, aggregation=aggregation, epsilon_low=0.1, epsilon_high=0.15)
    full_in = base.clone().requires_grad_(True)
    full, _ = policy_loss(full_in, old, adv, mask, **kwargs)
    full.backward()
    for split in (2, 1):
        parts_in = base.clone().requires_grad_(True)
        total = 0.0
        for rows in (slice(0, split), slice(split, 4)):
            part, _ = policy_loss(
                parts_in[rows],
                old[rows],
                adv[rows],
                mask[rows],
                num_tokens=10,  # token-mean's divisor
                num_seqs=4,  # seq-mean-token-mean's
                **kwargs,
            )
            total = total + part
        total.backward()
        close(total.detach(), full.detach())
        close(parts_in.grad, full_in.grad)


def test_policy_loss_refuses_what_a_surrogate_cannot_take():
    logp = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="unknown surrogate 'pgo'"):
        policy_loss(logp, logp, ADV, MASK, surrogate="pgo")
    with pytest.raises(ValueError, match="ratio_level must be token with surrogate=gmpo"):
        policy_loss(logp, logp, ADV, MASK, surrogate="gmpo", ratio_level="sequence")
    with pytest.raises(ValueError, match="clip_ratio_c is PPO-clip's dual clip"):
        policy_loss(logp, logp, ADV, MASK, surrogate="cispo", clip_ratio_c=3.0)


# ----------------------------------------------------------------------------- the switch


def test_build_plan_passes_each_surrogate_its_own_clips():
    expected = {
        PPOClip(epsilon_high=0.28, clip_ratio_c=3.0): (0.2, 0.28, 3.0),
        CISPO(): (1.0, 4.0, None),
        GMPO(epsilon_low=0.3): (0.3, 0.4, None),
    }
    for surrogate, clip in expected.items():
        keywords = build_plan(GRPOConfig(max_new_tokens=8, surrogate=surrogate)).loss_fn.keywords
        assert keywords["surrogate"] == surrogate.name
        assert (keywords["epsilon_low"], keywords["epsilon_high"], keywords["clip_ratio_c"]) == clip


def _plan_loss(surrogate, aggregation, log_ratios=LOG_RATIOS, mask=MASK, adv=ADV):
    """The loss and gradient of the step's own loss function (`build_plan`) for `surrogate`."""
    config = GRPOConfig(max_new_tokens=8, surrogate=surrogate, aggregation=aggregation)
    logp, old = _inputs(log_ratios, mask)
    loss, _ = build_plan(config).loss_fn(logp, old, adv, mask)
    loss.backward()
    return loss.detach(), logp.grad


def test_each_surrogate_config_reaches_policy_loss_with_its_clips():
    # CISPO(epsilon_low=1.0, epsilon_high=0.2) on the CISPO batch: TestCISPO's hand values,
    # loss 0.8856934 / 4 = 0.2214234, every token a gradient -w * A / 4
    loss, grad = _plan_loss(CISPO(epsilon_low=1.0, epsilon_high=0.2), "token-mean")
    close(loss, 0.2214234)
    close(grad, [[-0.3, -0.2262094, -0.3, 0.0], [0.2762927, 0.0, 0.0, 0.0]])
    # PPOClip with the same clips and a dual clip of 3 (inactive: row 1's loss 1.1051709 < 3):
    # per token -min(r A, clip(r, 0, 1.2) A) = -1.2, -0.9048374, -1.2 (row 0, A = +1) and
    # 1.1051709 (row 1, A = -1); sum -2.1996665, token-mean / 4 = -0.5499166; the clipped
    # tokens (0,0), (0,2) get no gradient, the others -A r / 4
    ppo = PPOClip(epsilon_low=1.0, epsilon_high=0.2, clip_ratio_c=3.0)
    loss, grad = _plan_loss(ppo, "token-mean")
    close(loss, -0.5499166)
    close(grad, [[0.0, -0.2262094, 0.0, 0.0], [0.2762927, 0.0, 0.0, 0.0]])
    # GMPO's defaults (0.4, 0.4) on TestGMPO's batch: (-1.2214028 + 1.8096748) / 2 = 0.2941360
    loss, grad = _plan_loss(GMPO(), "seq-mean-token-mean", G_LOG_RATIOS, G_MASK, G_ADV)
    close(loss, 0.2941360)
    g0, g1 = -0.1526754, 0.4524187
    close(grad, [[g0, g0, 0.0, g0], [0.0, g1, 0.0, 0.0]])
    # GMPO(epsilon_high=0.3): row 0's log-ratios capped at 0.3: 0.3, -0.1, 0.3, 0.2, mean 0.175,
    # rho_0 = exp(0.175) = 1.1912462, L_0 = -1.1912462; (L_0 + 1.8096748) / 2 = 0.3092143
    loss, _ = _plan_loss(GMPO(epsilon_high=0.3), "seq-mean-token-mean", G_LOG_RATIOS, G_MASK, G_ADV)
    close(loss, 0.3092143)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"surrogate": GMPO(), "ratio_level": "sequence"}, "ratio_level must be token"),
        ({"surrogate": CISPO(epsilon_high=-1.0)}, "surrogate.epsilon_high must be >= 0"),
        ({"surrogate": PPOClip(epsilon_low=-0.1)}, "surrogate.epsilon_low must be >= 0"),
        ({"surrogate": PPOClip(epsilon_low=1.5)}, "surrogate.epsilon_low must be <= 1"),
        ({"surrogate": "cispo"}, "surrogate must be one of ppo-clip, cispo, gmpo"),
    ],
)
def test_config_check_names_the_field(changes, message):
    config = GRPOConfig(max_new_tokens=8, **changes)
    with pytest.raises(ValueError) as info:
        check_grpo_config(config)
    text = str(info.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"surrogate": {"name": "cispo", "clip_ratio_c": 3.0}},
            "grpo.surrogate.clip_ratio_c belongs to ppo-clip, not cispo: set name: ppo-clip",
        ),
        (
            {"surrogate": {"name": "pgo"}},
            "grpo.surrogate.name: unknown 'pgo'; choose one of: ppo-clip, cispo, gmpo",
        ),
        ({"surrogate": "pgo"}, "grpo.surrogate.name: unknown 'pgo'; choose one of: ppo-clip"),
        ({"surrogate": {"epsilon_high": 0.3}}, "grpo.surrogate: say which one with name"),
        (
            {"cispo_epsilon_high": 0.3},
            "grpo: 'cispo_epsilon_high' was renamed: write surrogate.epsilon_high (surrogate: "
            "{name: cispo",
        ),
        (  # the two layouts mixed: the flat name is refused, naming its place
            {"surrogate": {"name": "ppo-clip"}, "epsilon_high": 0.3},
            "grpo: 'epsilon_high' was renamed: write surrogate.epsilon_high",
        ),
    ],
)
def test_yaml_surrogate_errors_are_one_line_naming_the_field(data, message):
    with pytest.raises(ConfigError) as info:
        from_dict(GRPOConfig, data, where="grpo")
    text = str(info.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        (["surrogate.clip_ratio_c=3"], "surrogate.clip_ratio_c belongs to ppo-clip, not cispo"),
        (["surrogate=pgo"], "surrogate: unknown 'pgo'; choose one of: ppo-clip, cispo, gmpo"),
        (["surrogate.name=pgo"], "surrogate.name: unknown 'pgo'"),
        (["cispo_epsilon_low=0.5"], "'cispo_epsilon_low' was renamed: write surrogate"),
    ],
)
def test_set_surrogate_errors_are_one_line_naming_the_field(assignments, message):
    with pytest.raises(ConfigError) as info:
        apply_overrides(GRPOConfig(surrogate=CISPO()), assignments)
    text = str(info.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    "surrogate",
    [PPOClip(epsilon_high=0.28, clip_ratio_c=3.0), CISPO(epsilon_high=2.0), GMPO(epsilon_low=0.3)],
)
def test_yaml_and_set_round_trips_of_each_surrogate(surrogate):
    config = GRPOConfig(surrogate=surrogate)
    data = to_dict(config)
    assert data["surrogate"]["name"] == surrogate.name
    assert from_dict(GRPOConfig, yaml.safe_load(yaml.safe_dump(data))) == config
    # --set: the name first (its defaults), then each clip as text
    fields = [f.name for f in dataclasses.fields(surrogate) if f.name != "name"]
    text = [f"surrogate={surrogate.name}"]
    text += [f"surrogate.{f}={getattr(surrogate, f)}" for f in fields]
    assert apply_overrides(GRPOConfig(), text) == config
    # a name alone is that surrogate's defaults; a clip alone changes the current one
    assert (
        apply_overrides(GRPOConfig(), [f"surrogate={surrogate.name}"]).surrogate
        == type(surrogate)()
    )
    changed = apply_overrides(config, ["surrogate.epsilon_high=0.5"]).surrogate
    assert changed == dataclasses.replace(surrogate, epsilon_high=0.5)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], PPOClip()),
        (["--grpo.surrogate.epsilon-high", "0.28"], PPOClip(epsilon_high=0.28)),
        (["grpo.surrogate:cispo"], CISPO()),
        (["grpo.surrogate:cispo", "--grpo.surrogate.epsilon-high", "2"], CISPO(epsilon_high=2.0)),
        (["grpo.surrogate:gmpo", "--grpo.surrogate.epsilon-low", "0.3"], GMPO(epsilon_low=0.3)),
        (["cispo", "--grpo.surrogate.epsilon-high", "2"], CISPO(epsilon_high=2.0)),
        (
            ["cispo", "grpo.surrogate:ppo-clip", "--grpo.surrogate.clip-ratio-c", "3"],
            PPOClip(clip_ratio_c=3.0),
        ),
        (["gmpo", "--grpo.lr", "0.01"], GMPO()),
    ],
)
def test_cli_spells_each_surrogate(argv, expected):
    from rlvr.cli import parse_lab
    from rlvr.pipelines.lab import resolve

    config = parse_lab([*argv, "--grpo.steps", "1"])
    assert config.grpo.surrogate == expected
    assert resolve(config).grpo.surrogate == expected  # the recipe does not fill it back


def test_cli_refuses_a_clip_the_surrogate_lacks(capsys):
    from tests.test_cli import cli_error

    message = cli_error(["train", "cispo", "--grpo.surrogate.clip-ratio-c", "3.0"], capsys)
    assert "--grpo.surrogate.clip-ratio-c" in message
    message = cli_error(["train", "grpo.surrogate:pgo"], capsys)
    assert "grpo.surrogate:pgo" in message


# ----------------------------------------------------------------------------- the recipes


def test_recipes_resolve():
    cispo, gmpo = recipe_config("cispo"), recipe_config("gmpo")
    assert (cispo.surrogate, cispo.aggregation, cispo.beta) == (CISPO(), "token-mean", 0.0)
    assert (cispo.surrogate.epsilon_low, cispo.surrogate.epsilon_high) == (1.0, 4.0)  # [0, 5]
    assert (gmpo.surrogate, gmpo.aggregation, gmpo.beta) == (GMPO(), "seq-mean-token-mean", 0.0)
    assert (gmpo.surrogate.epsilon_low, gmpo.surrogate.epsilon_high) == (0.4, 0.4)
    for name in ("cispo", "gmpo"):
        assert name in RECIPES and f"surrogate: {{name: {name}," in describe_recipe(name)
        check_grpo_config(dataclasses.replace(recipe_config(name), max_new_tokens=48))


def test_two_training_steps_of_each_recipe(tmp_path):
    # On-policy with one pass (mu = 1) every ratio is 1, no clip is active, and both surrogates'
    # gradients reduce to the policy gradient -A * grad logp: CISPO's (weight 1) equals
    # PPO-clip's with token-mean, GMPO's (d rho_i / d logp_t = rho_i / |y_i| = 1 / |y_i|) equals
    # PPO-clip's with seq-mean-token-mean. So the two seeded steps' gradient norms must match
    # those runs. GMPO's loss value is also PPO's (-mean_i A_i * 1, ~0 for centred advantages);
    # CISPO's (-sum A * logp / N) is not PPO's (-sum A * 1 / N).
    from tests.test_grpo_step_pinned import BASE, run_two_steps

    runs = {
        "cispo": run_two_steps(recipe_config("cispo", BASE), tmp_path / "cispo"),
        "ppo-token-mean": run_two_steps(BASE, tmp_path / "ppo-tm"),
        "gmpo": run_two_steps(recipe_config("gmpo", BASE), tmp_path / "gmpo"),
        "ppo-seq-mean": run_two_steps(
            dataclasses.replace(BASE, aggregation="seq-mean-token-mean"), tmp_path / "ppo-sm"
        ),
    }
    for name, ppo in (("cispo", "ppo-token-mean"), ("gmpo", "ppo-seq-mean")):
        assert len(runs[name]) == 2
        for ours, theirs in zip(runs[name], runs[ppo]):
            assert math.isfinite(ours["loss"]) and ours["grad_norm"] > 0
            assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)
            assert ours["reward/mean"] == theirs["reward/mean"]
    for ours, theirs in zip(runs["gmpo"], runs["ppo-seq-mean"]):
        assert ours["loss"] == pytest.approx(theirs["loss"], abs=1e-6)
    for ours, theirs in zip(runs["cispo"], runs["ppo-token-mean"]):
        assert abs(ours["loss"] - theirs["loss"]) > 0.1


def test_a_config_of_the_flat_layout_loads_into_the_surrogates_config():
    # as rlvr wrote config.yaml before the grouping: every surrogate's clips, flat
    flat = {"surrogate": "cispo", "epsilon_low": 0.2, "epsilon_high": 0.2, "clip_ratio_c": None}
    flat |= {"cispo_epsilon_low": 0.5, "cispo_epsilon_high": 2.0}
    flat |= {"gmpo_epsilon_low": 0.4, "gmpo_epsilon_high": 0.4}
    assert from_dict(GRPOConfig, flat).surrogate == CISPO(epsilon_low=0.5, epsilon_high=2.0)
    assert from_dict(GRPOConfig, {"epsilon_high": 0.3}).surrogate == PPOClip(epsilon_high=0.3)
    # another surrogate's clip set away from its default was never a setting: refused
    with pytest.raises(ConfigError, match="'gmpo_epsilon_low' was renamed"):
        from_dict(GRPOConfig, {"surrogate": "cispo", "gmpo_epsilon_low": 0.1})
