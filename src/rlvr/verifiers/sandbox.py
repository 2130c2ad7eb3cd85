"""Run untrusted Python in a throw-away sandbox; results come back on a private pipe.

Sandbox policy
--------------
One sandbox is one fresh interpreter (``python -s -S -B``: no site, no user site, no bytecode
files, ``''`` and the working directory removed from ``sys.path``; the environment is replaced
by a minimal one, so ``-E`` is not needed and ``PYTHONHASHSEED=0`` makes runs reproducible).
A small trusted *harness* (``_HARNESS`` below) sets the protections up and becomes the
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
from typing import Any

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

# Names of the protections, in the order the harness applies them.
PROTECTIONS = (
    "process_group",  # own session + process group, killed whole
    "user_namespace",  # without root only: everything below inside a user namespace
    "network_namespace",
    "mount_namespace",
    "ipc_namespace",
    "uts_namespace",
    "pid_namespace",
    "chroot",  # private root: libs + stdlib read-only, tmpfs /work and /tmp
    "rlimits",
    "unprivileged_user",  # as root: a private uid/gid per concurrent run
    "drop_capabilities",  # in a user namespace: capset() to nothing
    "no_new_privs",
)

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
# The harness: runs in the child process tree, first as the caller's user. It is passed with
# -c; the job arrives on stdin as JSON. Standard library only; nothing from rlvr.
#
#   outer harness (host PID namespace; SIGTERM kills the manager, exits as it did)
#     └─ manager (PID 1 of the new namespace, trusted: never runs untrusted code; privileged)
#          └─ one child per payload: rlimits, unprivileged uid, no capabilities, no_new_privs,
#             then the driver with the payload; its results go to a pipe only the manager reads
#
# Without a PID namespace the outer harness is the manager.
# --------------------------------------------------------------------------------------------

_HARNESS = r'''
import json, os, signal, sys, time
sys.path[:] = [p for p in sys.path if p not in ("", ".") and p != os.getcwd()]
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18

def read_job():
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    fd = os.open("/dev/null", os.O_RDWR)
    os.dup2(fd, 0)
    os.close(fd)
    return json.loads(b"".join(chunks))

job = read_job()
RFD = job["result_fd"]
PREFIX = job["nonce"].encode()
LIMITS = job["limits"]
UID = job["uid"]  # a private uid (root only), or None
report = {}
_libc = None

def write_all(fd, data):
    data = memoryview(data)
    while data:
        data = data[os.write(fd, data):]

def emit(message):
    write_all(RFD, PREFIX + json.dumps(message, separators=(",", ":")).encode() + b"\n")

def libc():
    global _libc
    if _libc is None:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc

def check(result):
    if result != 0:
        import ctypes
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))

def unshare(flags):
    if hasattr(os, "unshare"):
        os.unshare(flags)
    else:
        check(libc().unshare(flags))

def mount(source, target, fstype, flags, data=None):
    import ctypes
    enc = lambda s: None if s is None else s.encode()
    check(libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)))

def prctl(option, value):
    import ctypes
    check(libc().prctl(option, ctypes.c_ulong(value), 0, 0, 0))

def step(name, fn, *needs):
    """Apply one protection if asked; probe mode records failures, run mode fails closed."""
    if not job["steps"].get(name):
        return False
    if any(not report.get(n) for n in needs):
        report[name] = False
        report[name + "_error"] = "needs " + ",".join(needs)
        return False
    try:
        fn()
    except BaseException as exc:
        report[name] = False
        report[name + "_error"] = repr(exc)[:300]
        if not job["probe"]:
            emit(["setup_error", name, repr(exc)[:300]])
            os._exit(121)
        return False
    report[name] = True
    return True

# --- namespaces (outer harness) ------------------------------------------------------------

def user_namespace():
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER)
    for path, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                       ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + path, "w") as f:
            f.write(text)

step("user_namespace", user_namespace)
step("network_namespace", lambda: unshare(CLONE_NEWNET))
step("mount_namespace", lambda: (unshare(CLONE_NEWNS), mount(None, "/", None, MS_REC | MS_PRIVATE)))
step("ipc_namespace", lambda: unshare(CLONE_NEWIPC))
step("uts_namespace", lambda: unshare(CLONE_NEWUTS))

def wait_child(pid):
    while True:
        try:
            return os.wait4(pid, 0)
        except InterruptedError:
            continue

def exit_like(status):
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)

def pid_namespace():
    unshare(CLONE_NEWPID)
    pid = os.fork()  # the child is PID 1 of the new namespace: the manager
    if pid:
        os.close(RFD)
        signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
        try:
            exit_like(wait_child(pid)[1])
        except ChildProcessError:
            os._exit(120)

step("pid_namespace", pid_namespace)
IN_PIDNS = bool(report.get("pid_namespace")) and os.getpid() == 1
# Without a PID namespace the manager finds leftovers through the host's /proc, which a private
# root hides: keep a handle on it (closed in every child before anything else runs there).
PROC_FD = None
if not IN_PIDNS and UID is not None:
    PROC_FD = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)

# --- private root (manager) -----------------------------------------------------------------

def bind(root, path, readonly=True):
    inner = root + path
    if os.path.isdir(path):
        os.makedirs(inner, mode=0o755, exist_ok=True)
    else:
        open(inner, "a").close()
    mount(path, inner, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (MS_RDONLY if readonly else 0)
    mount(None, inner, None, flags)

def chroot():
    root = job["root"]
    size = "size=%dm,nr_inodes=4096,mode=755" % LIMITS["tmpfs_mb"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, size)
    for link, target in job["symlinks"]:
        os.makedirs(os.path.dirname(root + link), mode=0o755, exist_ok=True)
        os.symlink(target, root + link)
    for path in job["binds"]:
        bind(root, path)
    os.makedirs(root + "/dev", mode=0o755)
    for name in ("null", "zero", "random", "urandom"):
        bind(root, "/dev/" + name, readonly=False)
    if IN_PIDNS:
        os.makedirs(root + "/proc", mode=0o555)
        mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        os.symlink("/proc/self/fd", root + "/dev/fd")
    for path, mode in (("/work", 0o700), ("/tmp", 0o1777), ("/dev/shm", 0o1777)):
        os.makedirs(root + path, exist_ok=True)
        os.chmod(root + path, mode)
    if UID is not None:
        os.chown(root + "/work", UID, UID)
    os.chroot(root)
    os.chdir("/work")

if step("chroot", chroot, "mount_namespace"):
    SCRATCH = ["/work", "/tmp", "/dev/shm"]
else:
    os.chdir(job["workdir"])
    SCRATCH = [job["workdir"]]

# --- cleaning up between children (manager) -------------------------------------------------

def reap_all(block):
    while True:
        try:
            if os.waitpid(-1, 0 if block else os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
        except InterruptedError:
            continue

def sweep_uid(uid):
    """SIGKILL every process of ``uid`` (a /proc scan) and reap our children, until none is left."""
    for _ in range(500):
        alive = []
        for name in os.listdir(PROC_FD):
            if name.isdigit():
                try:
                    fd = os.open(name + "/status", os.O_RDONLY, dir_fd=PROC_FD)
                    try:
                        status = os.read(fd, 1 << 16)
                    finally:
                        os.close(fd)
                    fields = dict(l.split(b":", 1) for l in status.splitlines() if b":" in l)
                    zombie = fields[b"State"].strip().startswith(b"Z")
                    if int(fields[b"Uid"].split()[0]) == uid and not zombie:
                        alive.append(int(name))
                except (OSError, KeyError, ValueError, IndexError):
                    pass
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap_all(False)
        if not alive:
            return
        time.sleep(0.002)

def kill_leftovers(child):
    """Kill whatever the last child left running. kill(-1) only as PID 1 of our namespace."""
    if IN_PIDNS:
        try:
            os.kill(-1, signal.SIGKILL)  # every process of this namespace but its init (us)
        except OSError:
            pass
        reap_all(True)
    elif UID is not None:
        try:
            sweep_uid(UID)
        except OSError:
            pass  # the parent sweeps again at the end
    else:  # the child's group was killed before the child was reaped (run_one): reap it
        while True:
            try:
                os.waitpid(-child, 0)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
        reap_all(False)

def clear_dir(path):
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                clear_dir(entry.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass

if not IN_PIDNS:
    try:
        prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the children come back here to be reaped
    except OSError:
        pass

# --- a child: drop privileges, run the driver -------------------------------------------------

def rlimits():
    import resource
    mb = 1 << 20
    for name, value in (("RLIMIT_CPU", (LIMITS["cpu_s"], LIMITS["cpu_s"] + 1)),
                        ("RLIMIT_AS", (LIMITS["memory_mb"] * mb,) * 2),
                        ("RLIMIT_NPROC", (LIMITS["nproc"],) * 2),
                        ("RLIMIT_FSIZE", (LIMITS["fsize_mb"] * mb,) * 2),
                        ("RLIMIT_NOFILE", (LIMITS["nofile"],) * 2),
                        ("RLIMIT_CORE", (0, 0))):
        resource.setrlimit(getattr(resource, name), value)

def unprivileged_user():
    os.setgroups([])
    os.setresgid(UID, UID, UID)
    os.setresuid(UID, UID, UID)
    if os.getuid() != UID or os.geteuid() != UID:
        raise OSError("uid did not change")

def drop_capabilities():
    import ctypes
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all empty
    check(libc().capset(header, data))

DRIVER = compile(job["driver"], "<driver>", "exec")

def child(payload, write_fd):
    if PROC_FD is not None:
        os.close(PROC_FD)  # a directory outside the private root: never in untrusted hands
    if not IN_PIDNS and UID is None:
        os.setpgid(0, 0)  # the manager's only handle on what it leaves; see kill_leftovers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    step("rlimits", rlimits)
    step("unprivileged_user", unprivileged_user)
    step("drop_capabilities", drop_capabilities)
    step("no_new_privs", lambda: (prctl(38, 1), prctl(1, 9)))  # NO_NEW_PRIVS; PDEATHSIG=SIGKILL
    if job["probe"]:
        emit(["setup", report])
    os.close(RFD)  # from here on only the private pipe: the manager relays what it says
    def out(message):
        write_all(write_fd, json.dumps(message, separators=(",", ":")).encode() + b"\n")
    scope = {"__name__": "__sandbox_driver__"}
    exec(DRIVER, scope)
    scope["main"](payload, out)

# --- the manager: one fresh child per payload ---------------------------------------------------

current = []

def on_term(*_):
    for pid in current:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if current:
        kill_leftovers(current[0])
    os._exit(143)

signal.signal(signal.SIGTERM, on_term)
stop_marker = job["stop_marker"]

def run_one(index, payload):
    import select
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            child(payload, write_fd)
        except BaseException:
            os._exit(1)
        os._exit(0)
    current.append(pid)
    os.close(write_fd)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    poller = select.poll()
    poller.register(read_fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    deadline = start + LIMITS["wall_s"]
    head = b'["m",%d,' % index
    state = {"buffer": b"", "total": 0, "marker": stop_marker is None}

    def feed(data):
        """Relay complete lines, tagged with the payload's index; False once over the cap."""
        state["total"] += len(data)
        if state["total"] > LIMITS["result_bytes"]:
            return False
        lines = (state["buffer"] + data).split(b"\n")
        state["buffer"] = lines.pop()
        for line in lines:
            if not state["marker"] and len(line) < 200:
                try:
                    state["marker"] = json.loads(line) == stop_marker
                except ValueError:
                    pass
            write_all(RFD, PREFIX + head + line + b"]\n")
        return True

    timed_out = overflow = exited = False
    while not exited:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        wait_ms = remaining * 1000 if pidfd is not None else min(remaining * 1000, 5)
        for fd, _ in poller.poll(max(wait_ms, 0)):
            if fd == pidfd:
                exited = True
            elif not overflow:
                data = os.read(read_fd, 1 << 16)
                if not data:
                    poller.unregister(read_fd)
                overflow = not feed(data)
        if pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
            exited = True
        if overflow:
            break
    if exited and not overflow:
        # what the child wrote before it exited; a descendant may still hold the pipe open
        os.set_blocking(read_fd, False)
        while not overflow:
            try:
                data = os.read(read_fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            overflow = not feed(data)
    saw_marker = state["marker"]
    if not exited:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not IN_PIDNS and UID is None:
        try:  # while the child is unreaped its pid (= its group's id) cannot be reused
            os.killpg(pid, signal.SIGKILL)  # the child's own group; escapes are possible here
        except OSError:
            pass
    _, status, usage = wait_child(pid)
    wall = time.monotonic() - start
    current.clear()
    os.close(read_fd)
    if pidfd is not None:
        os.close(pidfd)
    kill_leftovers(pid)
    for path in SCRATCH:
        clear_dir(path)
    signaled = os.WIFSIGNALED(status)
    code = 128 + os.WTERMSIG(status) if signaled else os.waitstatus_to_exitcode(status)
    info = {"status": code, "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall,
            "timed_out": timed_out, "overflow": overflow}
    return info, saw_marker

if job["probe"]:
    emit(["setup", report])
emit(["started"])
for index, payload in enumerate(job["payloads"]):
    info, saw_marker = run_one(index, payload)
    emit(["done", index, info])
    if not saw_marker:
        break
os._exit(0)
'''

# The probe's driver: checks from inside what the setup report claims.
_PROBE_DRIVER = r"""
def main(payload, emit):
    import os, socket
    checks = {"uid": os.getuid(), "etc_visible": os.path.exists("/etc/passwd")}
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(("127.0.0.1", 9))  # loopback only; refused means the host stack is visible
        checks["loopback"] = "connected"
    except OSError as exc:
        checks["loopback"] = "refused" if exc.errno == 111 else "unreachable"
    finally:
        s.close()
    try:
        import collections, decimal, fractions, functools, heapq, itertools, math, random
        import re, statistics, string, bisect, datetime, json, ctypes
        checks["stdlib"] = True
    except Exception as exc:
        checks["stdlib"] = False
        checks["stdlib_error"] = repr(exc)[:300]
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        checks["fork"] = os.waitpid(pid, 0)[1] >> 8 == 7
    except OSError:
        checks["fork"] = False
    emit(["checks", checks])
"""


# Reads the harness as bytecode from stdin (compiled once per trainer process, by the same
# interpreter version), then the job. Saves compiling the harness in every sandbox.
_BOOTSTRAP = """
import marshal, os
def _read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            os._exit(122)
        data += chunk
    return data
exec(marshal.loads(_read(int(_read(16)))))
"""


@functools.lru_cache(maxsize=1)
def _harness_bytecode() -> bytes:
    return marshal.dumps(compile(_HARNESS, "<sandbox-harness>", "exec"))


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
            job = {
                "nonce": nonce,
                "result_fd": write_fd,
                "steps": steps,
                "probe": probe,
                "limits": asdict(limits),
                "uid": uid,
                "root": host_dir,
                "workdir": host_dir,
                "binds": binds,
                "symlinks": symlinks,
                "driver": driver,
                "payloads": payloads,
                "stop_marker": stop_marker,
            }
            harness = _harness_bytecode()
            job_bytes = b"%016d" % len(harness) + harness + json.dumps(job).encode()
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
    pending = memoryview(job_bytes)
    buffer = bytearray()
    stderr = bytearray()
    total = 0
    # each run has its own limits inside; the pipe carries at most this much (plus framing)
    cap = (limits.result_bytes + 4096) * max(len(result.runs), 1) + (1 << 20)
    begin = time.monotonic()
    deadline = begin + limits.startup_s
    started_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                result.timed_out = True
                break
            exited = _wait(proc, result, 0.0)
            events = sel.select(timeout=min(deadline - now, 0.05 if exited else 1.0))
            if not events and exited:
                break  # the harness is gone; a leftover may still hold a pipe: stop here
            for key, _ in events:
                fd = key.fd
                if key.data == "stdin":
                    try:
                        pending = pending[os.write(fd, pending) :]
                    except OSError:
                        pending = pending[len(pending) :]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(fd)
                    continue
                if key.data == "stderr":
                    stderr += chunk[: max(limits.stderr_bytes - len(stderr), 0)]
                    continue
                total += len(chunk)
                if total > cap:  # cannot happen with an honest manager
                    result.setup_error = "result pipe over its cap"
                    return
                buffer += chunk
                if b"\n" not in chunk:
                    continue  # a long line still arriving: split only when it ends
                *lines, rest = bytes(buffer).split(b"\n")
                buffer = bytearray(rest)
                for line in lines:
                    message = _decode_line(line, prefix)
                    if message == ["started"] and started_at is None:
                        started_at = time.monotonic()
                        backstop = len(result.runs) * (limits.wall_s + 1.0) + 5.0
                        deadline = started_at + backstop
                    elif not _accept(message, result):
                        result.bad_lines += 1
    finally:
        sel.close()
        result.started = started_at is not None
        result.wall_s = time.monotonic() - begin
        result.stderr = stderr.decode("utf-8", "replace")


def _accept(message: Any, result: SandboxResult) -> bool:
    """Record one message from the manager; False if it is malformed."""
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        return False
    kind, runs = message[0], result.runs
    if kind in ("m", "done") and len(message) == 3:
        index = message[1]
        if not isinstance(index, int) or not 0 <= index < len(runs):
            return False
        run = runs[index]
        if kind == "m":
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
    if kind == "setup" and len(message) == 2 and isinstance(message[1], dict):
        result.setup.update(message[1])
        return True
    if kind == "setup_error":
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
    res = _run(_PROBE_DRIVER, [None], limits, steps, probe=True)
    checks = next((m[1] for m in res.messages if isinstance(m, list) and m[0] == "checks"), {})
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
