"""`rlvr.train.loss_checks`: every built-in recipe passes; injected masked-mean bugs fail the
check that should catch them; the checks' own formulas against hand-computed values."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from rlvr import algo
from rlvr.config import ConfigError
from rlvr.train import update
from rlvr.train.config import Distill, GRPOConfig
from rlvr.train.loss_checks import (
    CheckResult,
    aggregate_micro_batch_mean,
    aggregate_padded_width_mean,
    check_loss,
    dr_grpo_gradient,
    format_check_results,
    group_centred,
    relative_difference,
    rloo_expected,
)
from rlvr.train.recipes import RECIPES, recipe_config
from tests.helpers import close

SPLIT = "split: micro-batches"
RANKS = "split: 2 ranks"
DR_GRPO = "Dr. GRPO denominator"
RLOO = "RLOO = n/(n-1) x centred"
ZERO_VARIANCE = "zero-variance groups"
PADDING = "padding: garbage, width"
PADDING_NAN = "padding: NaN/inf"


def _statuses(config: GRPOConfig) -> dict[str, str]:
    return {r.name: r.status for r in check_loss(config)}


@pytest.mark.parametrize("forward", ["auto", "packed"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_every_builtin_recipe_passes(name, forward):
    """Every identity holds for every recipe, with the default forward and packed."""
    results = check_loss(dataclasses.replace(recipe_config(name), forward=forward))
    assert not [r for r in results if r.failed], format_check_results(results)
    statuses = {r.name: r.status for r in results}
    # the checks that concern every config ran and passed (none was skipped as n/a)
    assert {statuses[k] for k in (SPLIT, RANKS, PADDING, PADDING_NAN)} == {"pass"}
    if name == "rloo":
        assert statuses[RLOO] == "pass"
    if name == "dr_grpo":
        assert statuses[DR_GRPO] == "pass"


def test_the_default_config_passes_and_says_why_the_others_do_not_apply():
    results = {r.name: r for r in check_loss(GRPOConfig())}
    assert [r.status for r in results.values()] == ["pass", "pass", "n/a", "n/a"] + ["pass"] * 3
    assert "aggregation=token-mean" in results[DR_GRPO].detail
    assert "advantage_estimator=grpo" in results[RLOO].detail
    assert "tol 1e-05" in results[SPLIT].detail  # the numbers and the tolerance are shown


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum-norm"])
def test_a_padded_width_divisor_fails_the_split_and_padding_checks(monkeypatch, aggregation):
    monkeypatch.setitem(algo.AGGREGATIONS, aggregation, aggregate_padded_width_mean)
    statuses = _statuses(GRPOConfig(aggregation=aggregation))
    assert statuses[SPLIT] == statuses[RANKS] == statuses[PADDING] == "FAIL"
    if aggregation == "seq-mean-token-sum-norm":
        assert statuses[DR_GRPO] == "FAIL"


def test_a_per_micro_batch_mean_fails_the_split_checks_only(monkeypatch):
    monkeypatch.setitem(algo.AGGREGATIONS, "token-mean", aggregate_micro_batch_mean)
    statuses = _statuses(GRPOConfig())
    assert statuses[SPLIT] == statuses[RANKS] == "FAIL"
    # one pass is right (its own token mean), so padding, however wide, changes nothing
    assert statuses[PADDING] == statuses[PADDING_NAN] == "pass"


def test_a_trainer_that_drops_the_step_divisors_fails_the_split_checks(monkeypatch):
    """The bug in the update, not the formula: micro-batches divide by their own counts."""
    plan = update.plan_update_work

    def own_counts(*args, **kwargs):
        return dataclasses.replace(plan(*args, **kwargs), divisors={})

    monkeypatch.setattr(update, "plan_update_work", own_counts)
    statuses = _statuses(GRPOConfig())
    assert statuses[SPLIT] == statuses[RANKS] == "FAIL"


def test_a_per_length_denominator_fails_the_dr_grpo_check(monkeypatch):
    monkeypatch.setitem(
        algo.AGGREGATIONS, "seq-mean-token-sum-norm", algo.aggregate_seq_mean_token_mean
    )
    statuses = _statuses(recipe_config("dr_grpo"))
    assert statuses[DR_GRPO] == "FAIL"
    assert statuses[SPLIT] == "pass"  # a wrong denominator, but still split-invariant


def test_a_wrong_baseline_fails_the_rloo_and_zero_variance_checks(monkeypatch):
    monkeypatch.setitem(algo.ADVANTAGE_ESTIMATORS, "rloo", algo.advantages_reinforce_pp)
    statuses = _statuses(recipe_config("rloo"))
    assert statuses[RLOO] == statuses[ZERO_VARIANCE] == "FAIL"


def test_arithmetic_on_padding_before_the_mask_fails_the_nan_check_only(monkeypatch):
    """A loss that multiplies padding by 0 instead of selecting it away: finite garbage is
    harmless, NaN is not."""
    policy_loss = algo.policy_loss

    def multiplied(logp, old_logp, advantages, mask, **kwargs):
        loss, metrics = policy_loss(logp, old_logp, advantages, mask, **kwargs)
        return loss + 0.0 * ((1 - mask) * logp).sum(), metrics

    monkeypatch.setattr(algo, "policy_loss", multiplied)
    statuses = _statuses(GRPOConfig())
    assert statuses[PADDING_NAN] == "FAIL"
    assert statuses[PADDING] == statuses[SPLIT] == "pass"


def test_a_check_that_compares_only_zero_gradients_fails_rather_than_passes(monkeypatch):
    def no_signal(rewards, group_ids, **kwargs):
        return torch.zeros_like(rewards)

    monkeypatch.setitem(algo.ADVANTAGE_ESTIMATORS, "grpo", no_signal)
    results = {r.name: r for r in check_loss(GRPOConfig())}
    for name in (SPLIT, RANKS, PADDING, PADDING_NAN):
        assert results[name].failed and "nothing was compared" in results[name].detail


def test_the_rank_check_is_not_applicable_inside_a_running_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        result = {r.name: r for r in check_loss(GRPOConfig())}[RANKS]
    finally:
        dist.destroy_process_group()
    assert result.status == "n/a" and not result.failed
    assert "process group is running already" in result.detail


def test_check_loss_leaves_the_global_random_state_alone_and_refuses_bad_configs():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    check_loss(GRPOConfig(aggregation="seq-mean-token-mean"))
    close(torch.rand(3), expected, atol=0)
    with pytest.raises(ConfigError, match="aggregation must be one of"):
        check_loss(GRPOConfig(aggregation="padded-mean"))


# --- the checks' own formulas, by hand ----------------------------------------------------


def test_rloo_expected_is_n_over_n_minus_1_times_the_centred_reward():
    # one group of n = 4, rewards [1, 0, 0, 1]: mean 0.5, centred [.5, -.5, -.5, .5], x 4/3;
    # the leave-one-out form agrees: 1 - (0 + 0 + 1) / 3 = 2/3, 0 - (1 + 0 + 1) / 3 = -2/3
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    ids = torch.zeros(4, dtype=torch.long)
    close(rloo_expected(rewards, ids), [2 / 3, -2 / 3, -2 / 3, 2 / 3], 1e-15, dtype=torch.float64)
    # groups of 3 and 1: [3, 0, 0] has mean 1, centred [2, -1, -1], x 3/2; a group of one: 0
    rewards = torch.tensor([3.0, 0.0, 0.0, 5.0], dtype=torch.float64)
    ids = torch.tensor([7, 7, 7, 2])
    close(group_centred(rewards, ids), [2.0, -1.0, -1.0, 0.0], 1e-15, dtype=torch.float64)
    close(rloo_expected(rewards, ids), [3.0, -1.5, -1.5, 0.0], 1e-15, dtype=torch.float64)
    # and it is what the trainer's RLOO estimator computes
    close(algo.advantages_rloo(rewards, ids), [3.0, -1.5, -1.5, 0.0], 1e-15, dtype=torch.float64)


def test_dr_grpo_gradient_by_hand_with_padding():
    # N = 2 rows, max_len = 4: every token weighs 1 / (4 x 2) = 1/8, times -A of its row
    advantages = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    expected = [[-1 / 8, -1 / 8, 0.0], [2 / 8, 0.0, 0.0]]
    close(dr_grpo_gradient(advantages, mask, max_len=4), expected, 1e-15, dtype=torch.float64)
    # and it is the gradient of the real aggregation at ratio 1 (per_token = -A * exp(0))
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    per_token = -advantages[:, None] * torch.exp(logp)
    algo.aggregate_seq_mean_token_sum_norm(per_token, mask, max_len=4).backward()
    close(logp.grad, expected, 1e-15, dtype=torch.float64)


def test_the_wrong_aggregations_by_hand_with_padding():
    # rows [1, 2 | pad] and [3 | pad pad]; the padding holds 99 (selected away either way)
    per_token = torch.tensor([[1.0, 2.0, 99.0], [3.0, 99.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    close(algo.aggregate_token_mean(per_token, mask), 6 / 3)  # right: 3 tokens
    close(aggregate_padded_width_mean(per_token, mask), 6 / 6)  # 2 rows x width 3
    wide = torch.cat([per_token, torch.full((2, 3), 99.0)], dim=1)
    close(aggregate_padded_width_mean(wide, torch.cat([mask, torch.zeros(2, 3)], 1)), 6 / 12)
    close(aggregate_micro_batch_mean(per_token, mask), 2.0)  # one micro-batch: right
    close(aggregate_micro_batch_mean(per_token, mask, num_seqs=4), 2.0 * 2 / 4)
    # a step of two micro-batches: [1 2 3 4] (4 tokens) and [10 | pad pad pad] (1 token);
    # right: (1 + 2 + 3 + 4 + 10) / 5 = 4.0; per micro-batch: 2.5 * 1/2 + 10 * 1/2 = 6.25
    first, second = torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[10.0, 7.0, 7.0, 7.0]])
    full, one = torch.ones(1, 4), torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    parts = ((first, full), (second, one))
    right = sum(algo.aggregate_token_mean(x, m, num_tokens=5) for x, m in parts)
    wrong = sum(aggregate_micro_batch_mean(x, m, num_tokens=5, num_seqs=2) for x, m in parts)
    close(right, 4.0)
    close(wrong, 6.25)


def test_relative_difference_by_hand():
    assert relative_difference(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0])) == 0.25
    assert relative_difference(torch.tensor([0.5, 0.0]), torch.zeros(2)) == 0.5  # plain
    assert relative_difference(torch.tensor([float("nan"), 2.0]), torch.ones(2)) == float("inf")


def test_format_check_results_table_and_what_counts_as_failed():
    results = [
        CheckResult("a check", True, "d = 0 (tol 1e-12)"),
        CheckResult("another", False, "d = 0.5 (tol 1e-05)"),
        CheckResult("rloo", False, "advantage_estimator=grpo", applicable=False),
    ]
    assert [r.failed for r in results] == [False, True, False]
    assert format_check_results(results).splitlines() == [
        "check    result  detail",
        "a check  pass    d = 0 (tol 1e-12)",
        "another  FAIL    d = 0.5 (tol 1e-05)",
        "rloo     n/a     advantage_estimator=grpo",
        "1 pass, 1 FAIL, 1 n/a",
    ]


def test_the_check_loss_command_prints_the_table_and_exits_1_on_a_failure(capsys, monkeypatch):
    from rlvr.cli import main
    from rlvr.train import loss_checks

    main(["check-loss", "--recipe", "rloo"])
    out = capsys.readouterr().out
    assert "RLOO = n/(n-1) x centred  pass" in out and "0 FAIL" in out

    failing = [loss_checks.CheckResult("split: micro-batches", False, "off by 2x")]
    monkeypatch.setattr(loss_checks, "check_loss", lambda config, seed=0: failing)
    with pytest.raises(SystemExit) as exit_info:
        main(["check-loss"])
    assert exit_info.value.code == 1 and "FAIL" in capsys.readouterr().out


def test_a_config_with_a_teacher_is_checked_without_it_and_says_so(tmp_path):
    from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
    from rlvr.train.loss_checks import check_loss
    from rlvr.train.recipes import recipe_config

    tokenizer = build_char_tokenizer()
    shape = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    teacher = save_model(build_tiny_model(shape, tokenizer, seed=0), tokenizer, tmp_path / "t")
    config = dataclasses.replace(recipe_config("opd"), distill=Distill(teacher=str(teacher)))
    results = check_loss(config)
    assert results[0].name == "distillation advantages" and results[0].status == "n/a"
    assert not any(r.failed for r in results)
