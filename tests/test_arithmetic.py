import itertools
import random

import pytest

from rlvr.tasks.arithmetic import (
    ArithmeticTaskConfig,
    Problem,
    held_out_problems,
    max_solution_chars,
    rows,
    train_problems,
    worked_solution,
)
from rlvr.verifiers.math import score


@pytest.mark.parametrize(
    "problem, expected",
    [
        (Problem(357, 468, "+"), "7+8+0=15 5+6+1=12 3+4+1=08 #### 825"),
        (Problem(999, 999, "+"), "9+9+0=18 9+9+1=19 9+9+1=19 #### 1998"),
        (Problem(802, 469, "-"), "2-9-0=-07 0-6-1=-07 8-4-1=+03 #### 333"),
        (Problem(500, 500, "-"), "0-0-0=+00 0-0-0=+00 5-5-0=+00 #### 0"),
    ],
)
def test_worked_solution_by_hand(problem, expected):
    assert worked_solution(problem) == expected


@pytest.mark.parametrize("digits, ops", [(1, ("+",)), (3, ("+", "-")), (5, ("-",))])
def test_clean_solutions_are_correct_and_fit_the_budget(digits, ops):
    config = ArithmeticTaskConfig(digits=digits, operations=ops, held_out_size=5)
    for problem in itertools.islice(train_problems(config, seed=0), 300):
        solution = worked_solution(problem)
        assert score(solution, problem.answer) == 1.0
        assert len(solution) <= max_solution_chars(config)


def test_slips_make_wrong_answers_at_roughly_the_expected_rate():
    config = ArithmeticTaskConfig()
    rng = random.Random(0)
    problems = list(itertools.islice(train_problems(config, seed=0), 2000))
    wrong = sum(score(worked_solution(p, 0.65, rng), p.answer) == 0.0 for p in problems)
    # about half the corpus is wrong with slip 0.65 (each of ~1.4 carries per problem)
    assert 0.4 < wrong / len(problems) < 0.6
    # a slip is a dropped carry: "5+6+0=11" where the clean solution has "5+6+1=12"
    slipped = worked_solution(Problem(357, 468, "+"), 1.0, random.Random(0))
    assert slipped == "7+8+0=15 5+6+0=11 3+4+0=07 #### 715"


def test_train_and_held_out_never_share_a_problem():
    config = ArithmeticTaskConfig(digits=2, held_out_size=400)
    held = set(held_out_problems(config))
    assert len(held) == 400
    train = list(itertools.islice(train_problems(config, seed=1), 5000))
    assert not held.intersection(train)


def test_draws_are_seeded():
    config = ArithmeticTaskConfig()
    assert held_out_problems(config) == held_out_problems(config)
    first = list(itertools.islice(train_problems(config, seed=7), 20))
    assert first == list(itertools.islice(train_problems(config, seed=7), 20))
    assert first != list(itertools.islice(train_problems(config, seed=8), 20))


def test_rows_and_bad_configs():
    assert rows([Problem(12, 34, "+")]) == [{"prompt": "12+34=", "answer": "46"}]
    with pytest.raises(ValueError, match="operations"):
        held_out_problems(ArithmeticTaskConfig(operations=("*",)))
    with pytest.raises(ValueError, match="too large"):
        held_out_problems(ArithmeticTaskConfig(digits=1, held_out_size=50))


def test_the_question_style_asks_in_words_and_solves_in_one_line():
    from rlvr.tasks.arithmetic import ArithmeticTaskConfig, task_spec

    config = ArithmeticTaskConfig(digits=2, style="question", held_out_size=20)
    task = task_spec(config)
    row = task.held_out_rows()[0]
    assert row["prompt"].startswith("What is ") and row["prompt"].endswith("?")
    prompt, solution = next(task.corpus(0, 0.0))
    a, b = map(int, prompt.removeprefix("What is ").removesuffix("?").split("+"))
    assert solution == f"{a}+{b} = {a + b}\n#### {a + b}"
    assert task.score(solution, {"answer": str(a + b)}) == 1.0
    assert task.min_new_tokens == len("99+99 = 198\n#### 198") + 1
    with pytest.raises(ValueError, match="style must be one of"):
        task_spec(ArithmeticTaskConfig(style="prose")).held_out_rows()


def test_held_out_scoring_refuses_an_echo_of_the_prompt_as_training_does():
    from rlvr.tasks.arithmetic import ArithmeticTaskConfig, task_spec

    task = task_spec(ArithmeticTaskConfig())
    row = task.held_out_rows()[0]  # e.g. {"prompt": "896+551=", "answer": "1447"}
    echo = "#### " + row["prompt"].rstrip("=")
    assert task.score(echo, row) == 0.0  # the question's own expression evaluates to the answer
    assert task.score(f"#### {row['answer']}", row) == 1.0
    assert task.reward_fn([row["prompt"]], [echo], answer=[row["answer"]]) == [0.0]
