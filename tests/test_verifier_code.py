"""Tests for the code verifier (rlvr.verifiers.code) and its sandbox (rlvr.verifiers.sandbox).

Hostile programs run with 1 s limits. After every sandboxed run the `runs` fixture checks that
nothing is left: no process in the run's session or under its private uid (zombies included),
and no temporary directory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

from rlvr.verifiers import code as code_verifier
from rlvr.verifiers import sandbox
from rlvr.verifiers.code import code_reward, extract_code, score, verify, verify_batch
from rlvr.verifiers.sandbox import (
    SandboxLimits,
    SandboxResult,
    processes_in_session,
    processes_of_uid,
    run_python_many,
    sandbox_capabilities,
)

FAST = SandboxLimits(wall_s=1.0, cpu_s=1, memory_mb=256)
SLACK_S = 2.0  # start-up, the final sweep, a loaded 2-core machine

ADD = "def f(x):\n    return x + 1\n"
ADD_TESTS = ["assert f(1) == 2", "assert f(2) == 3", "assert f(-1) == 0"]

CAPS = sandbox_capabilities()
NPROC_BINDS = CAPS["rlimits"] and (CAPS["unprivileged_user"] or CAPS["user_namespace"])
PARENT_UNREACHABLE = CAPS["unprivileged_user"] or CAPS["pid_namespace"]


def _leftovers(result: SandboxResult) -> list[int]:
    found = set(processes_in_session(result.session_id, include_zombies=True))
    if result.uid is not None:
        found |= set(processes_of_uid(result.uid, include_zombies=True))
    return sorted(found)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SandboxResult]]:
    """Record every sandbox run of the test; afterwards assert that none left anything."""
    recorded: list[SandboxResult] = []

    def recording(*args, **kwargs):
        result = run_python_many(*args, **kwargs)
        recorded.append(result)
        return result

    monkeypatch.setattr(code_verifier, "run_python_many", recording)
    yield recorded
    for result in recorded:
        deadline = time.monotonic() + 2.0
        while _leftovers(result) and time.monotonic() < deadline:
            time.sleep(0.02)  # a zombie being reaped by its (gone) parent's reaper
        assert _leftovers(result) == [], f"processes left by session {result.session_id}"
        assert result.workdir and not os.path.exists(result.workdir)


def _timed(
    program: str, tests: list[str], limits: SandboxLimits = FAST
) -> tuple[float, dict, float]:
    start = time.monotonic()
    reward, parts = verify(program, tests, limits)
    return reward, parts, time.monotonic() - start


def _reasons(parts: dict) -> list[str]:
    return [t["reason"] for t in parts["tests"]]


# --- honest programs --------------------------------------------------------------------------


def test_correct_program_passes_every_test(runs) -> None:
    reward, parts = verify(ADD, ADD_TESTS, FAST)
    assert reward == 1.0
    assert parts["reason"] == "passed" and parts["passed"] == parts["total"] == 3
    assert _reasons(parts) == ["passed"] * 3
    assert all(t["check"] == "parent" for t in parts["tests"])
    assert len(runs) == 1 and len(runs[0].runs) == 3  # one sandbox, a fresh process per test
    assert all(run.completed and run.returncode == 0 for run in runs[0].runs)


def test_wrong_and_partial_programs_score_the_pass_fraction(runs) -> None:
    reward, wrong = verify("def f(x):\n    return 100\n", ADD_TESTS, FAST)
    assert reward == 0.0
    assert wrong["reason"] == "wrong" and _reasons(wrong) == ["wrong"] * 3
    partial = "def f(x):\n    return x + 1 if x > 0 else 5\n"
    reward, parts = verify(partial, ADD_TESTS, FAST)
    assert reward == pytest.approx(2 / 3)
    assert parts["reason"] == "partial" and _reasons(parts) == ["passed", "passed", "wrong"]


def test_syntax_error_scores_zero_without_running(runs) -> None:
    reward, parts = verify("def f(x)\n    return x\n", ADD_TESTS, FAST)
    assert reward == 0.0 and parts["reason"] == "syntax_error"
    assert _reasons(parts) == ["syntax_error"] * 3
    assert runs == []


def test_exceptions_and_invalid_tests(runs) -> None:
    program = "def f(x):\n    if x == 2:\n        raise ValueError('no')\n    return x + 1\n"
    reward, parts = verify(program, [*ADD_TESTS, "x = 1", "assert f(1) =="], FAST)
    assert reward == pytest.approx(2 / 5)
    assert _reasons(parts) == ["passed", "crash", "passed", "invalid_test", "invalid_test"]
    assert parts["tests"][1]["detail"] == "raised ValueError"
    # comparing None with an int raises in the parent: the assertion failed
    reward, parts = verify("def f(x):\n    return None\n", ["assert f(1) < 3"], FAST)
    assert reward == 0.0 and parts["tests"][0]["reason"] == "wrong"


def test_module_level_failure_is_not_rerun(runs) -> None:
    reward, parts = verify("raise RuntimeError('boom')\n", ADD_TESTS, FAST)
    assert reward == 0.0 and _reasons(parts) == ["crash"] * 3
    assert [run.completed for run in runs[0].runs] == [True, False, False]
    assert "not rerun" in parts["tests"][2]["detail"]


@pytest.mark.parametrize(
    ("program", "test"),
    [
        (
            "def f():\n    return {1: [2, (3, 4.5)], 'k': {5}}\n",
            "assert f() == {1: [2, (3, 4.5)], 'k': {5}}",
        ),
        ("def f():\n    return None\n", "assert f() is None"),
        ("def f():\n    return 0.1 + 0.2\n", "assert math.isclose(f(), 0.3, rel_tol=1e-9)"),
        ("def f():\n    return 0.1 + 0.2\n", "assert abs(f() - 0.3) < 1e-9"),
        ("def f(x):\n    return x * 2\n", "assert list(map(f, [1, 2])) == [2, 4]"),
        ("def f():\n    return (i * i for i in range(3))\n", "assert list(f()) == [0, 1, 4]"),
        ("def f():\n    return [3, 1, 2]\n", "assert sorted(f()) == [1, 2, 3]"),
        ("def f():\n    return ['bb', 'a']\n", "assert sorted(f(), key=len) == ['a', 'bb']"),
        ("def f():\n    return ' Hi '\n", "assert f().strip().lower() == 'hi'"),
        ("def f():\n    return 2 ** 200\n", "assert f() == 2 ** 200"),
        ("def f():\n    return float('inf')\n", "assert f() == float('inf')"),
        ("def f():\n    return b'ab'\n", "assert f() == b'ab'"),
        ("def f():\n    return True\n", "assert f()"),
        ("def f():\n    return []\n", "assert not f()"),
        ("def f(x):\n    return x\n", "assert [f(i) for i in range(3)] == [0, 1, 2]"),
        ("def f():\n    return 'abc'\n", "assert f()[::-1] == 'cba' and len(f()) == 3"),
        (
            "import collections\ndef f():\n    return collections.Counter('aab')\n",
            "assert f() == {'a': 2, 'b': 1}",
        ),
        (
            "import collections\nP = collections.namedtuple('P', 'x y')\n"
            "def f():\n    return P(1, 2)\n",
            "assert f() == (1, 2)",
        ),
        ("ANSWER = 42\n", "assert ANSWER == 42"),
        ("def f():\n    return 7\n", "assert isinstance(f(), int) and type(f()) is int"),
        ("def f(x):\n    return x\n", "assert f(3) == 3, 'message is ignored'"),
        ("def f():\n    return 3\n", "f() == 3"),  # a bare expression works like assert
    ],
)
def test_plain_data_values_pass(program: str, test: str) -> None:
    reward, parts = verify(program, [test], FAST)
    assert reward == 1.0, parts
    assert parts["tests"][0]["check"] == "parent"


def test_comparisons_inside_the_sandbox_are_marked_child_checked() -> None:
    reward, parts = verify(ADD, ["assert all(f(i) == i + 1 for i in range(3))"], FAST)
    assert reward == 1.0
    assert parts["child_checked"] == 1 and parts["tests"][0]["check"] == "child"


def test_never_raises_on_bad_input() -> None:
    assert verify(None, ADD_TESTS)[1]["reason"] == "no_code"  # type: ignore[arg-type]
    assert verify(ADD, None)[1]["reason"] == "error"  # type: ignore[arg-type]
    assert verify(ADD, [])[1]["reason"] == "no_tests"
    assert verify("x" * 70_000, ADD_TESTS)[1]["reason"] == "too_long"
    assert verify("print('\0')", ADD_TESTS)[1]["reason"] == "syntax_error"
    assert verify(ADD, [None, 3])[0] == 0.0  # type: ignore[list-item]
    assert score(ADD, ["assert f(1) == 2"], FAST) == 1.0


# --- extraction and the TRL form --------------------------------------------------------------


def test_extract_code() -> None:
    assert extract_code("x\n```python\na = 1\n```\ntext\n```python\nb = 2\n```\nbye") == "b = 2\n"
    assert extract_code("```py\na = 1\n```") == "a = 1\n"
    assert extract_code("```\na = 1\n```") == "a = 1\n"  # a bare fence when no python fence
    assert extract_code("```python\na = 1\n```\n```\nnot this\n```") == "a = 1\n"
    assert extract_code("def f(): pass") == "def f(): pass"  # no fence: the whole completion
    assert extract_code("```python\na = 1") == "a = 1"  # truncated: the rest of the text
    assert extract_code("<think>```python\nwrong\n```</think>```python\nright\n```") == "right\n"
    assert extract_code("<think>```python\nunfinished\n```") is None
    assert extract_code([{"role": "assistant", "content": "```python\nc = 3\n```"}]) == "c = 3\n"
    assert extract_code(None) is None  # type: ignore[arg-type]


def test_code_reward_trl_batch() -> None:
    completions = [
        f"Here:\n```python\n{ADD}```",
        "```python\ndef f(x):\n    return x\n```",
        "```python\ndef f(x) return x\n```",
        [{"role": "assistant", "content": f"```python\n{ADD}```"}],
        None,
    ]
    tests = [ADD_TESTS, ADD_TESTS, ADD_TESTS, ["assert f(0) == 1"], ADD_TESTS]
    rewards = code_reward(["p"] * 5, completions, tests=tests, trainer_state=None)
    assert rewards == [1.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError):
        code_reward(["p"], ["a", "b"], tests=[ADD_TESTS])


def test_pooled_batch_keeps_order() -> None:
    programs = [f"def f(x):\n    return x + {k}\n" for k in range(6)]
    results = verify_batch(programs, [["assert f(0) == 3"]] * 6, workers=2, limits=FAST)
    assert [r for r, _ in results] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]


# --- hostile programs -------------------------------------------------------------------------


def test_infinite_loop_times_out(runs) -> None:
    reward, parts, elapsed = _timed("while True:\n    pass\n", ADD_TESTS)
    assert reward == 0.0 and _reasons(parts) == ["timeout"] * 3
    # the module never finished: the other tests are not rerun
    assert [run.completed for run in runs[0].runs] == [True, False, False]
    assert elapsed < FAST.wall_s + SLACK_S


def test_infinite_loop_in_the_function_times_out_each_test(runs) -> None:
    program = "def f(x):\n    while True:\n        pass\n"
    reward, parts, elapsed = _timed(program, ADD_TESTS[:2])
    assert reward == 0.0 and _reasons(parts) == ["timeout"] * 2
    assert elapsed < 2 * FAST.wall_s + SLACK_S


@pytest.mark.skipif(not CAPS["rlimits"], reason="resource limits unavailable here")
def test_cpu_limit_without_wall_clock(runs) -> None:
    limits = SandboxLimits(wall_s=10.0, cpu_s=1, memory_mb=256)
    reward, parts, elapsed = _timed("while True:\n    pass\n", ["assert f(1) == 2"], limits)
    assert reward == 0.0 and parts["tests"][0] == {**parts["tests"][0], "reason": "timeout"}
    assert parts["tests"][0]["detail"] == "cpu limit"
    assert elapsed < 3.0 + SLACK_S


@pytest.mark.skipif(not NPROC_BINDS, reason="RLIMIT_NPROC does not bind here (no private user)")
def test_fork_bomb_is_bounded_and_cleaned_up(runs) -> None:
    bomb = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    reward, parts, elapsed = _timed(bomb, ["assert f(1) == 2"])
    assert reward == 0.0 and parts["tests"][0]["reason"] == "timeout"
    assert elapsed < FAST.wall_s + SLACK_S
    # an escaped daemon (new session, so outside the process group) is killed too
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n" + ADD
    assert verify(daemon, ["assert f(1) == 2"], FAST)[0] == 1.0


@pytest.mark.skipif(not CAPS["pid_namespace"] or not CAPS["chroot"], reason="no PID/mount ns")
def test_nothing_carries_over_between_tests(runs) -> None:
    # each test's process sees a clean /work and /tmp and no process of an earlier test
    program = (
        "import os, time\n"
        "FILES = sorted(os.listdir('.') + os.listdir('/tmp'))\n"
        "PIDS = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "open('left.txt', 'w').write('x')\n"
        "open('/tmp/left.txt', 'w').write('x')\n"
        "if os.fork() == 0:\n"
        "    time.sleep(60)\n"
        "def f():\n"
        "    return FILES, len(PIDS)\n"
    )
    reward, parts = verify(program, ["assert f() == ([], 2)"] * 3, FAST)  # manager + itself
    assert reward == 1.0, parts


@pytest.mark.skipif(not CAPS["unprivileged_user"], reason="needs root for the private uid")
@pytest.mark.parametrize("without", [("pid_namespace",), ("pid_namespace", "chroot")])
def test_fallbacks_still_clean_up(runs, monkeypatch: pytest.MonkeyPatch, without) -> None:
    # machines without some namespaces take other code paths: the manager then sweeps the
    # private uid through /proc between tests
    steps = sandbox._steps()
    monkeypatch.setattr(sandbox, "_steps", lambda: {**steps, **dict.fromkeys(without, False)})
    daemon = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n" + ADD
    reward, parts, elapsed = _timed(daemon, ADD_TESTS)
    assert reward == 1.0, parts
    assert runs[0].leftover_killed == 0  # the manager had already killed every daemon
    assert elapsed < FAST.wall_s + SLACK_S


@pytest.mark.parametrize(
    "program",
    [
        "x = bytearray(1 << 40)\n",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))\n",
        "def f(x):\n    return [0] * (1 << 36)\n",
    ],
)
@pytest.mark.skipif(not CAPS["rlimits"], reason="resource limits unavailable here")
def test_memory_bomb(runs, program: str) -> None:
    reward, parts, elapsed = _timed(program, ["assert f(1) == 2"])
    assert reward == 0.0 and parts["tests"][0]["reason"] == "memory"
    assert elapsed < FAST.wall_s + SLACK_S


def test_huge_output_is_harmless(runs) -> None:
    noisy = (
        "import sys\n"
        "for _ in range(2000):\n"
        "    print('PASS ' * 5000)\n"  # 50 MB to stdout (discarded)
        "sys.stderr.write('PASS\\n' * 200000)\n" + ADD  # 1 MB to stderr (capped)
    )
    reward, parts, elapsed = _timed(noisy, ["assert f(1) == 2", "assert f(1) == 5"])
    assert reward == 0.5  # printing neither helps nor hurts: the honest fraction
    assert elapsed < 2 * FAST.wall_s + SLACK_S
    assert all(len(r.stderr) <= FAST.stderr_bytes for r in runs)


def test_flooding_the_result_pipe_and_huge_values_fail(runs) -> None:
    flood = (
        "import os\n"
        "for fd in range(3, 256):\n"  # the result pipe is one of them
        "    try:\n"
        "        os.write(fd, b'x' * (5 << 20))\n"
        "    except OSError:\n"
        "        pass\n" + ADD
    )
    reward, parts, elapsed = _timed(flood, ["assert f(1) == 2"])
    assert reward == 0.0 and parts["tests"][0]["reason"] == "crash"
    assert elapsed < FAST.wall_s + SLACK_S
    reward, parts = verify("def f():\n    return 'x' * (1 << 22)\n", ["assert f() == 'x'"], FAST)
    assert reward == 0.0 and parts["tests"][0]["detail"] == "value too large"


@pytest.mark.skipif(not CAPS["chroot"], reason="no private root: /etc/passwd is readable (public)")
def test_host_files_are_not_visible(runs) -> None:
    program = "def f():\n    return open('/etc/passwd').read()[:5]\n"
    reward, parts = verify(program, ["assert f() == 'root:'"], FAST)
    assert reward == 0.0 and parts["tests"][0]["detail"] == "raised FileNotFoundError"
    here = os.path.abspath(__file__)
    program = f"import os\ndef f():\n    return os.path.exists({here!r})\n"
    assert verify(program, ["assert f() is False"], FAST)[0] == 1.0


@pytest.mark.skipif(not PARENT_UNREACHABLE, reason="the sandbox runs as the trainer's user")
def test_parent_secrets_are_not_visible(runs, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cr3t-" + os.urandom(8).hex()
    monkeypatch.setenv("RLVR_FAKE_SECRET", secret)
    program = (
        "import os\n"
        "def env():\n"
        "    return os.environ.get('RLVR_FAKE_SECRET')\n"
        "def scan():\n"
        "    found = []\n"
        "    for pid in os.listdir('/proc') if os.path.isdir('/proc') else []:\n"
        "        for name in ('environ', 'cmdline'):\n"
        "            try:\n"
        "                with open(f'/proc/{pid}/{name}', 'rb') as fh:\n"
        "                    data = fh.read()\n"
        "            except OSError:\n"
        "                continue\n"
        f"            if {secret.encode()!r} in data:\n"
        "                found.append(pid)\n"
        "    return found\n"
        "def keys():\n"
        "    return sorted(os.environ)\n"
    )
    tests = [f"assert env() == {secret!r}", "assert scan()", "assert 'RLVR_FAKE_SECRET' in keys()"]
    reward, parts = verify(program, tests, FAST)
    assert reward == 0.0, parts
    assert _reasons(parts) == ["wrong"] * 3


@pytest.mark.skipif(not CAPS["chroot"], reason="no private root: world-writable dirs are shared")
def test_writes_outside_the_work_directory_do_not_reach_the_host(runs) -> None:
    outside = tempfile.mkdtemp(prefix="rlvr-outside-")
    os.chmod(outside, 0o777)  # even a world-writable host directory
    targets = [
        os.path.join(outside, "escaped"),
        f"/tmp/rlvr-escaped-{os.getpid()}",
        f"/dev/shm/rlvr-escaped-{os.getpid()}",
        os.path.join(os.getcwd(), f"rlvr-escaped-{os.getpid()}"),
        "/root/rlvr-escaped",
    ]
    program = (
        "import os\n"
        "def f():\n"
        "    wrote = 0\n"
        f"    for path in {targets!r} + ['../escaped', '/escaped', 'here.txt']:\n"
        "        try:\n"
        "            with open(path, 'w') as fh:\n"
        "                fh.write('pwned')\n"
        "            wrote += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "    return wrote\n"
    )
    try:
        reward, parts = verify(program, ["assert f() >= 0"], FAST)
        assert reward == 1.0  # honest: the program may write in its own sandbox
        for path in targets:
            assert not os.path.exists(path), path
        assert os.listdir(outside) == []
    finally:
        for path in targets:
            if os.path.exists(path):
                os.remove(path)
        os.rmdir(outside)


@pytest.mark.skipif(not CAPS["network_namespace"], reason="no network namespace here")
def test_network_is_unreachable_even_on_loopback(runs) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))  # loopback only: never an outside address
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    program = (
        "import socket\n"
        "def f():\n"
        "    try:\n"
        f"        socket.create_connection(('127.0.0.1', {port}), timeout=0.5).sendall(b'hi')\n"
        "        return 'connected'\n"
        "    except OSError as exc:\n"
        "        return type(exc).__name__\n"
    )
    try:
        reward, parts = verify(program, ["assert f() == 'connected'"], FAST)
        assert reward == 0.0 and parts["tests"][0]["reason"] == "wrong"
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()


@pytest.mark.skipif(not CAPS["chroot"], reason="no private root: shells are present")
def test_no_shell_or_other_binary(runs) -> None:
    marker = f"/tmp/rlvr-shell-{os.getpid()}"
    program = (
        "import os, subprocess\n"
        "def f():\n"
        f"    command = ['sh', '-c', 'echo pwned; touch {marker}']\n"
        "    out = subprocess.run(command, capture_output=True)\n"
        "    return out.stdout.decode().strip()\n"
        "def g():\n"
        f"    return os.system('touch {marker}')\n"
    )
    reward, parts = verify(program, ["assert f() == 'pwned'", "assert g() == 0"], FAST)
    assert reward == 0.0
    assert parts["tests"][0]["detail"] == "raised FileNotFoundError"
    assert not os.path.exists(marker)


@pytest.mark.skipif(not PARENT_UNREACHABLE, reason="the sandbox runs as the trainer's user")
def test_cannot_kill_the_parent_or_its_processes(runs) -> None:
    bystander = subprocess.Popen(["sleep", "30"])  # a process of the trainer's user
    try:
        program = (
            "import os, signal\n"
            f"for pid in (os.getppid(), {os.getpid()}, {bystander.pid}, 1):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError:\n"
            "        pass\n"
            "try:\n"
            f"    os.killpg({os.getpgid(bystander.pid)}, signal.SIGKILL)\n"
            "except OSError:\n"
            "    pass\n" + ADD
        )
        reward, _ = verify(program, ["assert f(1) == 2"], FAST)
        assert reward == 1.0  # the kills failed; the program went on honestly
        blunt = "import os\nos.kill(os.getppid(), 9)\n" + ADD
        assert verify(blunt, ["assert f(1) == 2"], FAST)[0] == 0.0
        assert bystander.poll() is None  # still alive (and so is this test process)
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


FAKES = {
    "sys.exit": "import sys\nsys.exit(0)\n",
    "os._exit": "import os\nos._exit(0)\n",
    "SystemExit in f": "def f(x):\n    raise SystemExit(0)\n",
    "kill self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "print PASS": (
        "print('PASS')\nprint('All tests passed')\nimport sys\nsys.stderr.write('OK\\n')\n"
        "def f(x):\n    return 0\n"
    ),
    "patch builtins": (
        "import builtins\n"
        "builtins.AssertionError = type('Never', (BaseException,), {})\n"
        "builtins.bool = lambda *a: True\n"
        "builtins.isinstance = lambda *a: True\n"
        "builtins.eval = lambda *a, **k: True\n"
        "def f(x):\n    return 0\n"
    ),
    "always equal": (
        "class A:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "    __hash__ = object.__hash__\n"
        "def f(x):\n    return A()\n"
    ),
    "int subclass equal to all": (
        "class I(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n"
        "def f(x):\n    return I(0)\n"
    ),
    "fake __class__": (
        "class F:\n    __class__ = int\n    def __eq__(self, o):\n        return True\n"
        "def f(x):\n    return F()\n"
    ),
    "truthy non-bool eq": (
        "class T:\n    def __eq__(self, other):\n        return [1]\ndef f(x):\n    return T()\n"
    ),
    "patch os._exit and atexit": (
        "import os, atexit\n"
        "atexit.register(lambda: print('PASS'))\n"
        "os._exit = lambda code: None\n"
        "def f(x):\n    return 0\n"
    ),
    "write fake results to every fd": (
        "import os\n"
        "for fd in range(0, 20):\n"
        "    for line in (b'PASS\\n', b'[\"value\", 0, [\"i\", \"5\"]]\\n', b'1\\n'):\n"
        "        try:\n"
        "            os.write(fd, line)\n"
        "        except OSError:\n"
        "            pass\n"
        "def f(x):\n    return 0\n"
    ),
    "forge through the driver": (
        # finds the harness's emit() by introspection and sends invented verdicts, then exits
        # before the real ones; a forged *value* is all it could send, and it cannot know 5.
        "import os, sys\n"
        "frame = sys._getframe()\n"
        "while frame is not None and 'emit' not in frame.f_locals:\n"
        "    frame = frame.f_back\n"
        "emit = frame.f_locals['emit']\n"
        "emit(['exec_ok'])\n"
        "emit(['value', 0, True])\n"
        "emit(['passed', 0])\n"
        "os._exit(0)\n"
    ),
    "raise in __eq__": (
        "class E:\n    def __eq__(self, o):\n        raise AssertionError\n"
        "def f(x):\n    return E()\n"
    ),
}


@pytest.mark.parametrize("name", list(FAKES))
def test_faking_a_pass_scores_zero(runs, name: str) -> None:
    reward, parts, elapsed = _timed(FAKES[name], ["assert f(2) == 5"])
    assert reward == 0.0, parts
    assert parts["tests"][0]["reason"] in {"wrong", "crash"}
    assert elapsed < FAST.wall_s + SLACK_S
