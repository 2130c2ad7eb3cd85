"""The code and tool tasks: splits, seeding, flawed corpora, budgets, tokenizer, verifiers."""

import itertools
import pickle
import random
import subprocess
import sys
from collections import Counter

import pytest

from rlvr.tasks import code_task, tool_task
from rlvr.tasks.spec import TaskSpec
from rlvr.verifiers import tool as tool_verifier

SPECS = {"code": code_task.task_spec, "tool": tool_task.task_spec}


def _code_pass_fraction(prompt: str, completion: str, tests: list[str]) -> float:
    """The tests run in this process: only for programs this task generated itself."""
    namespace: dict = {}
    try:
        exec(prompt + completion, namespace)
    except Exception:
        return 0.0
    passed = 0
    for test in tests:
        try:
            exec(test, dict(namespace))
            passed += 1
        except Exception:
            pass
    return passed / len(tests)


# --- both tasks -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPECS)
def test_spec_shape(name):
    spec = SPECS[name]()
    assert isinstance(spec, TaskSpec) and spec.name == name and spec.describe
    rows = spec.held_out_rows()
    column = "tests" if name == "code" else "answer"
    assert rows and all(set(row) == {"prompt", column} for row in rows)
    train = next(spec.train_rows(0))
    assert set(train) == {"prompt", column}
    prompt, completion = next(spec.corpus(0, 0.5))
    assert isinstance(prompt, str) and isinstance(completion, str)


@pytest.mark.parametrize("name", SPECS)
def test_train_and_held_out_never_share_a_problem(name):
    spec = SPECS[name]()
    held_prompts = {row["prompt"] for row in spec.held_out_rows()}
    assert len(held_prompts) == len(spec.held_out_rows())
    train = [row["prompt"] for row in itertools.islice(spec.train_rows(3), 5000)]
    corpus = [p for p, _ in itertools.islice(spec.corpus(3, 0.5), 5000)]
    assert not held_prompts.intersection(train + corpus)


def test_code_split_is_by_function_not_by_text():
    config = code_task.CodeTaskConfig(held_out_size=1000)
    held = code_task.held_out_problems(config)
    assert len({p.fingerprint for p in held}) == 1000
    excluded = {p.fingerprint for p in held}
    train = itertools.islice(code_task.train_problems(config, 0), 5000)
    assert not any(p.fingerprint in excluded for p in train)
    # one function, two texts: 2*(x+10) is 2*x + 20
    same = code_task.Problem("mul_add", 2, 10), code_task.Problem("lin_add", 2, 20)
    assert same[0].fingerprint == same[1].fingerprint


def test_tool_split_counts_commuted_calls_once():
    config = tool_task.ToolTaskConfig(held_out_size=1000)
    held = {p.key for p in tool_task.held_out_problems(config)}
    assert tool_task.Problem("sum", 17, 25).key == tool_task.Problem("sum", 25, 17).key
    assert tool_task.Problem("sub", 17, 25).key != tool_task.Problem("sub", 25, 17).key
    train = itertools.islice(tool_task.train_problems(config, 0), 5000)
    assert not any(p.key in held for p in train)


@pytest.mark.parametrize("name", SPECS)
def test_seeded_determinism(name):
    a, b = SPECS[name](), SPECS[name]()
    assert a.held_out_rows() == b.held_out_rows()
    assert list(itertools.islice(a.train_rows(7), 50)) == list(
        itertools.islice(b.train_rows(7), 50)
    )
    assert list(itertools.islice(a.corpus(7, 0.4), 200)) == list(
        itertools.islice(b.corpus(7, 0.4), 200)
    )
    assert list(itertools.islice(a.train_rows(7), 50)) != list(
        itertools.islice(a.train_rows(8), 50)
    )
    assert list(itertools.islice(a.corpus(7, 0.4), 50)) != list(
        itertools.islice(a.corpus(8, 0.4), 50)
    )
    # the train stream and the corpus are different draws
    train_prompts = [r["prompt"] for r in itertools.islice(a.train_rows(7), 50)]
    assert train_prompts != [p for p, _ in itertools.islice(a.corpus(7, 0.0), 50)]
    # another seed offset is another held-out set; offset 0 is the canonical one
    assert SPECS[name](1).held_out_rows() != a.held_out_rows()
    assert SPECS[name](0).held_out_rows() == a.held_out_rows()


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("flaw_prob", [0.0, 1.0])
def test_corpus_fits_the_budget(name, flaw_prob):
    spec = SPECS[name]()
    pairs = list(itertools.islice(spec.corpus(0, flaw_prob), 3000))
    assert max(len(completion) for _, completion in pairs) + 1 <= spec.max_new_tokens  # + EOS
    rows = spec.held_out_rows()
    if name == "code":
        solutions = [p.solution for p in code_task.held_out_problems(code_task.CodeTaskConfig())]
        assert {len(s) for s in solutions} == {code_task.COMPLETION_CHARS}
        assert {len(r["prompt"]) for r in rows} == {code_task.PROMPT_CHARS}
    else:
        solutions = [p.solution for p in tool_task.held_out_problems(tool_task.ToolTaskConfig())]
        assert {len(s) for s in solutions} == {tool_task.COMPLETION_CHARS}
        assert {len(r["prompt"]) for r in rows} == {tool_task.PROMPT_CHARS}
    assert spec.max_new_tokens <= max(len(s) for s in solutions) + 3  # tight budget


@pytest.mark.parametrize("name", SPECS)
def test_tokenizer_round_trips_every_character(name):
    from rlvr.models.tiny import UNK_TOKEN, build_char_tokenizer

    tokenizer = build_char_tokenizer()
    spec = SPECS[name]()
    texts = [row["prompt"] for row in spec.held_out_rows()]
    texts += [p + c for p, c in itertools.islice(spec.corpus(0, 1.0), 2000)]
    texts += [p + c for p, c in itertools.islice(spec.corpus(0, 0.0), 200)]
    unk = tokenizer.convert_tokens_to_ids(UNK_TOKEN)
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert unk not in ids
        assert len(ids) == len(text)  # one token per character
        assert tokenizer.decode(ids) == text


# --- code task --------------------------------------------------------------------------------


def test_code_problem_by_hand():
    problem = code_task.Problem("mul_add", 3, 17)
    assert problem.prompt == "# f(x) = 3*(x+17)\ndef f(x):\n"
    assert problem.solution == "    return 3*(x+17)"
    assert len(problem.tests) == 3 and len(set(problem.inputs)) == 3
    for x, test in zip(problem.inputs, problem.tests):
        assert test == f"assert f({x}) == {3 * (x + 17)}"
    assert all(len(e.format(a=9, b=99)) == 8 for e in code_task.TEMPLATES.values())


def test_code_held_out_solutions_pass_every_test():
    spec = code_task.task_spec()
    problems = code_task.held_out_problems(code_task.CodeTaskConfig())
    rows = spec.held_out_rows()
    assert [p.prompt for p in problems] == [r["prompt"] for r in rows]
    # every row, checked in this process (the programs are this module's own)
    for problem, row in zip(problems, rows):
        assert _code_pass_fraction(row["prompt"], problem.solution, row["tests"]) == 1.0
    # and a sample through the sandboxed verifier, as the trainer grades them
    sample = list(zip(problems, rows))[:12]
    rewards = spec.reward_fn(
        [r["prompt"] for _, r in sample],
        [p.solution for p, _ in sample],
        [r["tests"] for _, r in sample],
    )
    assert rewards == [1.0] * len(sample)
    assert spec.score(sample[0][0].solution, sample[0][1]) == 1.0


def test_code_flaws_fail_at_the_expected_rate():
    spec = code_task.task_spec()
    config = code_task.CodeTaskConfig()
    # realistic slips of every kind, each failing at least one test
    rng = random.Random(0)
    kinds = Counter()
    for problem in itertools.islice(code_task.train_problems(config, 0), 1500):
        kind, completion = code_task.flawed_solution(problem, rng)
        kinds[kind] += 1
        assert len(completion) == code_task.COMPLETION_CHARS
        assert _code_pass_fraction(problem.prompt, completion, problem.tests) < 1.0
    assert set(kinds) == set(code_task.FLAWS)
    # the corpus: a flaw_prob share of completions fails (each prompt has its own tests)
    tests_of = {}
    for problem in itertools.islice(code_task.train_problems(config, "code-corpus/0/0"), 3000):
        tests_of[problem.prompt] = problem.tests
    pairs = list(itertools.islice(spec.corpus(0, 0.3), 3000))
    failing = [_code_pass_fraction(p, c, tests_of[p]) < 1.0 for p, c in pairs]
    assert 0.26 < sum(failing) / len(pairs) < 0.34
    # some slips fail only some tests
    fractions = Counter(_code_pass_fraction(p, c, tests_of[p]) for p, c in pairs)
    assert fractions[0.0] > 0 and (fractions[1 / 3] + fractions[2 / 3]) > 0
    # the sandboxed verifier agrees on a sample of flawed and clean completions
    sample = [pc for pc, bad in zip(pairs, failing) if bad][:10] + pairs[:6]
    rewards = spec.reward_fn(
        [p for p, _ in sample], [c for _, c in sample], [tests_of[p] for p, _ in sample]
    )
    expected = [_code_pass_fraction(p, c, tests_of[p]) for p, c in sample]
    assert rewards == pytest.approx(expected)
    assert all(r < 1.0 for r in rewards[:10])


def test_code_reward_grades_prompt_plus_completion_and_caches():
    spec = code_task.task_spec()
    row = spec.held_out_rows()[0]
    body = code_task.held_out_problems(code_task.CodeTaskConfig())[0].solution
    code_task.clear_cache()
    rewards = spec.reward_fn(
        [row["prompt"]] * 4,
        [body, body, "    return x", "    return ("],  # a group with repeats, a wrong body, junk
        [row["tests"]] * 4,
        answer=[None] * 4,  # other columns TRL passes are ignored
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert code_task.program(row["prompt"], body) == row["prompt"] + body
    # cached: the same verdicts again, without the sandbox
    assert spec.reward_fn([row["prompt"]] * 2, [body, "    return x"], [row["tests"]] * 2) == [
        1.0,
        0.0,
    ]
    assert pickle.loads(pickle.dumps(spec.reward_fn)) is code_task.code_task_reward


# --- tool task --------------------------------------------------------------------------------


def test_tool_problem_by_hand():
    assert tool_task.Problem("sum", 17, 25).prompt == "increase 17 by 25\n"
    sub = tool_task.Problem("sub", 17, 25)
    assert sub.prompt == "decrease 17 by 25\n" and sub.answer == -8
    assert sub.solution == '{"arguments": {"a": 17, "b": 25}, "name": "sub"}'
    assert tool_task.Problem("mul", 17, 25).prompt == "multiply 17 by 25\n"
    spec = tool_task.task_spec()
    assert spec.score(sub.solution, {"prompt": sub.prompt, "answer": -8}) == 1.0
    tagged = f"<tool_call>{sub.solution}</tool_call>"  # the tagged form is accepted as well
    assert spec.score(tagged, {"prompt": sub.prompt, "answer": -8}) == 1.0


def test_tool_held_out_solutions_score_one():
    spec = tool_task.task_spec()
    problems = tool_task.held_out_problems(tool_task.ToolTaskConfig())
    rows = spec.held_out_rows()
    assert [p.prompt for p in problems] == [r["prompt"] for r in rows]
    assert all(spec.score(p.solution, r) == 1.0 for p, r in zip(problems, rows))
    rewards = spec.reward_fn(
        [r["prompt"] for r in rows],
        [p.solution for p in problems],
        answer=[r["answer"] for r in rows],
    )
    assert rewards == [1.0] * len(rows)
    assert {p.tool for p in problems} == set(tool_task.TOOLS)


def test_tool_flaws_score_zero_at_the_expected_rate():
    config = tool_task.ToolTaskConfig()
    rng = random.Random(0)
    seen = Counter()
    for problem in itertools.islice(tool_task.train_problems(config, 0), 3000):
        kind, completion = tool_task.flawed_solution(problem, rng)
        reward, parts = tool_verifier.verify(completion, problem.answer, tools=tool_task.TOOLS)
        assert reward == 0.0
        seen[kind, parts["reason"]] += 1
    assert {k for k, _ in seen} == set(tool_task.FLAWS)
    assert {r for _, r in seen} == {"wrong", "malformed", "schema_violation"}
    assert seen["malformed", "malformed"] + seen["malformed", "schema_violation"] < 0.2 * 3000
    # the corpus: a flaw_prob share of completions scores 0
    answers = {}
    for problem in itertools.islice(tool_task.train_problems(config, "tool-corpus/0/0"), 4000):
        answers[problem.prompt] = problem.answer
    spec = tool_task.task_spec()
    pairs = list(itertools.islice(spec.corpus(0, 0.3), 4000))
    rewards = spec.reward_fn(
        [p for p, _ in pairs], [c for _, c in pairs], answer=[answers[p] for p, _ in pairs]
    )
    assert set(rewards) == {0.0, 1.0}
    assert 0.26 < rewards.count(0.0) / len(rewards) < 0.34


def test_tools_registered_on_import_idempotently_and_in_workers():
    registry = tool_verifier.registered_tools()
    assert all(registry[name].fn is tool.fn for name, tool in tool_task.TOOLS.items())
    tool_task.register_tools()  # again: no error, nothing changes
    assert tool_verifier.registered_tools() == registry
    # a worker that unpickles the reward function has the tools registered
    script = (
        "import pickle, sys\n"
        "fn = pickle.loads(sys.stdin.buffer.read())\n"
        "from rlvr.verifiers.tool import registered_tools, tool_reward\n"
        "assert {'sum', 'sub', 'mul'} <= set(registered_tools())\n"
        'c = \'{"name": "mul", "arguments": {"a": 17, "b": 25}}\'\n'
        "print(fn(['p'], [c], answer=[425]), tool_reward(['p'], [c], answer=[425]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=pickle.dumps(tool_task.task_spec().reward_fn),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["[1.0]", "[1.0]"]


def test_a_foreign_tool_of_the_same_name_is_left_alone():
    tool_verifier.unregister_tool("sum")
    try:
        tool_verifier.register_tool("sum", {"type": "object"}, lambda **kw: 0)
        with pytest.warns(RuntimeWarning, match="already registered"):
            tool_task.register_tools()
        assert tool_verifier.registered_tools()["sum"].fn is not tool_task.tool_sum
        # the task still grades with its own tools
        assert tool_task.tool_task_score(tool_task.Problem("sum", 17, 25).solution, {"answer": 42})
    finally:
        tool_verifier.register_tool("sum", tool_task._SCHEMA, tool_task.tool_sum, replace=True)


@pytest.mark.parametrize("name", SPECS)
def test_slips_are_habits_so_the_base_solves_some_problems_and_not_others(name):
    """At the lab's default flaw rate the commonest completion is a habitual slip for some
    problem types and the correct one for the others (what greedy decoding of a base follows)."""
    if name == "code":
        problems = code_task.train_problems(code_task.CodeTaskConfig(), "code-corpus/0/0")
    else:
        problems = tool_task.train_problems(tool_task.ToolTaskConfig(), "tool-corpus/0/0")
    by_prompt = {p.prompt: p for p in itertools.islice(problems, 8000)}
    counts: dict[str, Counter] = {}
    for prompt, completion in itertools.islice(SPECS[name]().corpus(0, 0.65), 8000):
        problem = by_prompt[prompt]
        if name == "code":
            group = problem.template
            habit = code_task.HABITS[group][2].format(a=problem.a, b=problem.b)
            habit = code_task.BODY_PREFIX + habit
        else:
            group = problem.tool
            habit = {
                "sum": None,  # its habit (an operand off by one) has two forms per operand
                "sub": tool_task._call("sub", problem.b, problem.a),
                "mul": tool_task._call("sum", problem.a, problem.b),
            }[group]
        shape = (
            "correct"
            if completion == problem.solution
            else "habit"
            if completion == habit
            else "other"
        )
        counts.setdefault(group, Counter())[shape] += 1
    correct_wins = {g for g, c in counts.items() if c["correct"] > c["habit"]}
    if name == "code":
        assert correct_wins == {"lin_add", "lin_sub", "steep", "mod"}
    else:
        assert correct_wins == {"sum"}
    for c in counts.values():  # the other slips never outnumber the winner
        assert c["other"] < max(c["correct"], c["habit"])
