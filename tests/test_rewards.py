import math
import time

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


def _sleeper(seconds):
    def sleepy(prompts, completions, **kwargs):
        time.sleep(seconds)
        return [1.0] * len(completions)

    return sleepy


def test_a_call_past_the_deadline_scores_zero_is_counted_and_warns_once(capsys, monkeypatch):
    import rlvr.tasks.rewards as rewards

    monkeypatch.setattr(rewards, "_WARNED", set())
    slow = _sleeper(2.0)
    for _ in range(2):  # the second timeout warns no more
        start = time.perf_counter()
        rewards_, metrics = total_rewards(
            [exact, slow],
            [1.0, 1.0],
            ["p", "p"],
            ["12", "x"],
            {"answer": ["12", "12"]},
            timeout_s=0.2,
        )
        elapsed = time.perf_counter() - start
        assert elapsed < 1.5, elapsed  # ~0.2 s; the abandoned call would take 2 s
        # exact gives [1, 0]; the slow function's 1.0s never arrive: 0 for both rows
        torch.testing.assert_close(rewards_, torch.tensor([1.0, 0.0]))
        assert metrics["verifier/sleepy/timeout"] == 2.0
        assert metrics["verifier/exact/timeout"] == 0.0  # reported for every function
        assert metrics["reward/sleepy"] == 0.0 and metrics["reward/errors"] == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "sleepy" in lines[0] and "0.2 s" in lines[0]


def test_within_the_deadline_the_values_and_errors_are_those_of_an_inline_call():
    fast = _sleeper(0.0)
    columns = {"answer": ["12", "13"]}
    fns, weights = [exact, fast, crashing, short], [1.0, 0.5, 1.0, 2.0]
    inline = total_rewards(fns, weights, ["p", "p"], ["12", "x"], columns)
    bounded = total_rewards(fns, weights, ["p", "p"], ["12", "x"], columns, timeout_s=5.0)
    torch.testing.assert_close(bounded[0], inline[0])
    assert {k: v for k, v in bounded[1].items() if not k.endswith("/timeout")} == inline[1]
    assert bounded[1]["verifier/crashing/timeout"] == 0.0  # a crash is an error, not a timeout
    assert "verifier/exact/timeout" not in inline[1]  # without the bound: no timeout metric


def test_the_math_verifiers_own_counts_survive_the_bound():
    from rlvr.verifiers.math import math_reward

    _, metrics = total_rewards(
        [math_reward],
        [1.0],
        ["p"] * 2,
        ["#### 15", "nothing"],
        {"answer": ["15", "15"]},
        timeout_s=30.0,
    )
    assert metrics["verifier/math_reward/correct"] == 1.0
    assert metrics["verifier/math_reward/no_answer"] == 1.0
    assert metrics["verifier/math_reward/timeout"] == 0.0
