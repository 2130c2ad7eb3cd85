"""The capability probe's driver: checks from inside a sandbox what the harness's report claims.

Standard library only, nothing from rlvr: `rlvr.verifiers.sandbox.sandbox_capabilities` sends
this file's source to a probe sandbox, whose child calls ``main(payload, emit)``; it emits one
``[CHECKS, checks]`` message. Importing it only defines names.
"""

from __future__ import annotations

import errno
import os
import socket

TYPE_CHECKING = False  # typing is not imported: the sandbox would pay for it
if TYPE_CHECKING:
    from collections.abc import Callable

CHECKS = "checks"  # the message tag (rlvr.verifiers.sandbox reads it)
STDLIB_SAMPLE = (
    "collections decimal fractions functools heapq itertools math random re statistics string "
    "bisect datetime json ctypes"
).split()


def loopback() -> str:
    """ "connected", "refused" (the host's network is visible) or "unreachable" (a network ns)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(0.5)
    try:
        s.connect(("127.0.0.1", 9))  # loopback only; refused means the host stack is visible
        return "connected"
    except OSError as exc:
        return "refused" if exc.errno == errno.ECONNREFUSED else "unreachable"
    finally:
        s.close()


def stdlib_checks() -> dict:
    """``{"stdlib": True}`` if a sample of the standard library imports, else False and why."""
    try:
        for name in STDLIB_SAMPLE:
            __import__(name)
    except Exception as exc:
        return {"stdlib": False, "stdlib_error": repr(exc)[:300]}
    return {"stdlib": True}


def fork_works() -> bool:
    """Whether this process can fork a child and see its exit code."""
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        return os.waitpid(pid, 0)[1] >> 8 == 7
    except OSError:
        return False


def main(payload: object, emit: Callable[[object], None]) -> None:
    """Emit ``[CHECKS, {"uid", "etc_visible", "loopback", "stdlib", "fork", ...}]``."""
    checks: dict = {"uid": os.getuid(), "etc_visible": os.path.exists("/etc/passwd")}
    checks["loopback"] = loopback()
    checks.update(stdlib_checks())
    checks["fork"] = fork_works()
    emit([CHECKS, checks])
