import copy
import dataclasses

import pytest
import torch

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.step_time import format_step_time, step_time_split
from rlvr.report.timer import STEP_PARTS, StepTimer
from rlvr.rollout.engine import HFEngine
from rlvr.tasks.arithmetic import ArithmeticTaskConfig, train_problems
from rlvr.train.config import GRPOConfig, generation_threads
from rlvr.train.grpo import build_trainer, grpo_step
from rlvr.train.monitor import monitor_hacking
from rlvr.train.update import (
    BUCKET_COST_TOKENS,
    PACKED_TOKEN_COST,
    forward_cost,
    group_micro_batches,
    packed_micro_batches,
    plan_update,
    token_budget_micro_batches,
    tokens_computed,
    trimmed_rows,
)
from rlvr.verifiers.math import math_reward


def test_micro_batches_respect_the_padded_token_budget_and_cover_every_row():
    prompt = torch.tensor([4, 4, 2, 3, 4, 1])
    completion = torch.tensor([6, 1, 9, 2, 3, 3])
    parts = token_budget_micro_batches(prompt, completion, max_tokens=16)
    # rows by total length: 2 (11), 0 (10), 3 (5) ... ; two rows of width >= 8 exceed 16
    assert sorted(torch.cat(parts).tolist()) == list(range(6))
    for rows in parts:
        width = int(prompt[rows].max() + completion[rows].max())
        assert len(rows) * width <= 16 or len(rows) == 1
    assert parts[0].tolist() == [2]  # the longest row (2 + 9) first, alone
    assert token_budget_micro_batches(prompt, completion, 0)[0].tolist() == list(range(6))


def test_trimmed_rows_cut_padding_columns_only():
    prompt_ids = torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9]])  # left-padded
    prompt_mask = (prompt_ids != 0).long()
    completion_mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 0]])
    per_token = torch.arange(8.0).view(2, 4)
    p_ids, p_mask, c_mask, values, adv = trimmed_rows(
        torch.tensor([0]),
        prompt_ids,
        prompt_mask,
        completion_mask,
        per_token,
        torch.tensor([3.0, 4]),
    )
    assert p_ids.tolist() == [[5, 6]] and p_mask.tolist() == [[1, 1]]
    assert c_mask.tolist() == [[1, 1]] and values.tolist() == [[0, 1]] and adv.tolist() == [3.0]


def _trainer(config: GRPOConfig, reward_fn, seed: int = 0):
    """A trainer on a fresh 2-layer tiny model; one update worker unless `cpu_workers` says,
    one sampling thread whatever it says."""
    tokenizer = build_char_tokenizer()
    policy = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), tokenizer, seed=0)
    problems = train_problems(ArithmeticTaskConfig(digits=2), seed=0)
    rows = ({"prompt": p.prompt, "answer": p.answer} for p in problems)
    config = dataclasses.replace(config, cpu_workers=config.cpu_workers or 1)
    engine = HFEngine(policy, tokenizer)
    return build_trainer(policy, tokenizer, rows, [reward_fn], config, seed, engine=engine)


def _step(t):
    return grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())


def _one_step(config: GRPOConfig, seed: int = 0):
    t = _trainer(config, _length_reward, seed)
    return t.state.policy, _step(t).metrics


def _length_reward(prompts, completions, **_):
    """Rewards that differ within groups (a random model is never right on arithmetic)."""
    return [len(c) % 3 / 2 for c in completions]


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batched_update_equals_one_pass(aggregation):
    base = GRPOConfig(
        prompts_per_step=4,
        group_size=4,
        max_new_tokens=12,
        lr=1e-2,
        aggregation=aggregation,
        beta=0.05,
    )
    whole, m_whole = _one_step(base)
    split, m_split = _one_step(dataclasses.replace(base, micro_batch_tokens=40))
    assert m_whole["update/micro_batches"] == 1 and m_split["update/micro_batches"] > 2
    assert m_whole["loss"] == pytest.approx(m_split["loss"], abs=1e-5)
    assert m_whole["policy/clip_frac"] == pytest.approx(m_split["policy/clip_frac"], abs=1e-6)
    # the accumulated gradients (kept after the step) equal one pass's; Adam's first step is
    # sign-like, so the weights themselves would amplify float noise in near-zero entries
    for a, b in zip(whole.parameters(), split.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)


def test_group_micro_batches_keep_groups_whole_within_the_budget():
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3])
    prompt = torch.tensor([2, 2, 3, 3, 3, 1, 1, 2])
    completion = torch.tensor([4, 6, 2, 3, 1, 9, 2, 1])
    parts = group_micro_batches(groups, prompt, completion, max_tokens=24)
    assert sorted(torch.cat(parts).tolist()) == list(range(8))
    for rows in parts:
        members = set(rows.tolist())
        for g in set(groups[rows].tolist()):  # a group is all in or all out
            assert set((groups == g).nonzero().squeeze(1).tolist()) <= members
        width = int(prompt[rows].max() + completion[rows].max())
        assert len(rows) * width <= 24 or len(set(groups[rows].tolist())) == 1
    # longest row first: group 2 (1 + 9) is 2 rows x 10; adding group 0 gives 4 rows x 11 > 24
    assert parts[0].tolist() == [5, 6]
    assert group_micro_batches(groups, prompt, completion, 0)[0].tolist() == list(range(8))


PADDED_OR_SHARED = ("padded", "shared-prompt")


def test_update_plan_shares_prompts_only_when_that_runs_fewer_tokens():
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    prompt = torch.tensor([10, 10, 10, 10, 10, 10])
    even = torch.tensor([5, 5, 6, 6, 5, 5])  # a prompt per group saves 4 x 10 prompt tokens
    shards, forward = plan_update(torch.arange(6), groups, prompt, even, 2, 100, PADDED_OR_SHARED)
    assert forward == "shared-prompt" and len(shards) == 2
    assert [sorted(groups[torch.cat(s)].tolist()) for s in shards] == [[0, 0, 0], [1, 1, 1]]
    # within each group one row is 60 tokens long: whole groups would pad every row to 60
    uneven = torch.tensor([60, 1, 1, 60, 1, 1])
    shards, forward = plan_update(torch.arange(6), groups, prompt, uneven, 1, 100, PADDED_OR_SHARED)
    assert forward == "padded"
    rows_plan = [p for s in shards for p in s]
    assert tokens_computed("padded", rows_plan, groups, prompt, uneven) < tokens_computed(
        "shared-prompt", [torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])], groups, prompt, uneven
    )
    shards, forward = plan_update(torch.arange(6), groups, prompt, even, 1, 100, ("padded",))
    assert forward == "padded" and sorted(torch.cat(shards[0]).tolist()) == list(range(6))


def test_update_plan_packs_where_padding_costs_more_than_packing():
    """The cost model (padded tokens; a packed token at PACKED_TOKEN_COST, each distinct
    length of a packed micro-batch at BUCKET_COST_TOKENS) picks packed for uneven rows, padded
    for rows of one length, and says how much of what it computes is padding."""
    groups = torch.arange(8)
    prompt = torch.full((8,), 10)
    uneven = torch.tensor([200, 10, 10, 10, 10, 10, 10, 10])
    # padded: 8 x 210 = 1680; packed: 1.1 x (80 + 270) + 40 x 2 lengths = 465
    assert forward_cost("padded", [torch.arange(8)], groups, prompt, uneven) == 1680
    assert forward_cost("packed", [torch.arange(8)], groups, prompt, uneven) == pytest.approx(
        PACKED_TOKEN_COST * 350 + BUCKET_COST_TOKENS * 2
    )
    every = ("padded", "shared-prompt", "packed")
    _, forward = plan_update(groups, groups, prompt, uneven, 1, 0, every)
    assert forward == "packed"
    even = torch.full((8,), 30)  # no padding to save: packing only adds its overhead
    _, forward = plan_update(groups, groups, prompt, even, 1, 0, every)
    assert forward == "padded"


def test_packed_micro_batches_fill_by_real_tokens_and_never_drop_a_long_row():
    lengths = torch.tensor([50, 10, 30, 200, 20, 40])
    parts = packed_micro_batches(lengths, max_tokens=60)
    assert sorted(torch.cat(parts).tolist()) == list(range(6))
    assert [3] in [p.tolist() for p in parts]  # longer than the budget: a micro-batch alone
    for part in parts:
        assert int(lengths[part].sum()) <= 60 or len(part) == 1
    assert len(parts) == 4  # 200 | 50+10 | 40+20 | 30
    assert packed_micro_batches(lengths, 0)[0].tolist() == list(range(6))


@pytest.mark.parametrize("forward", ["padded", "shared-prompt", "packed"])
def test_every_forward_gives_one_passs_loss_and_gradient(forward):
    """A step run with each forward, in micro-batches, equals one padded pass over the batch;
    the metrics name the forward and its padding (none when packed)."""
    base = GRPOConfig(
        prompts_per_step=4, group_size=4, max_new_tokens=12, lr=1e-2, forward="padded", beta=0.05
    )
    whole, m_whole = _one_step(base)
    other, m_other = _one_step(dataclasses.replace(base, forward=forward, micro_batch_tokens=80))
    assert m_other["update/micro_batches"] >= 2
    assert m_other["update/packed"] == float(forward == "packed")
    assert m_other["update/shared_prompts"] == float(forward == "shared-prompt")
    assert (m_other["update/padding_frac"] == 0.0) == (forward == "packed")
    assert m_other["loss"] == pytest.approx(m_whole["loss"], abs=1e-5)
    for a, b in zip(whole.parameters(), other.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_update_with_shared_prompt_forward_equals_per_row_prompts(aggregation):
    base = GRPOConfig(
        prompts_per_step=4,
        group_size=4,
        max_new_tokens=12,
        lr=1e-2,
        aggregation=aggregation,
        forward="padded",
        beta=0.05,
    )
    rows, m_rows = _one_step(base)
    shared, m_shared = _one_step(
        dataclasses.replace(base, forward="shared-prompt", micro_batch_tokens=80)
    )
    assert m_shared["update/micro_batches"] >= 2
    assert m_shared["update/shared_prompts"] == 1.0 and m_rows["update/shared_prompts"] == 0.0
    assert m_rows["loss"] == pytest.approx(m_shared["loss"], abs=1e-5)
    for a, b in zip(rows.parameters(), shared.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)


def test_update_shared_by_two_worker_threads_equals_one_pass():
    base = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=12, lr=1e-2, beta=0.05)
    whole, m_whole = _one_step(base)  # one torch thread: one worker, one pass
    shared, m_shared = _one_step(dataclasses.replace(base, cpu_workers=2, micro_batch_tokens=40))
    assert m_shared["update/micro_batches"] > 2
    assert m_whole["loss"] == pytest.approx(m_shared["loss"], abs=1e-5)
    assert m_whole["policy/approx_kl"] == pytest.approx(m_shared["policy/approx_kl"], abs=1e-6)
    for a, b in zip(whole.parameters(), shared.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)
    assert m_shared["time/forward_s"] > 0 and m_shared["time/backward_s"] > 0


def test_workers_default_to_the_torch_threads_on_a_cpu():
    from rlvr.workers import balanced_shards, default_workers

    model = torch.nn.Linear(2, 2)
    assert default_workers(model, requested=3) == 3
    assert default_workers(model, threads=2) == 2
    # longest first, each to the least loaded: 9 | 5 + 1 | 4 + 3
    assert balanced_shards([5, 9, 1, 4, 3], 3) == [[1], [0, 2], [3, 4]]
    assert balanced_shards([5.0], 2) == [[0]]


def test_step_time_split_adds_up_and_beta_zero_skips_the_reference():
    t = _trainer(GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=12), _length_reward)
    m = _step(t).metrics
    parts = sum(m.get(f"time/{k}_s", 0.0) for k in STEP_PARTS) + m["time/other_s"]
    assert parts == pytest.approx(m["time/step_s"], rel=1e-6)
    assert t.state.reference is None  # beta = 0: no reference model, no forward
    assert m["throughput/generate_tokens_per_s"] > m["throughput/completion_tokens_per_s"]
    _, m_ref = _one_step(GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=12, beta=0.1))
    assert m_ref["time/ref_logprobs_s"] > m["time/ref_logprobs_s"]
    split = step_time_split([{"step": 1, **m}, {"step": 2, **m_ref}])
    assert split["step"] == pytest.approx((m["time/step_s"] + m_ref["time/step_s"]) / 2)
    assert "median step" in format_step_time(split) and "generate" in format_step_time(split)


def test_monitor_compares_the_correctness_reward_not_format_bonuses():
    from rlvr.rollout.engine import batch_from_token_lists

    tokenizer = build_char_tokenizer()
    texts = ["#### 12", "#### 12", "#### 13 or 12", "#### 13"]
    tokens = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    batch = batch_from_token_lists(tokenizer, ["5+7="], 4, tokens, [[0.0] * len(t) for t in tokens])
    batch.rows = [{"prompt": "5+7=", "answer": "12"}]

    def weak(prompts, completions, answer, **_):  # pays any completion containing the answer
        return [float(a in c) for c, a in zip(completions, answer)]

    strict_then_bonus = torch.tensor([1.5, 1.5, 0.5, 0.5])  # strict + 0.5 x a format bonus
    plain = monitor_hacking(math_reward, batch, strict_then_bonus, 32, 0.2)
    assert plain["monitor/flagged"] == 1.0  # the bonus alone looks like a gap of 0.5
    fair = monitor_hacking(math_reward, batch, strict_then_bonus, 32, 0.2, math_reward)
    assert fair["monitor/gap"] == 0.0 and fair["monitor/flagged"] == 0.0
    gamed = monitor_hacking(math_reward, batch, torch.zeros(4), 32, 0.2, weak)
    assert gamed["monitor/train_reward"] == 0.75 and gamed["monitor/strict_acc"] == 0.5
    assert gamed["monitor/flagged"] == 1.0


def test_rows_of_zero_variance_groups_are_skipped_without_changing_the_gradient():
    from rlvr import algo
    from rlvr.models.logprobs import completion_logprobs

    def half_constant(prompts, completions, **_):  # groups 0 and 2 all equal: zero variance
        return [0.5 if i // 4 in (0, 2) else len(c) % 3 / 2 for i, c in enumerate(completions)]

    config = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=12, lr=1e-2)
    t = _trainer(config, half_constant)
    policy = t.state.policy
    initial = copy.deepcopy(policy)
    result = _step(t)
    metrics, batch, rewards = result.metrics, result.batch, result.rewards
    assert 0.5 <= metrics["update/rows_skipped_frac"] < 1.0
    # the reference: one pass over every row, from the initial weights
    advantages = algo.ADVANTAGE_ESTIMATORS["grpo"](rewards, batch.group_ids, scale_rewards="group")
    cols = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    logp = completion_logprobs(initial, *cols, 1.0)
    loss, _ = algo.policy_loss(
        logp,
        batch.logprobs,
        advantages,
        batch.completion_mask,
        epsilon_low=0.2,
        epsilon_high=0.2,
        aggregation="token-mean",
    )
    loss.backward()
    torch.nn.utils.clip_grad_norm_(initial.parameters(), 1.0)
    assert metrics["loss"] == pytest.approx(loss.item(), abs=1e-6)
    for a, b in zip(initial.parameters(), policy.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4)


def test_generation_threads_follow_the_budget_unless_set():
    assert generation_threads(GRPOConfig(max_new_tokens=48), 2) == 1
    assert generation_threads(GRPOConfig(max_new_tokens=138), 2) == 2
    assert generation_threads(GRPOConfig(max_new_tokens=138, generation_threads=1), 2) == 1


def test_a_saved_share_prompt_forward_loads_as_the_forward():
    """config.yaml files written before `--grpo.forward` said `share_prompt_forward`: true
    lets each step choose (auto), false was a prompt per row (padded)."""
    from rlvr.config import from_dict

    assert from_dict(GRPOConfig, {"share_prompt_forward": True}).forward == "auto"
    assert from_dict(GRPOConfig, {"share_prompt_forward": False}).forward == "padded"
    assert from_dict(GRPOConfig, {"forward": "packed"}).forward == "packed"
