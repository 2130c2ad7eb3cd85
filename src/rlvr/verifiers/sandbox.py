"""Run untrusted Python in a throw-away sandbox process; report results on a nonce-tagged pipe.

Sandbox policy
--------------
Every run starts a fresh interpreter (``python -s -S -B``: no site, no user site, no bytecode
files, and ``''``/the working directory removed from ``sys.path``; the environment is replaced by
a minimal one, so ``-E`` is not needed and ``PYTHONHASHSEED=0`` makes runs reproducible). A small
trusted *harness* (``_HARNESS`` below) sets the protections up, drops privileges, then calls the
caller's *driver* (``main(payload, emit)``); the driver runs the untrusted code. Protections, in
the order the harness applies them:

  * Own session and process group (``start_new_session``); the whole group is SIGKILLed at the
    end, and every process of the run's private user id is swept (``/proc`` scan), so a
    ``setsid`` daemon does not survive either.
  * Namespaces, where the kernel allows: network (``CLONE_NEWNET``: only a down loopback, so no
    connection reaches anything, not even 127.0.0.1), mount, PID (the untrusted code is PID 1 of
    its own namespace: it sees no other process, and when it exits the kernel kills every
    process it left), IPC and UTS. Without root, a user namespace is created first (if
    unprivileged user namespaces are enabled) and the same namespaces inside it.
  * Filesystem: with a mount namespace, a new root on a size-limited tmpfs holding read-only,
    nosuid bind mounts of the shared-library directories and the interpreter's ``lib`` (stdlib)
    only; ``/dev/{null,zero,random,urandom}``; a fresh ``/proc`` of the PID namespace;
    writable ``/work`` (the working directory) and ``/tmp`` inside the tmpfs, which vanish with
    the namespace. No ``/etc``, no ``/home``, no shells or other binaries, no trainer files.
    Without a mount namespace: a fresh temporary working directory, removed afterwards, and only
    the permissions of the sandbox user protect the rest.
  * Resource limits: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_NPROC, RLIMIT_FSIZE,
    RLIMIT_NOFILE, RLIMIT_CORE=0, plus a wall-clock limit enforced by the parent.
  * An unprivileged user: as root, the code runs under a private, otherwise unused uid/gid per
    concurrent run (so RLIMIT_NPROC binds, since it does not bind root, and runs cannot signal
    the trainer or each other); without root, under a user namespace with every capability
    dropped. ``PR_SET_NO_NEW_PRIVS`` and ``PR_SET_PDEATHSIG=SIGKILL`` are set.
  * Output: stdout goes to ``/dev/null``; stderr and the result pipe are read up to a cap (a run
    that overflows the result pipe is killed at once).

The parent learns results only from lines on a private pipe that start with a fresh random
nonce; everything else (stdout, stderr, other lines) is ignored. A line with the nonce is *not*
proof of honesty: the untrusted code shares the process with the driver and can find the nonce
by introspection. Callers must make results that the untrusted code could forge worthless
(``rlvr.verifiers.code`` sends values back and compares them with the expected ones itself).

`sandbox_capabilities()` probes once per process which protections this machine provides (each
is tried, then checked from inside: uid, blocked loopback, hidden ``/etc``, working stdlib),
logs the result once, and later runs use exactly those and fail closed if one of them then fails.
"""

from __future__ import annotations

import functools
import json
import logging
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
    "SandboxResult",
    "missing_protections",
    "run_python",
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
class SandboxResult:
    """What the parent observed. ``messages`` are the nonce-tagged JSON lines, in order."""

    messages: list[Any] = field(default_factory=list)
    started: bool = False  # the harness reached the untrusted side
    returncode: int | None = None  # the harness's: 128 + N when signal N killed the code
    signal: int | None = None  # the signal that ended the untrusted side, if one did
    timed_out: bool = False  # wall clock (or startup) limit hit; the run was killed
    cpu_s: float = 0.0  # user + system CPU of the whole run
    wall_s: float = 0.0  # wall time after start-up
    stderr: str = ""
    overflow: bool = False  # the result pipe exceeded its cap
    bad_lines: int = 0  # result-pipe lines without the nonce or not JSON
    setup_error: str | None = None  # a protection that the probe found failed this time
    session_id: int = 0  # sid = pgid = pid of the harness
    workdir: str = ""  # the host temporary directory (removed before the result is returned)
    uid: int | None = None  # the private uid used, when there was one
    leftover_killed: int = 0  # processes found by the final sweep (escaped the group)
    cpu_limited: bool = False  # killed by RLIMIT_CPU (SIGXCPU, or SIGKILL at the hard limit)


# --------------------------------------------------------------------------------------------
# The harness: runs in the child, first as the caller's user, then unprivileged. It is passed
# with -c; the job arrives on stdin as JSON. Standard library only; nothing from rlvr.
# --------------------------------------------------------------------------------------------

_HARNESS = r'''
import json, os, sys
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
report = {}
_libc = None

def emit(message):
    data = memoryview(PREFIX + json.dumps(message, separators=(",", ":")).encode() + b"\n")
    while data:
        data = data[os.write(RFD, data):]

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
            sys.stderr.write("sandbox: %s failed: %r\n" % (name, exc))
            os._exit(121)
        return False
    report[name] = True
    return True

def user_namespace():
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER)
    for path, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                       ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + path, "w") as f:
            f.write(text)

limits = job["limits"]
step("user_namespace", user_namespace)
step("network_namespace", lambda: unshare(CLONE_NEWNET))
step("mount_namespace", lambda: (unshare(CLONE_NEWNS), mount(None, "/", None, MS_REC | MS_PRIVATE)))
step("ipc_namespace", lambda: unshare(CLONE_NEWIPC))
step("uts_namespace", lambda: unshare(CLONE_NEWUTS))

def sweep_uid(uid):
    """SIGKILL every process of ``uid`` (a /proc scan) and reap our children, until none is left."""
    import signal, time
    for _ in range(200):
        alive = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open("/proc/%s/status" % name, "rb") as f:
                        fields = dict(l.split(b":", 1) for l in f.read().splitlines() if b":" in l)
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
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if not alive:
            return
        time.sleep(0.005)

def supervise(child, sweep):
    """Trusted parent of ``child``: SIGTERM kills it; its exit status becomes ours.

    Exit status: the child's exit code, or 128 + N when signal N killed it. With ``sweep`` (no
    PID namespace, a private uid), every process of that uid is killed and reaped afterwards.
    """
    import signal
    os.close(RFD)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            os._exit(120)
        except InterruptedError:
            continue
    if sweep:
        sweep_uid(job["uid"])
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)

def pid_namespace():
    unshare(CLONE_NEWPID)
    pid = os.fork()  # the child is PID 1 (a small init) of the new namespace
    if pid:
        supervise(pid, False)

step("pid_namespace", pid_namespace)

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
    size = "size=%dm,nr_inodes=4096,mode=755" % limits["tmpfs_mb"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, size)
    for link, target in job["symlinks"]:
        os.makedirs(os.path.dirname(root + link), mode=0o755, exist_ok=True)
        os.symlink(target, root + link)
    for path in job["binds"]:
        bind(root, path)
    os.makedirs(root + "/dev", mode=0o755)
    for name in ("null", "zero", "random", "urandom"):
        bind(root, "/dev/" + name, readonly=False)
    if report.get("pid_namespace"):
        os.makedirs(root + "/proc", mode=0o555)
        mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        os.symlink("/proc/self/fd", root + "/dev/fd")
    for path, mode in (("/work", 0o700), ("/tmp", 0o1777), ("/dev/shm", 0o1777)):
        os.makedirs(root + path, exist_ok=True)
        os.chmod(root + path, mode)
    if job["uid"] is not None:
        os.chown(root + "/work", job["uid"], job["gid"])
    os.chroot(root)
    os.chdir("/work")

if not step("chroot", chroot, "mount_namespace"):
    os.chdir(job["workdir"])

# The untrusted side runs in its own process: the one above (the namespace's init, or the
# outer harness without a PID namespace) stays trusted, reaps it and mirrors its exit. A PID 1
# would ignore signals without a handler, RLIMIT_CPU's SIGXCPU included.
_sweep = not report.get("pid_namespace") and job["uid"] is not None
if _sweep:
    try:
        prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans of the untrusted side come back here
    except OSError:
        pass
_pid = os.fork()
if _pid:
    supervise(_pid, _sweep)

def rlimits():
    import resource
    mb = 1 << 20
    for name, value in (("RLIMIT_CPU", (limits["cpu_s"], limits["cpu_s"] + 1)),
                        ("RLIMIT_AS", (limits["memory_mb"] * mb,) * 2),
                        ("RLIMIT_NPROC", (limits["nproc"],) * 2),
                        ("RLIMIT_FSIZE", (limits["fsize_mb"] * mb,) * 2),
                        ("RLIMIT_NOFILE", (limits["nofile"],) * 2),
                        ("RLIMIT_CORE", (0, 0))):
        resource.setrlimit(getattr(resource, name), value)

step("rlimits", rlimits)

def unprivileged_user():
    uid, gid = job["uid"], job["gid"]
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("uid did not change")

step("unprivileged_user", unprivileged_user)

def drop_capabilities():
    import ctypes
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all empty
    check(libc().capset(header, data))

step("drop_capabilities", drop_capabilities)
step("no_new_privs", lambda: (prctl(38, 1), prctl(1, 9)))  # NO_NEW_PRIVS; PDEATHSIG=SIGKILL

if job["probe"]:
    emit(["setup", report])
emit(["started"])
scope = {"__name__": "__sandbox_driver__"}
exec(compile(job["driver"], "<driver>", "exec"), scope)
del read_job, step
scope["main"](job["payload"], emit)
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
    payload: Any,
    limits: SandboxLimits,
    steps: dict[str, bool],
    probe: bool,
) -> SandboxResult:
    result = SandboxResult()
    nonce = secrets.token_hex(16)
    prefix = nonce.encode()
    is_root = os.geteuid() == 0
    host_dir = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    binds, symlinks = _filesystem_view()
    read_fd = write_fd = -1
    proc: subprocess.Popen | None = None
    result.workdir = host_dir
    with _UidSlot(wanted=is_root and steps.get("unprivileged_user", False)) as uid:
        result.uid = uid
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
                "gid": uid,
                "root": host_dir,
                "workdir": host_dir,
                "binds": binds,
                "symlinks": symlinks,
                "driver": driver,
                "payload": payload,
            }
            job_bytes = json.dumps(job).encode()
            proc = subprocess.Popen(
                [_python_executable(), "-s", "-S", "-B", "-c", _HARNESS],
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
            _communicate(proc, job_bytes, read_fd, prefix, limits, result)
        except Exception as exc:  # spawning failed: report, never raise
            result.setup_error = result.setup_error or f"spawn: {exc!r}"[:300]
        finally:
            if proc is not None:
                _finish(proc, uid, result)
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            if proc is not None:
                _kill_group(proc.pid)  # anything left in the group (the harness is gone)
            if uid is not None:
                result.leftover_killed = _sweep_uid(uid)
            code = result.returncode
            if code is not None and code < 0:
                result.signal = -code  # the harness itself was killed (by us, normally)
            elif code is not None and code > 128:
                result.signal = code - 128  # the untrusted side was killed by this signal
            result.cpu_limited = result.signal == signal.SIGXCPU or (
                result.signal == signal.SIGKILL
                and not result.timed_out
                and result.cpu_s >= limits.cpu_s - 0.05
            )
            shutil.rmtree(host_dir, ignore_errors=True)
    return result


def _wait(proc: subprocess.Popen, result: SandboxResult, timeout_s: float | None) -> bool:
    """Reap the harness (recording the CPU time of the whole run); False if still running."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while proc.returncode is None:
        try:
            pid, status, usage = os.wait4(proc.pid, 0 if end is None else os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere
            proc.wait()
            break
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            result.cpu_s = usage.ru_utime + usage.ru_stime
            break
        if end is not None and time.monotonic() >= end:
            return False
        time.sleep(0.002)
    result.returncode = proc.returncode
    return True


def _finish(proc: subprocess.Popen, uid: int | None, result: SandboxResult) -> None:
    """End the run and reap the harness.

    A run still going is stopped through the harness (SIGTERM): it kills the untrusted side and
    reaps it. Killing the harness first would orphan those processes to the host's init; the
    group is SIGKILLed only if the harness does not exit in time.
    """
    if not _wait(proc, result, 0.0):
        try:
            proc.send_signal(signal.SIGTERM)
        except OSError:
            pass
        if not _wait(proc, result, 2.0):
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


def _communicate(
    proc: subprocess.Popen,
    job_bytes: bytes,
    read_fd: int,
    prefix: bytes,
    limits: SandboxLimits,
    result: SandboxResult,
) -> None:
    """Feed the job, read results and stderr, enforce the wall clock; kill on overflow."""
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
            events = sel.select(timeout=min(deadline - now, 0.05 if exited else 0.5))
            if not events and exited:
                break  # the harness is gone; a daemon may still hold a pipe: stop here
            for key, _ in events:
                fd = key.fd
                if key.data == "stdin":
                    try:
                        pending = pending[os.write(fd, pending) :]
                    except (BrokenPipeError, OSError):
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
                    room = limits.stderr_bytes - len(stderr)
                    stderr += chunk[: max(room, 0)]
                    continue
                total += len(chunk)
                if total > limits.result_bytes:
                    result.overflow = True
                    return  # the caller stops the run
                buffer += chunk
                *lines, rest = bytes(buffer).split(b"\n")
                buffer = bytearray(rest)
                for line in lines:
                    message = _decode_line(line, prefix)
                    if message is None:
                        result.bad_lines += 1
                    elif message == ["started"]:
                        if started_at is None:  # later copies (forged) change nothing
                            started_at = time.monotonic()
                            deadline = started_at + limits.wall_s
                    elif started_at is None and not _is_setup_message(message):
                        result.bad_lines += 1  # nothing but the harness speaks before start
                    else:
                        if isinstance(message, list) and message and message[0] == "setup_error":
                            result.setup_error = f"{message[1:2]}: {message[2:3]}"
                        result.messages.append(message)
    finally:
        sel.close()
        result.started = started_at is not None
        result.wall_s = time.monotonic() - (started_at if started_at is not None else begin)
        result.stderr = stderr.decode("utf-8", "replace")


def _is_setup_message(message: Any) -> bool:
    return isinstance(message, list) and bool(message) and message[0] in ("setup", "setup_error")


def _decode_line(line: bytes, prefix: bytes) -> Any:
    if not line.startswith(prefix):
        return None
    try:
        return json.loads(line[len(prefix) :])
    except ValueError:
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
    res = _run(_PROBE_DRIVER, None, limits, steps, probe=True)
    setup = next((m[1] for m in res.messages if m[0] == "setup"), {})
    checks = next((m[1] for m in res.messages if m[0] == "checks"), {})
    caps = {name: bool(setup.get(name)) for name in PROTECTIONS}
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
    notes = {k: v for k, v in setup.items() if k.endswith("_error")}
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


def run_python(
    driver: str, payload: Any = None, limits: SandboxLimits | None = None
) -> SandboxResult:
    """Run ``driver`` (source defining ``main(payload, emit)``) inside the sandbox.

    ``payload`` must be JSON-serialisable. ``emit(obj)`` sends one JSON value to the parent; the
    values arrive in ``SandboxResult.messages`` (after ``["started"]``). Never raises: a spawn
    failure or a protection failing is reported in ``setup_error``.
    """
    limits = limits or SandboxLimits()
    caps = sandbox_capabilities()
    steps = {name: caps.get(name, False) for name in PROTECTIONS}
    steps["process_group"] = False
    try:
        return _run(driver, payload, limits, steps, probe=False)
    except Exception as exc:  # defensive: the contract is "never raises"
        return SandboxResult(setup_error=f"internal: {exc!r}"[:300])
