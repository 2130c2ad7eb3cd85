"""The sandbox's trusted harness: sets the protections up, then runs one fresh child per payload.

It runs inside the sandbox's own interpreter (``python -s -S -B``), first as the caller's user.
Standard library only, nothing from rlvr: rlvr is not importable there. `rlvr.verifiers.sandbox`
reads this file's source, compiles it once per process and sends the bytecode on the sandbox's
stdin, followed by the job as JSON; the bootstrap there executes it as ``__main__``, which runs
`main`. Imported anywhere else it only defines names: the parent takes the protocol from here,
and tests call the helpers directly.

  outer harness (host PID namespace; SIGTERM kills the manager, exits as it did)
    └─ manager (PID 1 of the new namespace, trusted: never runs untrusted code; privileged)
         └─ one child per payload: rlimits, unprivileged uid, no capabilities, no_new_privs,
            then the driver with the payload; its results go to a pipe only the manager reads

Without a PID namespace the outer harness is the manager.

Protocol: every line on the result pipe is the job's nonce followed by one JSON list, one of
``[SETUP, report]`` (which protections were applied; probe runs only),
``[SETUP_ERROR, name, error]`` (a protection failed: the harness exits with
`EXIT_SETUP_FAILED`), ``[STARTED]`` (every protection is in place), ``[MESSAGE, index, value]``
(what payload ``index``'s child emitted) and ``[DONE, index, info]`` (that child ended; ``info``
has ``status``, ``cpu_s``, ``wall_s``, ``timed_out`` and ``overflow``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

TYPE_CHECKING = False  # typing is not imported: every sandbox would pay for it
if TYPE_CHECKING:
    import ctypes
    import resource
    from collections.abc import Callable

# --- protocol (rlvr.verifiers.sandbox imports these) ----------------------------------------------

SETUP = "setup"
SETUP_ERROR = "setup_error"
STARTED = "started"
MESSAGE = "m"
DONE = "done"
EXIT_NO_MANAGER = 120  # the outer harness lost its manager (it was reaped elsewhere)
EXIT_SETUP_FAILED = 121  # a protection failed outside a probe run: fail closed
EXIT_TERMINATED = 143  # the manager was asked to stop (SIGTERM) and killed the untrusted side
# Names of the protections (the job's ``steps``, the setup report's keys), in the order the
# harness applies them.
PROTECTIONS = (
    "process_group",  # own session + process group, killed whole (the parent's Popen does it)
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


def make_job(
    *,
    nonce: str,
    result_fd: int,
    steps: dict,
    probe: bool,
    limits: dict,
    uid: int | None,
    root: str,
    workdir: str,
    binds: list,
    symlinks: list,
    driver: str,
    payloads: list,
    stop_marker: object,
) -> dict:
    """The job the parent sends after the bytecode (as JSON); `Harness` reads these keys."""
    return {
        "nonce": nonce,  # starts every line of the result pipe
        "result_fd": result_fd,  # the result pipe's write end, inherited
        "steps": steps,  # protection name -> apply it
        "probe": probe,  # record failures instead of failing closed; report what was applied
        "limits": limits,  # SandboxLimits as a dict
        "uid": uid,  # the children's private uid (root only), or None
        "root": root,  # where the private root is mounted
        "workdir": workdir,  # the working directory without a private root
        "binds": binds,  # directories bound read-only into the private root
        "symlinks": symlinks,  # (path, target) recreated there
        "driver": driver,  # source defining main(payload, emit)
        "payloads": payloads,  # one child each
        "stop_marker": stop_marker,  # a run that never emits it ends the sandbox (None: never)
    }


# --- kernel constants -----------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
CAPABILITY_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3
SCRATCH_IN_ROOT = ["/work", "/tmp", "/dev/shm"]  # emptied between children (private root)
LONGEST_MARKER_LINE = 200  # longer lines are never the stop marker (not even parsed)

# --- system calls ---------------------------------------------------------------------------------

_libc = None


def read_job() -> dict:
    """The job: JSON on stdin up to EOF; stdin is /dev/null afterwards."""
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


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a pipe may take it in pieces)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def frame(message: object) -> bytes:
    """One protocol line: compact JSON and a newline."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def libc() -> ctypes.CDLL:
    """The C library, loaded on first use."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def check(result: int) -> None:
    """Raise OSError (with errno) if a libc call returned non-zero."""
    if result != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def unshare(flags: int) -> None:
    """unshare(2): os.unshare where Python has it, else through libc."""
    if hasattr(os, "unshare"):
        os.unshare(flags)
    else:
        check(libc().unshare(flags))


def _c_string(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    """mount(2) through libc."""
    import ctypes

    check(
        libc().mount(
            _c_string(source),
            _c_string(target),
            _c_string(fstype),
            ctypes.c_ulong(flags),
            _c_string(data),
        )
    )


def prctl(option: int, value: int) -> None:
    """prctl(2) with one argument, through libc."""
    import ctypes

    check(libc().prctl(option, ctypes.c_ulong(value), 0, 0, 0))


def wait_child(pid: int) -> tuple[int, int, resource.struct_rusage]:
    """os.wait4 for ``pid``, retried when a signal interrupts it."""
    while True:
        try:
            return os.wait4(pid, 0)
        except InterruptedError:
            continue


def exit_like(status: int) -> None:
    """Exit as the process with wait status ``status`` did (128 + N for signal N)."""
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def exit_code(status: int) -> int:
    """A wait status as the parent reports it: the exit code, or 128 + N for signal N."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def reap_all(block: bool) -> None:
    """Reap exited children (all of them, waiting for each, when ``block``)."""
    while True:
        try:
            if os.waitpid(-1, 0 if block else os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def reap_group(pgid: int) -> None:
    """Reap every child in process group ``pgid`` (already killed), then any other exited one."""
    while True:
        try:
            os.waitpid(-pgid, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    reap_all(False)


# --- protections ----------------------------------------------------------------------------------


def user_namespace() -> None:
    """A new user namespace in which this process keeps its own uid and gid."""
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER)
    for path, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open("/proc/self/" + path, "w") as f:
            f.write(text)


def private_mounts() -> None:
    """A new mount namespace whose mounts do not propagate back to the host."""
    unshare(CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def bind(root: str, path: str, readonly: bool = True) -> None:
    """Bind-mount ``path`` at ``root + path``, nosuid (and read-only unless told otherwise)."""
    inner = root + path
    if os.path.isdir(path):
        os.makedirs(inner, mode=0o755, exist_ok=True)
    else:
        open(inner, "a").close()
    mount(path, inner, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (MS_RDONLY if readonly else 0)
    mount(None, inner, None, flags)


def rlimit_values(limits: dict) -> list[tuple[str, tuple[int, int]]]:
    """(resource name, (soft, hard)) for each per-child limit of the job's ``limits``."""
    mb = 1 << 20
    return [
        ("RLIMIT_CPU", (limits["cpu_s"], limits["cpu_s"] + 1)),
        ("RLIMIT_AS", (limits["memory_mb"] * mb,) * 2),
        ("RLIMIT_NPROC", (limits["nproc"],) * 2),
        ("RLIMIT_FSIZE", (limits["fsize_mb"] * mb,) * 2),
        ("RLIMIT_NOFILE", (limits["nofile"],) * 2),
        ("RLIMIT_CORE", (0, 0)),
    ]


def set_rlimits(limits: dict) -> None:
    """Apply `rlimit_values` to this process."""
    import resource

    for name, value in rlimit_values(limits):
        resource.setrlimit(getattr(resource, name), value)


def become_user(uid: int) -> None:
    """Drop to ``uid`` (real, effective and saved; gid the same number; no groups)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("uid did not change")


def drop_capabilities() -> None:
    """capset(2) to nothing: no effective, permitted or inheritable capability is left."""
    import ctypes

    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)  # this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: all empty
    check(libc().capset(header, data))


def no_new_privs() -> None:
    """PR_SET_NO_NEW_PRIVS, and SIGKILL when the manager dies (PR_SET_PDEATHSIG)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


# --- cleaning up between children -----------------------------------------------------------------


def status_owner(status: bytes) -> tuple[int, bool]:
    """(real uid, whether a zombie) from a /proc/PID/status text; KeyError etc. if malformed."""
    fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
    zombie = fields[b"State"].strip().startswith(b"Z")
    return int(fields[b"Uid"].split()[0]), zombie


def live_processes_of(proc_fd: int, uid: int) -> list[int]:
    """Pids of ``uid``'s processes that are not zombies, from the /proc opened as ``proc_fd``."""
    alive = []
    for name in os.listdir(proc_fd):
        if not name.isdigit():
            continue
        try:
            fd = os.open(name + "/status", os.O_RDONLY, dir_fd=proc_fd)
            try:
                status = os.read(fd, 1 << 16)
            finally:
                os.close(fd)
            owner, zombie = status_owner(status)
            if owner == uid and not zombie:
                alive.append(int(name))
        except (OSError, KeyError, ValueError, IndexError):
            pass
    return alive


def sweep_uid(proc_fd: int, uid: int) -> None:
    """SIGKILL every process of ``uid`` and reap our children, until none is left."""
    for _ in range(500):
        alive = live_processes_of(proc_fd, uid)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap_all(False)
        if not alive:
            return
        time.sleep(0.002)


def clear_dir(path: str) -> None:
    """Remove everything inside ``path`` (not ``path`` itself), ignoring what cannot go."""
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


# --- relaying one child's results -----------------------------------------------------------------


def message_head(prefix: bytes, index: int) -> bytes:
    """What the manager puts before each line child ``index`` writes: ``NONCE["m",index,``."""
    return prefix + b'["%s",%d,' % (MESSAGE.encode(), index)


class Relay:
    """Relays one child's lines to ``sink``, tagged with its index; watches for the stop marker."""

    def __init__(
        self, sink: Callable[[bytes], None], head: bytes, cap: int, stop_marker: object
    ) -> None:
        self.sink = sink
        self.head = head
        self.cap = cap
        self.stop_marker = stop_marker
        self.buffer = b""
        self.total = 0
        self.saw_marker = stop_marker is None  # without a marker every run counts as started

    def feed(self, data: bytes) -> bool:
        """Relay the complete lines of ``data``; False once the child wrote more than the cap."""
        self.total += len(data)
        if self.total > self.cap:
            return False
        lines = (self.buffer + data).split(b"\n")
        self.buffer = lines.pop()
        for line in lines:
            if not self.saw_marker and len(line) < LONGEST_MARKER_LINE:
                try:
                    self.saw_marker = json.loads(line) == self.stop_marker
                except ValueError:
                    pass
            self.sink(self.head + line + b"]\n")
        return True


def drain(read_fd: int, relay: Relay) -> bool:
    """Relay what is already in the pipe without waiting; True if that went over the cap."""
    os.set_blocking(read_fd, False)
    while True:
        try:
            data = os.read(read_fd, 1 << 16)
        except BlockingIOError:
            return False
        if not data:
            return False
        if not relay.feed(data):
            return True


def child_info(
    status: int, usage: resource.struct_rusage, wall_s: float, timed_out: bool, overflow: bool
) -> dict:
    """The ``info`` of a DONE message."""
    return {
        "status": exit_code(status),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": wall_s,
        "timed_out": timed_out,
        "overflow": overflow,
    }


# --- the harness ----------------------------------------------------------------------------------


class Harness:
    """One sandbox: the job, what has been applied so far, and the manager's bookkeeping."""

    def __init__(self, job: dict) -> None:
        self.job = job
        self.result_fd: int = job["result_fd"]
        self.prefix: bytes = job["nonce"].encode()
        self.limits: dict = job["limits"]
        self.uid: int | None = job["uid"]  # a private uid (root only), or None
        self.report: dict = {}
        self.in_pidns = False
        # Without a PID namespace the manager finds leftovers through the host's /proc, which a
        # private root hides: it keeps a handle (closed in every child before anything runs).
        self.proc_fd: int | None = None
        self.scratch: list[str] = []
        self.driver = None
        self.current: list[int] = []  # the running child's pid

    def emit(self, message: object) -> None:
        """Send one message to the parent on the result pipe."""
        write_all(self.result_fd, self.prefix + frame(message))

    def step(self, name: str, fn: Callable[[], object], *needs: str) -> bool:
        """Apply one protection if asked; probe mode records failures, run mode fails closed."""
        if not self.job["steps"].get(name):
            return False
        if any(not self.report.get(n) for n in needs):
            self.report[name] = False
            self.report[name + "_error"] = "needs " + ",".join(needs)
            return False
        try:
            fn()
        except BaseException as exc:
            self.report[name] = False
            self.report[name + "_error"] = repr(exc)[:300]
            if not self.job["probe"]:
                self.emit([SETUP_ERROR, name, repr(exc)[:300]])
                os._exit(EXIT_SETUP_FAILED)
            return False
        self.report[name] = True
        return True

    # --- setting up (outer harness, then manager) -------------------------------------------------

    def isolate(self) -> None:
        """The namespaces; with a PID namespace only the manager returns from here."""
        self.step("user_namespace", user_namespace)
        self.step("network_namespace", lambda: unshare(CLONE_NEWNET))
        self.step("mount_namespace", private_mounts)
        self.step("ipc_namespace", lambda: unshare(CLONE_NEWIPC))
        self.step("uts_namespace", lambda: unshare(CLONE_NEWUTS))
        self.step("pid_namespace", self.pid_namespace)
        self.in_pidns = bool(self.report.get("pid_namespace")) and os.getpid() == 1

    def pid_namespace(self) -> None:
        """Fork the manager as PID 1 of a new namespace; this process waits and exits like it."""
        unshare(CLONE_NEWPID)
        pid = os.fork()
        if pid:
            os.close(self.result_fd)
            signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
            try:
                exit_like(wait_child(pid)[1])
            except ChildProcessError:
                os._exit(EXIT_NO_MANAGER)

    def prepare_manager(self) -> None:
        """The /proc handle, the private root, the subreaper role and the compiled driver."""
        if not self.in_pidns and self.uid is not None:
            self.proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
        if self.step("chroot", self.chroot, "mount_namespace"):
            self.scratch = list(SCRATCH_IN_ROOT)
        else:
            os.chdir(self.job["workdir"])
            self.scratch = [self.job["workdir"]]
        if not self.in_pidns:
            try:  # orphans of the children come back here to be reaped
                prctl(PR_SET_CHILD_SUBREAPER, 1)
            except OSError:
                pass
        self.driver = compile(self.job["driver"], "<driver>", "exec")

    def chroot(self) -> None:
        """A new root on a size-limited tmpfs: libraries and stdlib read-only, /work, /tmp."""
        root = self.job["root"]
        size = f"size={int(self.limits['tmpfs_mb'])}m,nr_inodes=4096,mode=755"
        mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, size)
        for link, target in self.job["symlinks"]:
            os.makedirs(os.path.dirname(root + link), mode=0o755, exist_ok=True)
            os.symlink(target, root + link)
        for path in self.job["binds"]:
            bind(root, path)
        os.makedirs(root + "/dev", mode=0o755)
        for name in ("null", "zero", "random", "urandom"):
            bind(root, "/dev/" + name, readonly=False)
        if self.in_pidns:
            os.makedirs(root + "/proc", mode=0o555)
            mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            os.symlink("/proc/self/fd", root + "/dev/fd")
        for path, mode in (("/work", 0o700), ("/tmp", 0o1777), ("/dev/shm", 0o1777)):
            os.makedirs(root + path, exist_ok=True)
            os.chmod(root + path, mode)
        if self.uid is not None:
            os.chown(root + "/work", self.uid, self.uid)
        os.chroot(root)
        os.chdir("/work")

    # --- a child: drop privileges, run the driver -------------------------------------------------

    def child(self, payload: object, write_fd: int) -> None:
        """In a fresh child: the per-process protections, then the driver's ``main(payload)``."""
        if self.proc_fd is not None:
            os.close(self.proc_fd)  # a directory outside the private root: never untrusted
        if not self.in_pidns and self.uid is None:
            os.setpgid(0, 0)  # the manager's only handle on what it leaves; see kill_leftovers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self.step("rlimits", lambda: set_rlimits(self.limits))
        self.step("unprivileged_user", lambda: become_user(self.uid))  # type: ignore[arg-type]
        self.step("drop_capabilities", drop_capabilities)
        self.step("no_new_privs", no_new_privs)
        if self.job["probe"]:
            self.emit([SETUP, self.report])
        os.close(self.result_fd)  # from here on only the private pipe: the manager relays it
        scope = {"__name__": "__sandbox_driver__"}
        exec(self.driver, scope)  # type: ignore[arg-type]
        scope["main"](payload, lambda message: write_all(write_fd, frame(message)))

    # --- the manager: one fresh child per payload -------------------------------------------------

    def kill_leftovers(self, child: int) -> None:
        """Kill whatever the last child left running. kill(-1) only as PID 1 of our namespace."""
        if self.in_pidns:
            try:
                os.kill(-1, signal.SIGKILL)  # every process of this namespace but its init (us)
            except OSError:
                pass
            reap_all(True)
        elif self.uid is not None:
            try:
                sweep_uid(self.proc_fd, self.uid)  # type: ignore[arg-type]
            except OSError:
                pass  # the parent sweeps again at the end
        else:  # the child's group was killed before the child was reaped (end_child)
            reap_group(child)

    def on_term(self, *_: object) -> None:
        """SIGTERM: kill the running child and what it left, then exit."""
        for pid in self.current:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.current:
            self.kill_leftovers(self.current[0])
        os._exit(EXIT_TERMINATED)

    def start_child(self, payload: object) -> tuple[int, int]:
        """Fork the child for ``payload``; (its pid, the read end of its private pipe)."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_fd)
                self.child(payload, write_fd)
            except BaseException:
                os._exit(1)
            os._exit(0)
        self.current.append(pid)
        os.close(write_fd)
        return pid, read_fd

    def watch(
        self, pid: int, pidfd: int | None, read_fd: int, relay: Relay, deadline: float
    ) -> tuple[bool, bool, bool]:
        """Relay the child's output until it exits, floods or runs out of time.

        Returns (timed_out, overflow, exited).
        """
        import select

        poller = select.poll()
        poller.register(read_fd, select.POLLIN)
        if pidfd is not None:
            poller.register(pidfd, select.POLLIN)
        overflow = exited = False
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True, overflow, exited
            wait_ms = remaining * 1000 if pidfd is not None else min(remaining * 1000, 5)
            for fd, _ in poller.poll(max(wait_ms, 0)):
                if fd == pidfd:
                    exited = True
                elif not overflow:
                    data = os.read(read_fd, 1 << 16)
                    if not data:
                        poller.unregister(read_fd)
                    overflow = not relay.feed(data)
            if pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                exited = True
            if overflow:
                break
        return False, overflow, exited

    def end_child(self, pid: int, exited: bool) -> tuple[int, resource.struct_rusage]:
        """Kill the child if it still runs (and its group, without a namespace); reap it."""
        if not exited:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if not self.in_pidns and self.uid is None:
            try:  # while the child is unreaped its pid (= its group's id) cannot be reused
                os.killpg(pid, signal.SIGKILL)  # the child's own group; escapes are possible here
            except OSError:
                pass
        _, status, usage = wait_child(pid)
        return status, usage

    def run_one(self, index: int, payload: object) -> tuple[dict, bool]:
        """Run one payload in a fresh child; (its DONE info, whether it emitted the marker)."""
        start = time.monotonic()
        pid, read_fd = self.start_child(payload)
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        relay = Relay(
            lambda line: write_all(self.result_fd, line),
            message_head(self.prefix, index),
            self.limits["result_bytes"],
            self.job["stop_marker"],
        )
        deadline = start + self.limits["wall_s"]
        timed_out, overflow, exited = self.watch(pid, pidfd, read_fd, relay, deadline)
        if exited and not overflow:
            # what the child wrote before it exited; a descendant may still hold the pipe open
            overflow = drain(read_fd, relay)
        status, usage = self.end_child(pid, exited)
        wall = time.monotonic() - start
        self.current.clear()
        os.close(read_fd)
        if pidfd is not None:
            os.close(pidfd)
        self.kill_leftovers(pid)
        for path in self.scratch:
            clear_dir(path)
        return child_info(status, usage, wall, timed_out, overflow), relay.saw_marker

    def serve(self) -> None:
        """Run the payloads in order, stopping after one that did not emit the stop marker."""
        signal.signal(signal.SIGTERM, self.on_term)
        if self.job["probe"]:
            self.emit([SETUP, self.report])
        self.emit([STARTED])
        for index, payload in enumerate(self.job["payloads"]):
            info, saw_marker = self.run_one(index, payload)
            self.emit([DONE, index, info])
            if not saw_marker:
                break
        os._exit(0)


def main() -> None:
    """The sandbox's entry point: read the job, set every protection up, run the payloads."""
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and p != os.getcwd()]
    harness = Harness(read_job())
    harness.isolate()
    harness.prepare_manager()
    harness.serve()


if __name__ == "__main__":
    main()
