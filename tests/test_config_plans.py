"""What `build_plan` and `build_loop_plan` hand the step and the loop: the advantage functions
each read their fields of one `AdvantageInputs` (hand-computed values), and `train_grpo`'s loop
reads only its `LoopPlan`."""

import ast
import inspect
import textwrap

import torch

from rlvr.rollout.sampler import RolloutBatch
from rlvr.train import grpo
from rlvr.train.config import (
    AdvantageInputs,
    Critic,
    Distill,
    GRPOConfig,
    Monitor,
    build_loop_plan,
    build_plan,
)
from tests.helpers import close

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def _batch(logprobs: torch.Tensor) -> RolloutBatch:
    """4 completions, groups [0, 0, 1, 1], with `logprobs` as the sampler's."""
    n, t = MASK.shape
    return RolloutBatch(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.zeros(n, t, dtype=torch.long),
        completion_mask=MASK,
        logprobs=logprobs,
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.tensor([0, 0, 1, 1]),
        completions=[""] * n,
    )


REWARDS = torch.tensor([1.0, 0.0, 3.0, 1.0])


def test_group_advantages_read_the_shaped_rewards_and_the_groups():
    # dr_grpo: r - group mean: group 0 mean 0.5 -> [0.5, -0.5]; group 1 mean 2 -> [1, -1]
    plan = build_plan(GRPOConfig(max_new_tokens=3, advantage_estimator="dr_grpo"))
    inputs = AdvantageInputs(REWARDS, _batch(torch.zeros(4, 3)), MASK)
    advantages, returns = plan.advantages(inputs)
    close(advantages, [0.5, -0.5, 1.0, -1.0])
    assert returns is None


def test_distill_advantages_read_the_teacher_and_mix_the_verifiers():
    # per token kl_coef x (teacher - student) on the mask, + reward_coef x dr_grpo's advantage:
    # student log-probs -1 everywhere, teacher -0.5: 0.5 x 2 = 1.0 per token, plus 0.5 x A
    distill = Distill(teacher="t", kl_coef=2.0, reward_coef=0.5)
    config = GRPOConfig(max_new_tokens=3, advantage_estimator="dr_grpo", distill=distill)
    plan = build_plan(config)
    teacher = torch.full((4, 3), -0.5)
    inputs = AdvantageInputs(REWARDS, _batch(torch.full((4, 3), -1.0)), MASK, None, None, teacher)
    advantages, _ = plan.advantages(inputs)
    expected = [[1.25, 1.25, 0.0], [0.75, 0.0, 0.0], [1.5, 1.5, 1.5], [0.5, 0.0, 0.0]]
    close(advantages, expected)


def test_gae_reads_the_critics_values_and_its_config():
    # gamma = lam = 1, values 0: every token's advantage is the outcome reward, returns too;
    # whitened over the loss mask's 7 tokens: rewards 1,1 | 0 | 3,3,3 | 1, mean 12/7
    config = GRPOConfig(max_new_tokens=3, advantage_estimator="gae", critic=Critic(lam=1.0))
    plan = build_plan(config)
    inputs = AdvantageInputs(REWARDS, _batch(torch.zeros(4, 3)), MASK, values=torch.zeros(4, 3))
    advantages, returns = plan.advantages(inputs)
    close(returns, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [3.0, 3.0, 3.0], [1.0, 0.0, 0.0]])
    on_mask = advantages[MASK.bool()]
    assert abs(float(on_mask.mean())) < 1e-6
    assert float(on_mask[2] - on_mask[0]) < 0  # the row that scored 0 is below the mean


def test_the_loop_plan_carries_the_loops_settings():
    config = GRPOConfig(
        steps=7,
        eval_every=3,
        checkpoint_every=2,
        keep_checkpoints=4,
        max_seconds=9.5,
        monitor=Monitor(every=1, samples=5, gap=0.3),
        samples_per_step=6,
        max_nonfinite_steps=8,
        abort_zero_reward_steps=11,
        advantage_estimator="rloo",
    )
    loop = build_loop_plan(config)
    assert (loop.steps, loop.eval_every, loop.checkpoint_every, loop.keep_checkpoints) == (
        7,
        3,
        2,
        4,
    )
    assert (loop.max_seconds, loop.monitor, loop.samples_per_step) == (9.5, config.monitor, 6)
    assert (loop.max_nonfinite_steps, loop.abort_zero_reward_steps, loop.label) == (8, 11, "rloo")


def test_train_grpos_loop_reads_no_config_field():
    tree = ast.parse(textwrap.dedent(inspect.getsource(grpo.train_grpo)))
    reads = [
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "config"
    ]
    assert reads == []
