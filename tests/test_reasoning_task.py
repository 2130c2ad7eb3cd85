import itertools
import random
import re
from collections import Counter

import pytest

from rlvr.models.tiny import build_char_tokenizer
from rlvr.tasks import reasoning
from rlvr.tasks.arithmetic import Problem
from rlvr.tasks.reasoning import (
    ReasoningTaskConfig,
    flawed_solution,
    format_consistency_reward,
    held_out_problems,
    max_completion_tokens,
    mode_prompt,
    no_think_examples,
    readability,
    readable_solutions,
    reasoning_reward,
    set_mode,
    task_spec,
    to_letters,
    train_problems,
    verify,
)

CLEAN = "<think>7+8+0=15 5+6+1=12 3+4+1=08</think>825"  # 357+468


def test_clean_solution_round_trip():
    assert flawed_solution(Problem(357, 468, "+"), 0.0, 0.0) == CLEAN
    assert verify(CLEAN, "825") == (1.0, {"reason": "correct", "extracted": "825"})
    assert readability(CLEAN) == 1.0
    assert to_letters("7+8+0=15") == "h+i+a=bf"


def test_flaws_drop_carries_and_mixing_letters_steps_within_a_solution():
    problem = Problem(357, 468, "+")
    slipped = flawed_solution(problem, 1.0, 0.0, random.Random(0))
    assert slipped == "<think>7+8+0=15 5+6+0=11 3+4+0=07</think>715"
    lettered = flawed_solution(problem, 0.0, 1.0, random.Random(0))
    assert lettered == "<think>h+i+a=bf f+g+b=bc d+e+b=ai</think>825"
    assert verify(lettered, "825")[0] == 1.0 and readability(lettered) == 0.0
    # mix_prob 0.5: most 3-step solutions carry both notations, readability about a half
    corpus = task_spec(ReasoningTaskConfig(mix_prob=0.5)).corpus(0, 0.0)
    completions = [c for _, c in itertools.islice(corpus, 400)]
    both = [c for c in completions if 0 < readability(c) < 1]
    assert len(both) / len(completions) > 0.6  # 1 - 2 * 0.5**3 = 0.75 expected
    mean = sum(map(readability, completions)) / len(completions)
    assert 0.4 < mean < 0.6


@pytest.mark.parametrize(
    "completion, expected",
    [
        (CLEAN, 1.0),
        ("<think>7+8+0=15 f+g+b=bc 3+4+1=08</think>825", 2 / 3),  # mixed notation
        ("<think>h+i+a=bf f+g+b=bc d+e+b=ai</think>825", 0.0),  # consistent, not digits
        ("<think>7+8+0=15 hmm 5+6+1=12</think>825", 2 / 3),  # a stray word
        ("<think>7+8+0=1f</think>825", 0.0),  # notations mixed inside a step
        ("<think>7+8+0=15 5+6+1=12", 0.0),  # unclosed
        ("7+8+0=15</think>825", 0.0),  # no opening tag
        ("<think>7+8+0=15</think>825<think>1+1+0=02</think>", 0.0),  # two blocks
        ("x<think>7+8+0=15</think>825", 0.0),  # text before the block
        ("<think></think>825", 0.0),  # no reasoning to read
        ("<think>\n</think>825", 0.0),
    ],
)
def test_readability_by_hand(completion, expected):
    assert readability(completion) == pytest.approx(expected)


@pytest.mark.parametrize(
    "completion, reward, reason",
    [
        (CLEAN, 1.0, "correct"),
        ("<think></think>825", 1.0, "correct"),  # the no-think answer
        ("<think>h+i+a=bf</think> 825\n", 1.0, "correct"),  # surrounding whitespace
        ("825", 0.0, "missing_think"),
        ("#### 825", 0.0, "missing_think"),
        ("<think>7+8+0=15", 0.0, "unclosed_think"),
        ("<think>7+8+0=15</think>825</think>", 0.0, "extra_tags"),
        ("<think>a</think><think>b</think>825", 0.0, "extra_tags"),
        ("</think><think>825", 0.0, "extra_tags"),
        ("825<think></think>825", 0.0, "text_before_think"),
        ("<think>7+8+0=15</think>", 0.0, "no_answer"),
        ("<think>7+8+0=15</think>826", 0.0, "wrong"),
        ("<think>7+8+0=15</think>0825", 0.0, "wrong"),  # exactly the digits
        ("<think>7+8+0=15</think>825 or 826", 0.0, "wrong"),
        ("<think>7+8+0=15</think>#### 825", 0.0, "wrong"),
        ("<think>7+8+0=15</think>\\boxed{825}", 0.0, "wrong"),
        ("<think>7+8+0=15</think>357+468=825", 0.0, "wrong"),
    ],
)
def test_verifier_is_strict(completion, reward, reason):
    got, parts = verify(completion, "825")
    assert (got, parts["reason"]) == (reward, reason)


def test_reward_functions_and_verdict_counts():
    reasoning.reason_counts(reset=True)
    completions = [CLEAN, "825", "<think>x</think>826"]
    assert reasoning_reward(["p"] * 3, completions, answer=["825"] * 3) == [1.0, 0.0, 0.0]
    assert reasoning.reason_counts(reset=True) == {"correct": 1, "missing_think": 1, "wrong": 1}
    assert verify(None, "825")[1]["reason"] == "error"
    mixed = "<think>7+8+0=15 f+g+b=bc</think>825"
    assert format_consistency_reward(["p", "p"], [CLEAN, mixed]) == [1.0, 0.5]
    conversational = [[{"role": "assistant", "content": CLEAN}]]
    assert reasoning_reward(["p"], conversational, answer=["825"]) == [1.0]


def test_prompt_modes():
    assert mode_prompt("357+468=") == "357+468="
    assert mode_prompt("357+468=", "think") == "/think 357+468="
    assert mode_prompt("357+468=", "no_think") == "/no_think 357+468="
    assert set_mode("/no_think 357+468=", "think") == "/think 357+468="
    assert set_mode("/think 357+468=", "default") == "357+468="
    with pytest.raises(ValueError):
        mode_prompt("1+2=", "fast")


def test_sft_data_is_clean_and_in_the_right_mode():
    config = ReasoningTaskConfig(held_out_size=20)
    held = {p.prompt for p in held_out_problems(config)}
    cold = readable_solutions(config, 50, seed=3, mode="think")
    for prompt, completion in cold:
        question = prompt.removeprefix("/think ")
        a, b = question.rstrip("=").split("+")
        assert question not in held
        assert verify(completion, str(int(a) + int(b)))[0] == 1.0
        assert readability(completion) == 1.0
    for prompt, completion in no_think_examples(config, 20, seed=3):
        a, b = prompt.removeprefix("/no_think ").rstrip("=").split("+")
        assert completion == f"<think></think>{int(a) + int(b)}"


def test_train_and_held_out_never_share_a_problem():
    config = ReasoningTaskConfig(digits=2, held_out_size=400)
    held = set(held_out_problems(config))
    assert len(held) == 400
    assert not held.intersection(itertools.islice(train_problems(config, seed=1), 5000))
    spec = task_spec(config)
    held_prompts = {r["prompt"] for r in spec.held_out_rows()}
    train = [r["prompt"] for r in itertools.islice(spec.train_rows(1), 2000)]
    corpus = [p for p, _ in itertools.islice(spec.corpus(1, 0.65), 2000)]
    assert not held_prompts.intersection(train + corpus)


@pytest.mark.parametrize("digits", [2, 3, 4])
def test_budget_fits_the_longest_completion(digits):
    tokenizer = build_char_tokenizer()
    top = 10**digits - 1
    longest = flawed_solution(Problem(top, top, "+"), 0.0, 0.0)
    n = len(tokenizer(longest, add_special_tokens=False)["input_ids"]) + 1  # and EOS
    spec = task_spec(ReasoningTaskConfig(digits=digits, held_out_size=10))
    assert max_completion_tokens(digits) == n == spec.min_new_tokens
    assert spec.max_new_tokens > spec.min_new_tokens
    assert spec.score(longest, {"answer": str(2 * top)}) == 1.0


def test_cut_solutions_end_on_a_step_boundary_with_the_stop_phrase():
    problem, rng = Problem(357, 468, "+"), random.Random(0)
    cuts = {reasoning.cut_solution(problem, rng) for _ in range(50)}
    assert cuts == {
        "<think>7+8+0=15\n</think>825",
        "<think>7+8+0=15 5+6+1=12\n</think>825",
    }
    assert all(verify(c, "825")[0] == 1.0 for c in cuts)
    # a budget of step_budgets(d)[k] tokens holds exactly k steps
    steps = "7+8+0=15 5+6+1=12 3+4+1=08".split()
    assert reasoning.step_budgets(3) == [0] + [len(" ".join(steps[:k])) for k in (1, 2, 3)]


def test_mode_following_reward_pays_for_obeying_the_switch():
    from rlvr.tasks.reasoning import mode_following_reward

    prompts = ["/no_think 1+2=", "/no_think 1+2=", "1+2=", "/think 1+2=", "/think 1+2="]
    completions = [
        "<think></think>3",  # obeys /no_think
        "<think>1+2+0=03</think>3",  # thinks anyway
        "<think>1+2+0=03</think>3",  # default mode thinks
        "<think></think>3",  # skipped thinking when asked to think
        "1+2+0=03 3",  # no think block at all
    ]
    assert mode_following_reward(prompts, completions) == [1.0, 0.0, 1.0, 0.0, 0.0]


# --- variable_steps ------------------------------------------------------------------------

VARIABLE = ReasoningTaskConfig(variable_steps=True)


@pytest.mark.parametrize(
    "a, b, prompt, completion",
    [
        (7, 45, "007+045=", "<think>7+5+0=12 0+4+1=05</think>52"),
        (7, 5, "007+005=", "<think>7+5+0=12</think>12"),  # the carry out is the tens digit
        (95, 7, "095+007=", "<think>5+7+0=12 9+0+1=10</think>102"),
        (105, 3, "105+003=", "<think>5+3+0=08 0+0+0=00 1+0+0=01</think>108"),  # inner zeros
        (0, 0, "000+000=", "<think>0+0+0=00</think>0"),
        (357, 468, "357+468=", CLEAN),  # full width: the default format's solution
    ],
)
def test_variable_steps_solutions_stop_after_the_last_real_column(a, b, prompt, completion):
    problem = reasoning.PaddedProblem(a, b, "+", 3)
    assert problem.prompt == prompt
    assert flawed_solution(problem, 0.0, 0.0) == completion
    assert verify(completion, problem.answer)[0] == 1.0 and readability(completion) == 1.0
    assert verify(completion.replace("</think>", "</think>0"), problem.answer)[0] == 0.0
    steps = completion.split("<think>")[1].split("</think>")[0].split()
    assert reasoning.thinking_steps(problem) == len(steps)
    # the budget of k steps holds the whole chain exactly when the problem needs <= k steps
    budget = reasoning.step_budgets(3)[len(steps)]
    assert len(" ".join(steps)) == budget


def test_variable_steps_prompts_are_padded_and_steps_are_spread():
    held = held_out_problems(VARIABLE)
    train = list(itertools.islice(train_problems(VARIABLE, seed=0), 3000))
    assert len(set(held)) == 200 and not set(held).intersection(train)
    for problem in held + train[:500]:
        assert re.fullmatch(r"\d{3}\+\d{3}=", problem.prompt)
        assert problem.answer == str(problem.a + problem.b)  # no leading zeros
    counts = Counter(map(reasoning.thinking_steps, train))
    assert set(counts) == {1, 2, 3}
    # 1-step problems are only 100, and the held-out set takes some: fewer than a third
    assert counts[1] > 0.15 * len(train) and min(counts[2], counts[3]) > 0.3 * len(train)
    held_steps = Counter(map(reasoning.thinking_steps, held))
    assert min(held_steps.values()) > 30
    spec = task_spec(VARIABLE)
    assert [r["prompt"] for r in spec.held_out_rows()] == [p.prompt for p in held]
    assert spec.min_new_tokens == max_completion_tokens(3)
    held_prompts = {p.prompt for p in held}
    corpus = [p for p, _ in itertools.islice(spec.corpus(1, 0.65), 2000)]
    rows = [r["prompt"] for r in itertools.islice(spec.train_rows(1), 2000)]
    assert not held_prompts.intersection(corpus + rows)


def test_variable_steps_corpus_and_sft_data_follow_the_option():
    corpus = task_spec(VARIABLE).corpus(0, 0.65)
    for prompt, completion in itertools.islice(corpus, 300):
        assert re.fullmatch(r"\d{3}\+\d{3}=", prompt)
        a, b = map(int, prompt.rstrip("=").split("+"))
        steps = reasoning.split_think(completion)[1].split()
        assert len(steps) == reasoning.thinking_steps(Problem(a, b, "+"))
    # a slip and letters on a short problem
    problem = reasoning.PaddedProblem(58, 67, "+", 3)
    slipped = flawed_solution(problem, 1.0, 0.0, random.Random(0))
    assert slipped == "<think>8+7+0=15 5+6+0=11</think>115"
    lettered = flawed_solution(problem, 0.0, 1.0, random.Random(0))
    assert lettered == "<think>i+h+a=bf f+g+b=bc</think>125"
    for prompt, completion in readable_solutions(VARIABLE, 30, seed=3, mode="think"):
        a, b = map(int, prompt.removeprefix("/think ").rstrip("=").split("+"))
        assert re.fullmatch(r"/think \d{3}\+\d{3}=", prompt)
        assert verify(completion, str(a + b))[0] == 1.0 and readability(completion) == 1.0
    for prompt, completion in no_think_examples(VARIABLE, 30, seed=3):
        assert re.fullmatch(r"/no_think \d{3}\+\d{3}=", prompt)
        a, b = map(int, prompt.removeprefix("/no_think ").rstrip("=").split("+"))
        assert completion == f"<think></think>{a + b}"


def test_default_config_is_unchanged():
    assert ReasoningTaskConfig().variable_steps is False
    held = held_out_problems(ReasoningTaskConfig())
    assert all(type(p) is Problem and 100 <= min(p.a, p.b) for p in held)
    # the draws the documented numbers were measured on (the arithmetic task's)
    assert [p.prompt for p in held[:3]] == ["896+551=", "107+192=", "787+809="]
    assert next(train_problems(ReasoningTaskConfig(), seed=0)).prompt == "964+494="
    assert task_spec(ReasoningTaskConfig()).describe == "3-digit addition with <think>"
