import math

import torch

from rlvr.tasks.rewards import total_rewards


def exact(prompts, completions, answer, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def short(prompts, completions, **kwargs):
    return [0.5 if len(c) < 3 else None for c in completions]  # None: not applicable


def crashing(prompts, completions, **kwargs):
    raise RuntimeError("verifier bug")


def test_weighted_sum_with_none_as_zero():
    rewards, metrics = total_rewards(
        [exact, short], [1.0, 2.0], ["p", "p"], ["12", "123"], {"answer": ["12", "124"]}
    )
    # row 0: 1.0 * 1 + 2.0 * 0.5 = 2.0; row 1: 1.0 * 0 + 2.0 * 0 (None) = 0.0
    torch.testing.assert_close(rewards, torch.tensor([2.0, 0.0]))
    assert metrics["reward/exact"] == 0.5 and metrics["reward/short"] == 0.25
    assert metrics["reward/errors"] == 0


def test_a_crashing_or_malformed_verifier_scores_zero_and_is_counted():
    def wrong_length(prompts, completions, **kwargs):
        return [1.0]

    def not_finite(prompts, completions, **kwargs):
        return [math.nan, 1.0]

    columns = {"answer": ["12", "13"]}
    rewards, metrics = total_rewards(
        [exact, crashing, wrong_length, not_finite],
        [1, 1, 1, 1],
        ["p", "p"],
        ["12", "x"],
        columns,
    )
    # exact gives [1, 0]; crashing and wrong_length give 0s; not_finite gives [0 (nan), 1]
    torch.testing.assert_close(rewards, torch.tensor([1.0, 1.0]))
    assert metrics["reward/errors"] == 2 + 2 + 1


def test_verdicts_are_counted_by_reason_per_call():
    from rlvr.verifiers.math import math_reward, score

    score("#### 3", "3")  # a verdict from outside the call (e.g. evaluation) is not counted
    _, metrics = total_rewards(
        [math_reward],
        [1.0],
        ["p"] * 3,
        ["#### 15", "#### 15 or 16", "no answer"],
        {"answer": ["15", "15", "15"]},
    )
    assert metrics["verifier/math_reward/correct"] == 1.0
    assert metrics["verifier/math_reward/hedged"] == 1.0
    assert metrics["verifier/math_reward/no_answer"] == 1.0
    assert sum(v for k, v in metrics.items() if k.startswith("verifier/")) == 3
