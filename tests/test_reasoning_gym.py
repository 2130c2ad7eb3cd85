"""reasoning-gym as a task source: the spec, its refusals, the split, rlvr's grading (and the
hacks reasoning-gym's own scorers pay for, scoring 0 here), the flawed corpus, a 2-step run."""

from __future__ import annotations

import itertools
import json
import pickle
import random
import sys

import pytest

from rlvr.cli import main
from rlvr.report.run_dir import read_jsonl
from rlvr.tasks.reasoning_gym import (
    INSTRUCTION,
    GymNotInstalledError,
    GymReward,
    GymTaskError,
    near_miss,
    parse_spec,
    task_spec,
)
from rlvr.tasks.rewards import reward_columns, total_rewards
from rlvr.verifiers import exact
from tests.helpers import SMALL_TRAIN_FLAGS
from tests.test_cli import cli_error

reasoning_gym = pytest.importorskip("reasoning_gym")

SUMS = "chain_sum?min_terms=3&max_terms=3&max_digits=1"  # a+b-c of one-digit numbers


@pytest.fixture(scope="module")
def sums():
    return task_spec(SUMS, seed=0)


def _error(spec: str, **kwargs) -> str:
    """The one-line refusal of `spec`."""
    with pytest.raises(GymTaskError) as info:
        task_spec(spec, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- the spec ------------------------------------------------------------------------------


def test_options_are_parsed_as_json_else_text():
    (request,) = parse_spec('chain_sum?min_terms=2&p=0.5&neg=true&py=False&ops=["+","-"]&w=a b')
    assert request.name == "chain_sum" and request.weight == 1.0
    assert request.options == {
        "min_terms": 2,
        "p": 0.5,
        "neg": True,
        "py": False,
        "ops": ["+", "-"],  # '+' inside brackets does not split the mix
        "w": "a b",
    }
    assert parse_spec('x?s="a&b+c"')[0].options == {"s": "a&b+c"}


def test_a_mix_splits_on_plus_with_optional_weights():
    requests = parse_spec("chain_sum?max_terms=3*3+leg_counting+gcd*0.5")
    assert [(r.name, r.weight) for r in requests] == [
        ("chain_sum", 3.0),
        ("leg_counting", 1.0),
        ("gcd", 0.5),
    ]
    assert requests[0].options == {"max_terms": 3}
    assert requests[0].text == "chain_sum?max_terms=3*3"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "no task named"),
        ("chain_sum++gcd", "an empty task"),
        ("chain_sum*0", "positive number"),
        ("chain_sum*x", "positive number"),
        ("chain_sum?max_terms", "'max_terms' is not key=value"),
        ("chain_sum?a=1&a=2", "'a' is given twice"),
        ("?a=1", "no task name"),
    ],
)
def test_malformed_specs_are_refused_in_one_line(spec, needle):
    assert needle in _error(spec)


# --- refusals against reasoning-gym, before any model loads -------------------------------


def test_unknown_task_lists_the_nearest_names():
    message = _error("chain_summ")
    assert message.startswith("reasoning_gym:chain_summ: unknown reasoning-gym task")
    assert "nearest: chain_sum" in message


def test_an_option_the_generator_does_not_take_lists_the_ones_it_takes():
    message = _error("chain_sum?max_term=3")
    assert "chain_sum takes no option 'max_term'" in message
    # ChainSumConfig's fields, less rlvr's seed and size
    assert "it takes: min_terms, max_terms, min_digits, max_digits, allow_negation" in message
    assert "'seed' is set by rlvr" in _error("chain_sum?seed=3")


def test_a_value_of_the_wrong_type_or_rejected_by_the_generator():
    assert "option max_terms='many' should be int" in _error("chain_sum?max_terms=many")
    # the generator's own validation message (an assert in ChainSumConfig.validate)
    message = _error("chain_sum?min_terms=5&max_terms=3")
    assert (
        message == "reasoning_gym:chain_sum?min_terms=5&max_terms=3: max_terms must be >= min_terms"
    )


def test_options_leaving_too_few_questions_are_refused():
    # 10 * 10 one-digit pairs and 2 operators: 200 questions, all of them would be held out
    assert "only 0 of 100 further draws are new" in _error(
        "chain_sum?min_terms=2&max_terms=2&max_digits=1"
    )
    assert "only 99 distinct questions" in _error("prime_factorization?max_value=100")


def test_tasks_rlvr_cannot_grade_are_refused():
    assert "not on rlvr's scorer allow-list" in _error("ab", held_out_size=5)
    assert "carry no reference answer" in _error("boxnet", held_out_size=5)
    assert "mix tasks with '+'" in _error("composite")


def test_missing_reasoning_gym_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` fails
    with pytest.raises(GymNotInstalledError, match=r"pip install 'rlvr\[gym\]'"):
        task_spec("chain_sum")


def test_the_cli_prints_a_refusal_on_one_line(capsys):
    argv = ["train", "--task", "reasoning_gym:chain_summ", "--no-progress"]
    assert "nearest: chain_sum" in cli_error(argv, capsys)


# --- rows, held-out and training -----------------------------------------------------------


def test_rows_carry_prompt_answer_and_task(sums):
    held = sums.held_out_rows()
    assert len(held) == 200 and len({r["prompt"] for r in held}) == 200
    row = held[0]
    assert set(row) == {"prompt", "answer", "task"} and row["task"] == "chain_sum"
    assert row["prompt"].startswith(INSTRUCTION + "State the final answer to the following")
    assert row["prompt"].endswith(" =\n")
    # the answer is the expression's value: "a + b - c =" read back from the prompt
    expression = row["prompt"].split(": ", 1)[1].split(" =", 1)[0]
    assert str(eval(expression)) == row["answer"]  # noqa: S307 (digits and + - only)
    # answers run from -18 to 27: "#### -18" is the longest completion, 8 characters
    assert sums.min_new_tokens == 9 and sums.max_new_tokens == 17
    assert sums.reward_fn.methods == {"chain_sum": "math"}


def test_held_out_is_seeded_and_training_never_sees_it(sums):
    held = {r["prompt"] for r in sums.held_out_rows()}
    assert held == {r["prompt"] for r in task_spec(SUMS, seed=0).held_out_rows()}
    assert held != {r["prompt"] for r in task_spec(SUMS, seed=1).held_out_rows()}
    train = list(itertools.islice(sums.train_rows(0), 2000))
    assert not held & {r["prompt"] for r in train}
    assert train[:50] == list(itertools.islice(sums.train_rows(0), 50))
    assert train[:50] != list(itertools.islice(sums.train_rows(1), 50))


def test_a_mix_splits_held_out_and_draws_by_weight():
    spec = task_spec(f"{SUMS}*3+leg_counting?min_animals=1&max_animals=2", seed=0, held_out_size=40)
    held = spec.held_out_rows()
    assert [r["task"] for r in held] == ["chain_sum"] * 30 + ["leg_counting"] * 10
    train = list(itertools.islice(spec.train_rows(0), 400))
    share = sum(r["task"] == "chain_sum" for r in train) / 400
    assert 0.68 < share < 0.82  # 3:1 weights, 400 seeded draws (sd of the share about 0.02)
    assert not {r["prompt"] for r in held} & {r["prompt"] for r in train}
    assert spec.reward_fn.methods == {"chain_sum": "math", "leg_counting": "math"}
    assert spec.describe == "reasoning-gym chain_sum + leg_counting"  # short: a plot title


# --- grading: rlvr's, not reasoning-gym's --------------------------------------------------


def _row(task, answer, metadata=None):
    return {"answer": answer, "task": task, "metadata": metadata}


def test_numeric_answers_get_the_strict_math_verifier(sums):
    score = sums.score
    row = _row("chain_sum", "-4")
    assert score("#### -4", row) == 1.0
    assert score("so \\boxed{-4}", row) == 1.0
    assert score("#### -5", row) == 0.0
    assert score("-4", row) == 0.0  # no #### and no box: no answer
    assert score("#### -5, -4, -3", row) == 0.0  # the "extra numbers" hack: hedged
    assert score("#### -4\n#### -3", row) == 0.0  # a spray of final answers
    assert score("#### -4 or -3", row) == 0.0


def test_word_answers_get_the_exact_verifier():
    reward = GymReward({"course_schedule": "exact"}, {})
    row = _row("course_schedule", "True")
    assert reward.score("#### true.", row) == 1.0
    assert reward.score('#### "True"', row) == 1.0
    assert reward.score("#### True False", row) == 0.0  # earns 0.45 from reasoning-gym
    assert reward.score("True", row) == 0.0
    assert reward.score("#### True\n#### False", row) == 0.0


def test_the_hacks_reasoning_gym_pays_for_score_zero_here():
    # coin_flip: reasoning-gym's prefix credit gives the constant "0" full marks on most items
    coin = task_spec("coin_flip", seed=0, held_out_size=100)
    dataset = reasoning_gym.create_dataset("coin_flip", seed=0, size=1)
    rows = coin.held_out_rows()
    gym_full = sum(dataset.score_answer("0", {"answer": r["answer"]}) == 1.0 for r in rows)
    assert gym_full > 80
    assert all(r["answer"] != "0" for r in rows)
    assert sum(coin.score("#### 0", r) for r in rows) == 0
    # game_of_life_halting: any non-empty answer is "right" for reasoning-gym
    halting = task_spec("game_of_life_halting", seed=0, held_out_size=10)
    halting_gym = reasoning_gym.create_dataset("game_of_life_halting", seed=0, size=1)
    for row in halting.held_out_rows():
        assert halting_gym.score_answer("banana", {"answer": row["answer"]}) == 1.0
        assert halting.score("#### banana", row) == 0.0
        assert halting.score(f"#### {row['answer']}", row) == 1.0
    # the default scorer's substring credit: len("7") / len("6, 7, 8") = 1/7
    gcd = reasoning_gym.create_dataset("gcd", seed=0, size=1)
    assert gcd.score_answer("6, 7, 8", {"answer": "7"}) == pytest.approx(1 / 7)
    assert task_spec("gcd", held_out_size=5).score("#### 6, 7, 8", _row("gcd", "7")) == 0.0


def test_allow_listed_scorer_counts_only_exactly_one_and_exceptions_as_zero():
    dataset = reasoning_gym.create_dataset("prime_factorization", seed=0, size=1)
    reward = GymReward({"prime_factorization": "scorer"}, {"prime_factorization": dataset})
    row = _row("prime_factorization", "2 × 433", {})
    assert reward.verify("#### 433 × 2", row) == (1.0, "correct")  # any order of factors
    assert dataset.score_answer("866", row) == 0.5  # the product alone: half marks there
    assert reward.verify("#### 866", row) == (0.0, "partial")
    with pytest.raises(ValueError):
        dataset.score_answer("2 x 433", row)  # raises on text it cannot parse
    assert reward.verify("#### 2 x 433", row) == (0.0, "scorer_error")
    assert reward.verify("2 × 433", row) == (0.0, "no_answer")
    assert reward.verify("<think>2 × 433", row) == (0.0, "unclosed_think")
    # as the trainer sees it: one reward call, the verdicts as verifier/<name>/<reason>
    rows = [row] * 3
    completions = ["#### 2 × 433", "#### 866", "#### 2 x 433"]
    columns = reward_columns(rows)
    total, metrics = total_rewards([reward], [1.0], [""] * 3, completions, columns)
    assert total.tolist() == [1.0, 0.0, 0.0] and metrics["reward/errors"] == 0.0
    assert metrics["verifier/reasoning_gym_reward/correct"] == 1.0
    assert metrics["verifier/reasoning_gym_reward/partial"] == 1.0
    assert metrics["verifier/reasoning_gym_reward/scorer_error"] == 1.0


def test_allow_listed_tasks_accept_other_valid_forms():
    spec = task_spec("palindrome_generation", seed=0, held_out_size=20)
    for row in spec.held_out_rows():
        assert json.loads(json.dumps(row)) == row  # metadata travels as plain JSON data
        answer, half = row["answer"], len(row["answer"]) // 2
        left, middle = answer[:half], answer[half : len(answer) - half]
        other = left[::-1] + middle + left  # another palindrome of the same letters
        if other != answer:
            break
    assert other != answer
    assert spec.score(f"#### {other}", row) == 1.0  # exact match would have said 0
    assert spec.score(f"#### {answer}", row) == 1.0
    assert spec.score(f"#### {answer}x", row) == 0.0  # not a palindrome: 0.02 there
    for name in ("knights_knaves", "shortest_path", "cryptarithm"):
        named = task_spec(name, seed=0, held_out_size=5)
        for row in named.held_out_rows():
            assert named.score(f"#### {row['answer']}", row) == 1.0, name
            wrong = near_miss(row["answer"], random.Random(0))
            assert named.score(f"#### {wrong}", row) == 0.0, (name, wrong)


def test_reward_reports_reasons_and_pickles(sums):
    reward = sums.reward_fn
    reward.reason_counts(reset=True)
    values = reward(["p"] * 3, ["#### 3", "#### 4", "3"], answer=["3"] * 3, task=["chain_sum"] * 3)
    assert values == [1.0, 0.0, 0.0]
    assert reward.reason_counts(reset=True) == {"correct": 1, "wrong": 1, "no_answer": 1}
    assert reward.reason_counts() == {}
    copy = pickle.loads(pickle.dumps(reward))
    assert copy.score("#### 3", _row("chain_sum", "3")) == 1.0
    assert reward.verify("#### 3", _row("other", "3")) == (0.0, "error")


def test_exact_normaliser():
    assert exact.normalize('  "Hello   World."  ') == "hello world"
    assert exact.normalize("$x$.") == "x"
    assert exact.normalize("1 2\n3 4") == "1 2 3 4"
    assert exact.normalize("“Yes”") == "yes"
    assert exact.verify("#### 1 2 3 4", "1 2\n3 4")[1]["reason"] == "correct"
    assert exact.verify("#### cat or dog", "cat")[1]["reason"] == "wrong"
    assert exact.verify("nothing here", "cat")[1]["reason"] == "no_answer"
    assert exact.verify("#### cat", "")[1]["reason"] == "error"
    assert exact.exact_reward([""], ["\\boxed{Cat}"], answer=["cat"]) == [1.0]


# --- the corpus ----------------------------------------------------------------------------


def test_near_misses():
    rng = random.Random(0)
    assert {near_miss("5", rng) for _ in range(20)} == {"4", "6"}
    assert {near_miss("-12.58", rng) for _ in range(20)} == {"-12.57", "-12.59"}
    assert near_miss("True", rng) == "False" and near_miss("yes", rng) == "no"
    # a transposition of two neighbours: t-a, a-l, l-p or p-s
    assert {near_miss("talps", rng) for _ in range(40)} == {"atlps", "tlaps", "tapls", "talsp"}
    assert {near_miss("aAb", rng) for _ in range(20)} == {"abA"}  # a-A would change nothing
    same = near_miss("aaa", rng)  # no two different neighbours: one letter changed
    assert len(same) == 3 and sum(a != b for a, b in zip(same, "aaa")) == 1


def test_corpus_flaws_are_a_flaw_prob_share_of_wrong_answers(sums):
    def wrong_share(flaw_prob: float) -> float:
        pairs = list(itertools.islice(sums.corpus(0, flaw_prob), 400))
        train = list(itertools.islice(sums.train_rows(0), 400))
        assert [p for p, _ in pairs] == [r["prompt"] for r in train]  # the training stream
        assert all(c.startswith("#### ") for _, c in pairs)
        return sum(sums.score(c, r) == 0.0 for (_, c), r in zip(pairs, train)) / 400

    assert wrong_share(0.0) == 0.0
    assert wrong_share(1.0) == 1.0
    assert 0.25 < wrong_share(0.3) < 0.35


# --- end to end ----------------------------------------------------------------------------


def test_train_two_steps_end_to_end(tmp_path):
    main(
        [
            "train",
            "--task",
            f"reasoning_gym:{SUMS}",
            "--runs-dir",
            str(tmp_path),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--run-name",
            "gym",
            *SMALL_TRAIN_FLAGS,
        ]
    )
    metrics = read_jsonl(tmp_path / "gym" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert 0 <= metrics[1]["reward/reasoning_gym_reward"] <= 1
    summary = json.loads((tmp_path / "gym" / "summary.json").read_text())
    assert summary["held_out_problems"] == 200
