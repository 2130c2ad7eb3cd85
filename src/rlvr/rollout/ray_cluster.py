"""Starting or joining the Ray cluster the rollout actors run in: `start_ray` (a local Ray
bound to 127.0.0.1 only, or a running cluster's address checked to answer first), `import_ray`
and `RayEngineError`, the one-line error of a Ray setting rlvr cannot honour.

    python -m pip install 'rlvr[ray]'
    ray start --head             # optional: a cluster to join with --ray-address auto
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator

from rlvr.config import UserError

INSTALL_HINT = "pip install 'rlvr[ray]'"


class RayEngineError(UserError, ValueError):
    """A Ray setting rlvr cannot honour: Ray missing, a cluster address nothing answers at,
    or actors asking for more than the cluster has."""


def import_ray():
    """The `ray` module, or a one-line `RayEngineError` saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise RayEngineError(f"Ray rollout workers need Ray: {INSTALL_HINT}") from err
    return ray


def start_ray(
    address: str | None, num_cpus: int | None = None, temp_dir: str | None = None
) -> bool:
    """Join the Ray cluster at `address` ("auto": the one `ray start --head` started on this
    machine; or host:port), or start a local one bound to 127.0.0.1 only when `address` is
    None. Does nothing when Ray is already initialised in this process. Returns whether this
    call initialised Ray, i.e. whether the caller should `ray.shutdown()` when done. Ray's own
    logging is turned down to errors and the actors' output stays in Ray's log files
    (`<temp_dir>/session_latest/logs/`); what goes wrong in an actor comes back as the
    exception of the call. `num_cpus` and `temp_dir` apply to a local cluster only."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet = dict(logging_level=logging.ERROR, log_to_driver=False)
    if address is None:
        with _loopback_only(ray):
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                _temp_dir=temp_dir,
                **quiet,
            )
        return True
    host_port = _reachable_address(ray, address)
    on_loopback = host_port.rpartition(":")[0] in ("127.0.0.1", "localhost", "[::1]")
    try:
        with _loopback_only(ray) if on_loopback else contextlib.nullcontext():
            ray.init(address=address, **quiet)  # as given: Ray treats "auto" apart (auth)
    except (ConnectionError, RuntimeError) as err:
        raise RayEngineError(f"--ray-address {address}: {_join_problem(err)}") from err
    return True


def _join_problem(err: BaseException) -> str:
    """What went wrong joining a cluster, in a line. Ray 2.60 authenticates with a token by
    default, and joins by an explicit address only with RAY_AUTH_MODE=token set."""
    text = " ".join(str(e) for e in (err, err.__cause__, err.__context__) if e is not None)
    if "InvalidAuthToken" in text or "AuthenticationError" in text:
        return (
            "the cluster refused this process's authentication token; set RAY_AUTH_MODE=token "
            "(and RAY_AUTH_TOKEN, or the head's ~/.ray/auth_token), or use --ray-address auto "
            "on the head's machine"
        )
    return first_line(err)


@contextlib.contextmanager
def _loopback_only(ray) -> Iterator[None]:
    """Inside the block a new local Ray binds 127.0.0.1 only. Ray replaces 127.0.0.1 by the
    machine's external address (so that other nodes could join) unless its "no multi-node
    cluster" switch is off: set here in the environment its processes inherit and in the
    constant this process read when it imported Ray, both restored after."""
    constants = ray._private.ray_constants
    name = constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    before_env, before_flag = os.environ.get(name), constants.ENABLE_RAY_CLUSTER
    os.environ[name], constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = before_flag
        if before_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before_env


def _reachable_address(ray, address: str, timeout_s: float = 5.0) -> str:
    """host:port of the cluster `address` names ("auto" looked up as Ray does; a cluster on
    127.0.0.1 kept there), or a one-line `RayEngineError` unless something accepts a TCP
    connection there (Ray itself retries an unreachable address for minutes)."""
    try:
        with _loopback_only(ray):  # Ray's lookup would turn 127.0.0.1 into the external address
            host_port = ray._private.services.canonicalize_bootstrap_address_or_die(address)
        host, _, port = host_port.rpartition(":")
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (ConnectionError, OSError, ValueError) as err:
        raise RayEngineError(
            f"--ray-address {address}: no Ray cluster answers there ({first_line(err)}); "
            "start one with `ray start --head`, or leave --ray-address out to start a local one"
        ) from err
    return host_port


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
