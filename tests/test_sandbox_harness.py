"""Unit tests of the sandbox's child code, imported as modules (no sandbox is started here).

`rlvr.verifiers.sandbox_harness` and `rlvr.verifiers.sandbox_probe` run inside the sandbox;
tests/test_verifier_code.py runs them there. These call their pure helpers directly.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from rlvr.verifiers import sandbox, sandbox_harness, sandbox_probe
from rlvr.verifiers.sandbox_harness import (
    DONE,
    MESSAGE,
    PROTECTIONS,
    STARTED,
    Relay,
    clear_dir,
    drain,
    exit_code,
    frame,
    live_processes_of,
    make_job,
    message_head,
    rlimit_values,
    status_owner,
    write_all,
)


def _relay(stop_marker: object = None, cap: int = 1000) -> tuple[Relay, list[bytes]]:
    sent: list[bytes] = []
    return Relay(sent.append, message_head(b"NONCE", 3), cap, stop_marker), sent


def test_importing_the_harness_runs_nothing() -> None:
    # In a fresh interpreter with stdin closed: an import that read the job would fail.
    code = "import rlvr.verifiers.sandbox_harness as h; print(h.STARTED)"
    done = subprocess.run(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == b"started\n"


def test_the_parent_sends_this_module() -> None:
    path = os.path.join(os.path.dirname(sandbox_harness.__file__), "sandbox_harness.py")
    with open(path, encoding="utf-8") as f:
        assert sandbox.module_source("sandbox_harness") == f.read()
    assert sandbox._harness_bytecode() == sandbox._harness_bytecode()  # compiled once, cached


def test_steps_and_job_keys_are_the_declared_ones() -> None:
    tree = ast.parse(sandbox.module_source("sandbox_harness"))
    stepped = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "step"
        and isinstance(node.args[0], ast.Constant)
    }
    assert stepped == set(PROTECTIONS) - {"process_group"}  # the parent's Popen does that one
    read = {
        node.slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.value, (ast.Name, ast.Attribute))
        and getattr(node.value, "id", getattr(node.value, "attr", None)) == "job"
        and isinstance(node.slice, ast.Constant)
    }
    keys = make_job(
        nonce="n",
        result_fd=3,
        steps={},
        probe=False,
        limits={},
        uid=None,
        root="/r",
        workdir="/w",
        binds=[],
        symlinks=[],
        driver="",
        payloads=[],
        stop_marker=None,
    )
    assert read == set(keys)


def test_relay_tags_complete_lines_with_the_index() -> None:
    relay, sent = _relay()
    assert relay.feed(b'["a"]\n[1, 2]\n["par')
    assert sent == [b'NONCE["m",3,["a"]]\n', b'NONCE["m",3,[1, 2]]\n']
    assert relay.feed(b'tial"]\n')  # the rest of a line arrives in a later read
    assert sent[-1] == b'NONCE["m",3,["partial"]]\n'
    # the manager's framing is what the parent parses: a message of run 3
    assert json.loads(sent[-1][len(b"NONCE") :]) == [MESSAGE, 3, ["partial"]]


def test_relay_watches_for_the_stop_marker() -> None:
    relay, _ = _relay(stop_marker=["exec_ok"])
    assert not relay.saw_marker
    relay.feed(b'["exec_error", "X"]\nnot json\n')
    assert not relay.saw_marker
    relay.feed(b'["exec_ok"]\n')
    assert relay.saw_marker
    long_marker, _ = _relay(stop_marker=["x" * 300])
    long_marker.feed(json.dumps(["x" * 300]).encode() + b"\n")
    assert not long_marker.saw_marker  # lines of 200 bytes or more are never parsed
    assert _relay(stop_marker=None)[0].saw_marker  # no marker: every run counts


def test_relay_refuses_more_than_its_cap() -> None:
    relay, sent = _relay(cap=10)
    assert relay.feed(b"12345\n")
    assert not relay.feed(b"678901\n")  # 13 bytes in all
    assert len(sent) == 1


def test_drain_reads_what_is_left_without_waiting() -> None:
    read_fd, write_fd = os.pipe()
    try:
        write_all(write_fd, b"[1]\n[2]\n")
        relay, sent = _relay()
        assert drain(read_fd, relay) is False  # nothing more, writer still open: no blocking
        assert len(sent) == 2
        write_all(write_fd, b"x" * 2000 + b"\n")
        assert drain(read_fd, relay) is True  # over the cap
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_frame_is_one_compact_line() -> None:
    assert frame([DONE, 0, {"status": 0}]) == b'["done",0,{"status":0}]\n'
    line = b"NONCE" + frame([STARTED])
    assert sandbox._decode_line(line, b"NONCE") == [STARTED]
    assert sandbox._decode_line(frame([STARTED]), b"NONCE") is None  # no nonce: ignored


def test_done_info_reaches_the_parent_s_result() -> None:
    result = sandbox.SandboxResult(runs=[sandbox.RunResult()])
    info = {"status": 137, "cpu_s": 0.5, "wall_s": 1.0, "timed_out": True, "overflow": False}
    assert sandbox._accept(json.loads(frame([DONE, 0, info])), result)
    run = result.runs[0]
    assert run.completed and run.timed_out and run.signal == 9 and run.cpu_s == 0.5


def test_rlimit_values_follow_the_limits() -> None:
    limits = {"cpu_s": 3, "memory_mb": 512, "nproc": 8, "fsize_mb": 16, "nofile": 64}
    assert dict(rlimit_values(limits)) == {
        "RLIMIT_CPU": (3, 4),  # the hard limit one second later: SIGXCPU first, then SIGKILL
        "RLIMIT_AS": (512 << 20, 512 << 20),
        "RLIMIT_NPROC": (8, 8),
        "RLIMIT_FSIZE": (16 << 20, 16 << 20),
        "RLIMIT_NOFILE": (64, 64),
        "RLIMIT_CORE": (0, 0),
    }


def test_status_owner_and_the_proc_scan() -> None:
    status = b"Name:\tpython\nState:\tZ (zombie)\nUid:\t1000\t1000\t1000\t1000\n"
    assert status_owner(status) == (1000, True)
    assert status_owner(b"State:\tS (sleeping)\nUid:\t0\t0\t0\t0\n") == (0, False)
    with pytest.raises(KeyError):
        status_owner(b"Name:\tpython\n")
    proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert os.getpid() in live_processes_of(proc_fd, os.getuid())
    finally:
        os.close(proc_fd)


def test_exit_code_reports_signals_as_128_plus_n() -> None:
    assert exit_code(3 << 8) == 3  # exited with 3
    assert exit_code(9) == 137  # killed by SIGKILL


def test_clear_dir_empties_without_following_links(tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    work = tmp_path / "work"
    (work / "a" / "b").mkdir(parents=True)
    (work / "a" / "b" / "f").write_text("x")
    (work / "g").write_text("x")
    (work / "link").symlink_to(outside)
    clear_dir(str(work))
    assert work.is_dir() and list(work.iterdir()) == []
    assert (outside / "keep").exists()


def test_probe_driver_helpers() -> None:
    assert sandbox_probe.stdlib_checks() == {"stdlib": True}
    assert sandbox_probe.fork_works() is True
    assert sandbox_probe.loopback() in ("connected", "refused", "unreachable")
    emitted: list = []
    sandbox_probe.main(None, emitted.append)
    assert emitted[0][0] == sandbox_probe.CHECKS
    assert set(emitted[0][1]) == {"uid", "etc_visible", "loopback", "stdlib", "fork"}
