"""Run untrusted Python in a throw-away sandbox; results come back on a private pipe.

Sandbox policy
--------------
One sandbox is one fresh interpreter (``python -s -S -B``: no site, no user site, no bytecode
files, ``''`` and the working directory removed from ``sys.path``; the environment is replaced
by a minimal one, so ``-E`` is not needed and ``PYTHONHASHSEED=0`` makes runs reproducible).
A small trusted *harness* (`rlvr.verifiers.sandbox_harness`) sets the protections up and becomes the
*manager*: for each payload it forks a fresh *child*, which applies the per-process limits,
drops to an unprivileged user, and only then calls the caller's *driver*
(``main(payload, emit)``); the driver runs the untrusted code. The manager never runs untrusted
code and keeps its privileges: it enforces each child's wall clock, relays what the child
emits, and between children kills everything the last one left and empties ``/work`` and
``/tmp``. Protections, in the order they are applied:

  * Own session and process group (``start_new_session``); at the end the harness is asked to
    stop (SIGTERM: it kills the untrusted side and reaps it), then the whole group is SIGKILLed,
    and without a PID namespace every process of the sandbox's private uid is swept (``/proc``
    scan), so a ``setsid`` daemon does not survive either.
  * Namespaces, where the kernel allows: network (``CLONE_NEWNET``: only a down loopback, so no
    connection reaches anything, not even 127.0.0.1), mount, IPC, UTS and PID (the manager is
    PID 1 of the new namespace: the untrusted code sees no process outside it, and when the
    manager exits the kernel kills every process left in it). Without root, a user namespace is
    created first (if unprivileged user namespaces are enabled) and the others inside it.
  * Filesystem: with a mount namespace, a new root (``chroot``) on a size-limited tmpfs
    holding read-only, nosuid bind mounts of the shared-library directories and the
    interpreter's ``lib`` (stdlib) only; ``/dev/{null,zero,random,urandom}``; a fresh ``/proc``
    of the PID namespace; writable ``/work`` (the working directory), ``/tmp`` and ``/dev/shm``
    inside the tmpfs, which vanishes with the namespace. No ``/etc``, no ``/home``, no shells
    or other binaries, no trainer files. Without a mount namespace: a fresh temporary working
    directory, removed afterwards; the sandbox user's permissions protect the rest.
  * Per child: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE,
    RLIMIT_CORE=0, a wall-clock limit (the manager kills it), and a cap on what it emits.
  * An unprivileged user: as root, the children run under a private, otherwise unused uid/gid
    per concurrent sandbox (RLIMIT_NPROC does not bind root; a private uid also cannot signal
    the trainer or another sandbox); without root, inside the user namespace with every
    capability dropped. ``PR_SET_NO_NEW_PRIVS`` and ``PR_SET_PDEATHSIG=SIGKILL`` are set.
  * Output: stdout goes to ``/dev/null``; stderr is read up to a cap. A child does not hold the
    parent's result pipe at all: it writes to a pipe of its own, which the manager relays with
    the child's index, so what a child says cannot be attributed to another child. Lines on the
    result pipe must start with a fresh random nonce; anything else is ignored.

What a child emits is still the untrusted code's word: it shares the process with the driver
and can replace it. Callers must make such forgeries worthless (``rlvr.verifiers.code`` sends
values back and compares them with the expected ones itself).

`sandbox_capabilities()` probes once per process which protections this machine provides (each
is tried, then checked from inside: uid, blocked loopback, hidden ``/etc``, working stdlib),
logs the result once; later sandboxes use exactly those and fail closed if one then fails.
"""

from __future__ import annotations

import functools
import json
import logging
import marshal
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from rlvr.verifiers.sandbox_harness import (
    DONE,
    MESSAGE,
    PROTECTIONS,
    SETUP,
    SETUP_ERROR,
    STARTED,
    make_job,
)
from rlvr.verifiers.sandbox_probe import CHECKS

__all__ = [
    "SandboxLimits",
    "RunResult",
    "SandboxResult",
    "missing_protections",
    "run_python",
    "run_python_many",
    "sandbox_capabilities",
]

logger = logging.getLogger(__name__)

_UID_BASE = 1 << 28  # private uids: _UID_BASE + (parent pid % 2**22) * 64 + slot
_UID_SLOTS = 64


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. CPU and memory apply to each process of the run, NPROC to all of them."""

    wall_s: float = 5.0  # from the moment the untrusted side starts
    cpu_s: int = 5  # RLIMIT_CPU soft limit (SIGXCPU); the hard limit is one second more
    memory_mb: int = 512  # RLIMIT_AS of each process
    nproc: int = 8  # RLIMIT_NPROC: processes and threads of the run's user
    fsize_mb: int = 16  # RLIMIT_FSIZE: largest file it may write
    nofile: int = 64  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of the private root (holds /work and /tmp) with a mount namespace
    result_bytes: int = 4 << 20  # result pipe cap; more kills the run
    stderr_bytes: int = 8192  # stderr kept (the rest is discarded)
    startup_s: float = 20.0  # for the interpreter and harness to come up (loaded machines)


@dataclass
class RunResult:
    """One payload's run: a fresh process, as the manager inside the sandbox observed it."""

    messages: list[Any] = field(default_factory=list)  # what the driver emitted, in order
    completed: bool = False  # the manager reported the run's end (else: the sandbox died)
    returncode: int | None = None  # exit code, or 128 + N when signal N killed it
    signal: int | None = None
    timed_out: bool = False  # wall-clock limit: killed by the manager
    cpu_limited: bool = False  # killed by RLIMIT_CPU (SIGXCPU, or SIGKILL at the hard limit)
    overflow: bool = False  # wrote more than ``result_bytes``: killed by the manager
    cpu_s: float = 0.0  # user + system CPU of the run's process (and reaped descendants)
    wall_s: float = 0.0


@dataclass
class SandboxResult:
    """What the parent observed of one sandbox: ``runs[i]`` for ``payloads[i]``."""

    runs: list[RunResult] = field(default_factory=list)
    started: bool = False  # the manager came up with every protection in place
    timed_out: bool = False  # the parent's own deadline (start-up or backstop) hit
    setup_error: str | None = None  # a protection failed (fail closed), or spawning failed
    setup: dict[str, Any] = field(default_factory=dict)  # the probe's report (probe runs only)
    stderr: str = ""  # the first ``stderr_bytes`` of everything's stderr
    bad_lines: int = 0  # result-pipe lines without the nonce or malformed
    returncode: int | None = None  # the harness's
    session_id: int = 0  # sid = pgid = pid of the harness
    workdir: str = ""  # the host temporary directory (removed before the result is returned)
    uid: int | None = None  # the private uid of the untrusted processes, when there was one
    leftover_killed: int = 0  # processes the parent's final sweep found (should be 0)
    wall_s: float = 0.0

    @property
    def messages(self) -> list[Any]:
        """The first run's messages (the single-payload form, `run_python`)."""
        return self.runs[0].messages if self.runs else []


# --------------------------------------------------------------------------------------------
# Child code: the harness (sandbox_harness.py) and the probe's driver (sandbox_probe.py) are
# ordinary stdlib-only modules of this package; their source is read from the installed files.
# --------------------------------------------------------------------------------------------


def module_source(module: str) -> str:
    """The source of a module of this package (child code is sent to sandboxes as source)."""
    return resources.files(__package__).joinpath(module + ".py").read_text(encoding="utf-8")


# Reads the harness as bytecode from stdin (compiled once per trainer process, by the same
# interpreter version), then the job. Saves compiling the harness in every sandbox. The
# harness runs as __main__, so its main() runs.
_HEADER_DIGITS = 16  # the harness's length, in ASCII digits, comes first
_EXIT_SHORT_READ = 122  # stdin ended before the harness had arrived
_BOOTSTRAP = f"""
import marshal, os
def _read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            os._exit({_EXIT_SHORT_READ})
        data += chunk
    return data
exec(marshal.loads(_read(int(_read({_HEADER_DIGITS})))))
"""


@functools.lru_cache(maxsize=1)
def _harness_bytecode() -> bytes:
    """The harness compiled once per process (the sandbox's interpreter is this one)."""
    return marshal.dumps(compile(module_source("sandbox_harness"), "<sandbox-harness>", "exec"))


@functools.lru_cache(maxsize=1)
def _probe_driver() -> str:
    return module_source("sandbox_probe")


def _python_executable() -> str:
    """The base interpreter (a venv's own site-packages are not wanted in the sandbox)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.lru_cache(maxsize=1)
def _filesystem_view() -> tuple[list[str], list[tuple[str, str]]]:
    """(directories to bind read-only, symlinks to recreate) for the private root."""
    binds: list[str] = []
    symlinks: list[tuple[str, str]] = []
    candidates = ["/usr/lib", "/usr/lib64", "/usr/lib32", "/lib", "/lib64", "/lib32"]
    for prefix in {sys.base_prefix, sys.base_exec_prefix}:
        candidates.append(os.path.join(prefix, "lib"))
    for path in candidates:
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            real = os.path.realpath(path)
            if not any(real == b or real.startswith(b + "/") for b in binds):
                binds.append(real)
    return binds, symlinks


_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "HOME": "/work",
    "TMPDIR": "/tmp",
}

_slots_lock = threading.Condition()
_slots_used: set[int] = set()


class _UidSlot:
    """A private uid for one run (root only): exclusive among this process's concurrent runs."""

    def __init__(self, wanted: bool) -> None:
        self.uid: int | None = None
        self.slot: int | None = None
        self.wanted = wanted

    def __enter__(self) -> int | None:
        if not self.wanted:
            return None
        with _slots_lock:
            while len(_slots_used) >= _UID_SLOTS:
                _slots_lock.wait()
            self.slot = min(set(range(_UID_SLOTS)) - _slots_used)
            _slots_used.add(self.slot)
        self.uid = _UID_BASE + (os.getpid() % (1 << 22)) * _UID_SLOTS + self.slot
        return self.uid

    def __exit__(self, *exc: object) -> None:
        if self.slot is not None:
            with _slots_lock:
                _slots_used.discard(self.slot)
                _slots_lock.notify()


def processes_of_uid(uid: int, *, include_zombies: bool = False) -> list[int]:
    """Pids whose real uid is ``uid`` (a /proc scan)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        try:
            real_uid = int(fields[b"Uid"].split()[0])
        except (KeyError, IndexError, ValueError):
            continue
        zombie = fields.get(b"State", b"").strip().startswith((b"Z", b"X"))
        if real_uid == uid and (include_zombies or not zombie):
            found.append(int(name))
    return found


def processes_in_session(sid: int, *, include_zombies: bool = False) -> list[int]:
    """Pids whose session id is ``sid`` (a /proc scan)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "(comm)": state ppid pgrp session
        if len(fields) > 3 and int(fields[3]) == sid and (include_zombies or fields[0] != b"Z"):
            found.append(int(name))
    return found


def _sweep_uid(uid: int, deadline_s: float = 2.0) -> int:
    """SIGKILL every process of ``uid`` until none is alive; returns how many were found."""
    killed: set[int] = set()
    end = time.monotonic() + deadline_s
    while True:
        alive = processes_of_uid(uid)
        if not alive or time.monotonic() > end:
            return len(killed)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.01)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _run(
    driver: str,
    payloads: list[Any],
    limits: SandboxLimits,
    steps: dict[str, bool],
    probe: bool,
    stop_marker: Any = None,
) -> SandboxResult:
    result = SandboxResult(runs=[RunResult() for _ in payloads])
    nonce = secrets.token_hex(16)
    is_root = os.geteuid() == 0
    host_dir = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    result.workdir = host_dir
    binds, symlinks = _filesystem_view()
    read_fd = write_fd = -1
    proc: subprocess.Popen | None = None
    with _UidSlot(wanted=is_root and steps.get("unprivileged_user", False)) as uid:
        result.uid = uid
        escalated = False
        try:
            if uid is not None:
                os.chown(host_dir, uid, uid)
            read_fd, write_fd = os.pipe()
            job = make_job(
                nonce=nonce,
                result_fd=write_fd,
                steps=steps,
                probe=probe,
                limits=asdict(limits),
                uid=uid,
                root=host_dir,
                workdir=host_dir,
                binds=binds,
                symlinks=symlinks,
                driver=driver,
                payloads=payloads,
                stop_marker=stop_marker,
            )
            harness = _harness_bytecode()
            job_bytes = (
                b"%0*d" % (_HEADER_DIGITS, len(harness)) + harness + json.dumps(job).encode()
            )
            proc = subprocess.Popen(
                [_python_executable(), "-s", "-S", "-B", "-c", _BOOTSTRAP],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=_ENV,
                cwd=host_dir,
                start_new_session=True,
                pass_fds=(write_fd,),
                close_fds=True,
            )
            os.close(write_fd)
            write_fd = -1
            result.session_id = proc.pid
            _communicate(proc, job_bytes, read_fd, nonce.encode(), limits, result)
        except Exception as exc:  # spawning failed: report, never raise
            result.setup_error = result.setup_error or f"spawn: {exc!r}"[:300]
        finally:
            if proc is not None:
                escalated = _finish(proc, uid, result)
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            if proc is not None:
                _kill_group(proc.pid)  # anything left in the group (the harness is gone)
            if uid is not None and (escalated or not steps.get("pid_namespace")):
                # With a PID namespace whose manager exited normally nothing can be left: the
                # kernel killed the namespace when its init died.
                result.leftover_killed = _sweep_uid(uid)
            for run in result.runs:
                if not run.completed and result.timed_out:
                    run.timed_out = True
                run.cpu_limited = run.signal == signal.SIGXCPU or (
                    run.signal == signal.SIGKILL
                    and not run.timed_out
                    and run.cpu_s >= limits.cpu_s - 0.05
                )
            shutil.rmtree(host_dir, ignore_errors=True)
    return result


def _wait(proc: subprocess.Popen, result: SandboxResult, timeout_s: float | None) -> bool:
    """Reap the harness if it has exited (waiting up to ``timeout_s``); False if still running."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while proc.returncode is None:
        try:
            pid, status = os.waitpid(proc.pid, 0 if end is None else os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere
            proc.wait()
            break
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        if end is not None and time.monotonic() >= end:
            return False
        time.sleep(0.002)
    result.returncode = proc.returncode
    return True


def _finish(proc: subprocess.Popen, uid: int | None, result: SandboxResult) -> bool:
    """End the sandbox and reap the harness; True if it had to be SIGKILLed.

    A sandbox still going is stopped through the harness (SIGTERM): it kills the untrusted side
    and reaps it. Killing the harness first would orphan those processes to the host's init; the
    group is SIGKILLed (and the private uid swept) only if the harness does not exit in time.
    """
    escalated = False
    # after a normal end the harness is exiting anyway: give it a moment before SIGTERM
    if not _wait(proc, result, 0.0 if result.timed_out else 0.5):
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass
        if not _wait(proc, result, 2.0):
            escalated = True
            if uid is not None:
                _sweep_uid(uid)
            _kill_group(proc.pid)
    _wait(proc, result, None)
    for stream in (proc.stdin, proc.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
    return escalated


class _Exchange:
    """The parent's ends of one sandbox's pipes: the job going in, stderr and results coming out."""

    def __init__(
        self, job_bytes: bytes, prefix: bytes, limits: SandboxLimits, result: SandboxResult
    ) -> None:
        self.pending = memoryview(job_bytes)
        self.prefix = prefix
        self.limits = limits
        self.result = result
        self.buffer = bytearray()
        self.stderr = bytearray()
        self.total = 0
        # each run has its own limits inside; the pipe carries at most this much (plus framing)
        self.cap = (limits.result_bytes + 4096) * max(len(result.runs), 1) + (1 << 20)
        self.begin = time.monotonic()
        self.deadline = self.begin + limits.startup_s  # until the manager reports STARTED
        self.started_at: float | None = None

    def on_event(self, key: selectors.SelectorKey, sel: selectors.BaseSelector, stdin: Any) -> bool:
        """Handle one ready pipe; False if the result pipe went over its cap."""
        if key.data == "stdin":
            self.write_job(key.fd, sel, stdin)
            return True
        try:
            chunk = os.read(key.fd, 1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(key.fd)
            return True
        if key.data == "stderr":
            self.stderr += chunk[: max(self.limits.stderr_bytes - len(self.stderr), 0)]
            return True
        return self.on_results(chunk)

    def write_job(self, fd: int, sel: selectors.BaseSelector, stdin: Any) -> None:
        """Write what the pipe takes of the job; close stdin when all of it is written."""
        try:
            self.pending = self.pending[os.write(fd, self.pending) :]
        except OSError:
            self.pending = self.pending[len(self.pending) :]
        if not self.pending:
            sel.unregister(fd)
            stdin.close()

    def on_results(self, chunk: bytes) -> bool:
        """Take in result-pipe bytes, line by line; False once over the cap."""
        self.total += len(chunk)
        if self.total > self.cap:  # cannot happen with an honest manager
            return False
        self.buffer += chunk
        if b"\n" not in chunk:
            return True  # a long line still arriving: split only when it ends
        *lines, rest = bytes(self.buffer).split(b"\n")
        self.buffer = bytearray(rest)
        for line in lines:
            self.on_line(line)
        return True

    def on_line(self, line: bytes) -> None:
        """One result line: STARTED moves the deadline to the backstop; others are recorded."""
        message = _decode_line(line, self.prefix)
        if message == [STARTED] and self.started_at is None:
            self.started_at = time.monotonic()
            backstop = len(self.result.runs) * (self.limits.wall_s + 1.0) + 5.0
            self.deadline = self.started_at + backstop
        elif not _accept(message, self.result):
            self.result.bad_lines += 1


def _communicate(
    proc: subprocess.Popen,
    job_bytes: bytes,
    read_fd: int,
    prefix: bytes,
    limits: SandboxLimits,
    result: SandboxResult,
) -> None:
    """Feed the job, read results and stderr, enforce the start-up and backstop deadlines."""
    assert proc.stdin is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    os.set_blocking(proc.stdin.fileno(), False)
    sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
    sel.register(proc.stderr.fileno(), selectors.EVENT_READ, "stderr")
    sel.register(read_fd, selectors.EVENT_READ, "result")
    exchange = _Exchange(job_bytes, prefix, limits, result)
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= exchange.deadline:
                result.timed_out = True
                break
            exited = _wait(proc, result, 0.0)
            events = sel.select(timeout=min(exchange.deadline - now, 0.05 if exited else 1.0))
            if not events and exited:
                break  # the harness is gone; a leftover may still hold a pipe: stop here
            for key, _ in events:
                if not exchange.on_event(key, sel, proc.stdin):
                    result.setup_error = "result pipe over its cap"
                    return
    finally:
        sel.close()
        result.started = exchange.started_at is not None
        result.wall_s = time.monotonic() - exchange.begin
        result.stderr = exchange.stderr.decode("utf-8", "replace")


def _accept(message: Any, result: SandboxResult) -> bool:
    """Record one message from the manager; False if it is malformed."""
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        return False
    kind, runs = message[0], result.runs
    if kind in (MESSAGE, DONE) and len(message) == 3:
        index = message[1]
        if not isinstance(index, int) or not 0 <= index < len(runs):
            return False
        run = runs[index]
        if kind == MESSAGE:
            run.messages.append(message[2])
            return True
        info = message[2]
        if not isinstance(info, dict):
            return False
        run.completed = True
        run.returncode = info.get("status")
        run.timed_out = bool(info.get("timed_out"))
        run.overflow = bool(info.get("overflow"))
        run.cpu_s = float(info.get("cpu_s", 0.0))
        run.wall_s = float(info.get("wall_s", 0.0))
        if isinstance(run.returncode, int) and run.returncode > 128:
            run.signal = run.returncode - 128
        return True
    if kind == SETUP and len(message) == 2 and isinstance(message[1], dict):
        result.setup.update(message[1])
        return True
    if kind == SETUP_ERROR:
        result.setup_error = f"{message[1:2]}: {message[2:3]}"
        return True
    return False


def _decode_line(line: bytes, prefix: bytes) -> Any:
    if not line.startswith(prefix):
        return None
    try:
        return json.loads(line[len(prefix) :])
    except (ValueError, RecursionError):  # malformed, or nested deeper than json can go
        return None


# --------------------------------------------------------------------------------------------
# Capabilities
# --------------------------------------------------------------------------------------------

_capabilities: dict[str, bool] | None = None
_capability_notes: dict[str, str] = {}
_capabilities_lock = threading.Lock()


def _wanted_steps() -> dict[str, bool]:
    is_root = os.geteuid() == 0
    steps = {name: True for name in PROTECTIONS}
    steps["process_group"] = False  # not a harness step: Popen(start_new_session=True)
    steps["user_namespace"] = not is_root
    steps["unprivileged_user"] = is_root
    steps["drop_capabilities"] = not is_root
    return steps


def _probe_once(steps: dict[str, bool]) -> tuple[dict[str, bool], dict[str, Any], str]:
    limits = SandboxLimits(wall_s=10.0, cpu_s=10)
    res = _run(_probe_driver(), [None], limits, steps, probe=True)
    checks = next((m[1] for m in res.messages if isinstance(m, list) and m[0] == CHECKS), {})
    caps = {name: bool(res.setup.get(name)) for name in PROTECTIONS}
    caps["process_group"] = res.session_id > 0
    # Confirm from inside what the harness claims.
    if caps["network_namespace"] and checks.get("loopback") != "unreachable":
        caps["network_namespace"] = False
    if caps["chroot"] and checks.get("etc_visible", True):
        caps["chroot"] = False
    if caps["unprivileged_user"] and checks.get("uid", 0) in (0, os.getuid()):
        caps["unprivileged_user"] = False
    caps["stdlib"] = bool(checks.get("stdlib"))
    caps["fork_works"] = bool(checks.get("fork"))
    notes = {k: v for k, v in res.setup.items() if k.endswith("_error")}
    if checks.get("stdlib_error"):
        notes["stdlib_error"] = checks["stdlib_error"]
    return caps, notes, res.stderr


def sandbox_capabilities(refresh: bool = False) -> dict[str, bool]:
    """Which protections this machine provides (probed once per process, then cached).

    Keys are ``PROTECTIONS`` plus ``stdlib`` (the standard library imports inside the
    sandbox) and ``fork_works``. A protection that failed, or whose effect could not be seen
    from inside, is False and is not used by later runs. Logged once.
    """
    global _capabilities
    with _capabilities_lock:
        if _capabilities is not None and not refresh:
            return dict(_capabilities)
        steps = _wanted_steps()
        caps: dict[str, bool] = {}
        notes: dict[str, Any] = {}
        stderr = ""
        # Without a working stdlib the sandbox is useless: drop the filesystem restriction,
        # then the user change (a stdlib under an unreadable home), until imports work.
        for drop in ((), ("chroot",), ("chroot", "unprivileged_user")):
            tried = {k: v and k not in drop for k, v in steps.items()}
            caps, notes, stderr = _probe_once(tried)
            if caps["stdlib"]:
                break
        for name, ok in caps.items():
            if name in steps and steps[name] and not ok:
                notes.setdefault(name + "_error", "not confirmed from inside the sandbox")
        if not caps["stdlib"]:
            notes["stdlib_error"] = stderr[-300:] or "the sandboxed interpreter did not start"
        _capabilities = caps
        _capability_notes.clear()
        _capability_notes.update({k: str(v) for k, v in notes.items()})
        missing = missing_protections(caps)
        logger.info("code sandbox protections: %s", {k: v for k, v in caps.items() if v})
        if missing:
            logger.warning(
                "code sandbox runs without: %s (%s)",
                ", ".join(missing),
                "; ".join(f"{k}: {v}" for k, v in _capability_notes.items()),
            )
        return dict(caps)


def capability_notes() -> dict[str, str]:
    """Why each missing protection is missing (errors recorded by the probe)."""
    sandbox_capabilities()
    return dict(_capability_notes)


def missing_protections(caps: dict[str, bool] | None = None) -> list[str]:
    """Protections this machine could not provide (those not applicable to it are left out)."""
    caps = sandbox_capabilities() if caps is None else caps
    is_root = os.geteuid() == 0
    not_applicable = {"user_namespace", "drop_capabilities"} if is_root else {"unprivileged_user"}
    return [
        name
        for name in (*PROTECTIONS, "stdlib")
        if name not in not_applicable and not caps.get(name, False)
        # a user namespace is only a means: without root it is missing only if nothing else is
    ]


def _steps() -> dict[str, bool]:
    caps = sandbox_capabilities()
    steps = {name: caps.get(name, False) for name in PROTECTIONS}
    steps["process_group"] = False  # not a harness step: Popen(start_new_session=True)
    return steps


def run_python_many(
    driver: str,
    payloads: list[Any],
    limits: SandboxLimits | None = None,
    *,
    stop_marker: Any = None,
) -> SandboxResult:
    """Run ``driver`` once per payload, each time in a fresh process, in one sandbox.

    ``driver`` is source defining ``main(payload, emit)``; ``emit(obj)`` sends one JSON value,
    which arrives in ``result.runs[i].messages``. Every run gets the limits afresh (wall clock
    and CPU are per run), and whatever a run leaves (processes, files in ``/work`` and ``/tmp``)
    is removed before the next one starts. With ``stop_marker``, a run that never emitted that
    value ends the sandbox: later payloads are not run (their ``completed`` stays False).
    Payloads must be JSON-serialisable. Never raises: a spawn failure or a protection failing
    is reported in ``setup_error``.
    """
    limits = limits or SandboxLimits()
    try:
        return _run(driver, list(payloads), limits, _steps(), False, stop_marker)
    except Exception as exc:  # defensive: the contract is "never raises"
        return SandboxResult(
            runs=[RunResult() for _ in payloads], setup_error=f"internal: {exc!r}"[:300]
        )


def run_python(
    driver: str, payload: Any = None, limits: SandboxLimits | None = None
) -> SandboxResult:
    """`run_python_many` with one payload: its messages are ``result.messages``."""
    return run_python_many(driver, [payload], limits)
