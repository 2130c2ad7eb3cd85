"""Rollout workers on Ray: `RayEngine`, a `RolloutEngine` whose samplers are N Ray actors.

Each actor builds its own engine (by default an `HFEngine` over a fresh copy of the policy's
architecture; any `engine_factory`, such as one building a vLLM engine, can be shipped
instead) and gets the weights through `load_weights`. `generate` splits the prompts into
contiguous, balanced chunks, one per actor, seeds each actor from one draw of the host
generator plus the actor's index (the checkpointed RNG stays on the host, so a resumed run
reproduces), and merges the actors' batches back in prompt order: group ids and `row_index`
number the prompts 0..B-1 of the call, as the in-process engine does. Only plain CPU tensors,
lists and numpy arrays cross the process boundary.

Weights travel as numpy arrays through Ray's object store (`ray.put` once; every actor reads
the same object, zero-copy on its node). "nccl" broadcasts them from the learner's GPU to the
actors' GPUs over a process group of their own instead; it needs CUDA and is untested here.
The packing and the group are in `weight_transport`; starting or joining Ray, in `ray_cluster`.

Every wait on an actor goes through `RayEngine._gather`: it waits in `heartbeat_s` slices,
prints a `[rlvr] waiting for rollout actors 1, 3 (45 s)` line per slice, and raises
`WorkerError` naming the actor and its pid when one dies or does not answer within
`timeout_s`: a lost actor ends the run with its name, never a silent hang. `close` waits for
the actors' teardown and Ray's shutdown at most `close_timeout_s` (they can hang in Ray),
with a heartbeat, and then warns naming them and goes on.

    python -m pip install 'rlvr[ray]'
    ray start --head             # optional: a cluster to join with --ray-address auto
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import torch

from rlvr.config import warn
from rlvr.rollout.engine import HFEngine, RolloutEngine
from rlvr.rollout.ray_cluster import RayEngineError, first_line, import_ray, start_ray
from rlvr.rollout.sampler import RolloutBatch, concat_batches
from rlvr.rollout.weight_transport import (
    WEIGHT_TRANSPORTS,
    PackedWeights,
    broadcast_tensors,
    listening_socket,
    pack_state_dict,
    receive_tensors,
    tensor_specs,
    unique_tensors,
    unpack_state_dict,
    weight_group,
)
from rlvr.workers import WorkerError, wait_settled

PLACEMENTS = ("separate", "colocated")

EngineFactory = Callable[[Any, str], RolloutEngine]
"""`factory(tokenizer, device) -> RolloutEngine`, called once inside each actor."""
CLOSE_TIMEOUT_S = 60.0
"""The longest `RayEngine.close()` waits for the actors' kill and Ray's shutdown."""
CLOSE_HEARTBEAT_S = 10.0
"""Seconds between the `[rlvr] waiting for Ray's teardown ...` lines of a close that waits."""


# --- what runs in each actor ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HFEngineFactory:
    """Builds, inside an actor, an `HFEngine` over a freshly initialised model of the policy's
    Hugging Face architecture on `device` (its weights arrive through `load_weights`)."""

    config: Any  # the policy's transformers config

    def __call__(self, tokenizer, device: str) -> RolloutEngine:
        from transformers import AutoModelForCausalLM

        return HFEngine(AutoModelForCausalLM.from_config(self.config).to(device), tokenizer)


class RolloutActor:
    """The body of one Ray rollout actor: an engine from `engine_factory`, sampling on
    `device` with `threads` torch threads."""

    def __init__(self, engine_factory: EngineFactory, tokenizer, device: str, threads: int):
        torch.set_num_threads(threads)
        self.device = device
        self.engine = engine_factory(tokenizer, device)
        self.group = None

    def pid(self) -> int:
        return os.getpid()

    def generate(self, seed: int | None, *args) -> RolloutBatch:
        """`engine.generate(*args, generator)` (args: prompts, num_samples, max_new_tokens,
        temperature) with a generator seeded by `seed`, the batch's tensors on the CPU."""
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        batch = self.engine.generate(*args, generator)
        cpu = {
            f.name: getattr(batch, f.name).cpu()
            for f in dataclasses.fields(batch)
            if isinstance(getattr(batch, f.name), torch.Tensor)
        }
        return dataclasses.replace(batch, **cpu)

    def load_weights(self, packed: PackedWeights) -> None:
        self.engine.load_weights(unpack_state_dict(packed))

    def join_weight_group(self, host: str, port: int, rank: int, world_size: int, timeout_s):
        self.group = weight_group("nccl", host, port, rank, world_size, timeout_s)

    def receive_weights(self, specs, aliases: dict[str, str], timeout_s: float) -> None:
        state_dict = receive_tensors(self.group, specs, self.device, timeout_s)
        self.engine.load_weights(state_dict | {n: state_dict[t] for n, t in aliases.items()})


# --- the engine the loop talks to -----------------------------------------------------------


class RayEngine:
    """A `RolloutEngine` over `num_workers` Ray actors (see the module docstring).

    `placement`: "separate" gives each actor whole devices of its own (`threads_per_worker`
    CPUs, and one GPU when `device` is "cuda"): start Ray with the learner's GPUs left out;
    "colocated" makes the actors share the learner's devices: each asks for 1/num_workers of
    a GPU (so all fit on one) and for no CPU on a CPU run. On a GPU, Ray sets each actor's
    visible devices, so `device` is only the type ("cpu" or "cuda").

    `weight_transport`: "object-store" (numpy arrays through Ray's object store, any device)
    or "nccl" (a broadcast from the learner's GPU to the actors' GPUs: needs CUDA, NCCL and
    `placement="separate"`, as NCCL cannot broadcast between two processes on one GPU;
    written but untested: no GPU was available to this work).

    `engine_factory(tokenizer, device) -> RolloutEngine` builds each actor's engine (default:
    `HFEngineFactory(model.config)`); for vLLM, a picklable callable holding the model
    directory that returns a `VLLMEngine` (vLLM seeds itself: the per-actor seeds are unused).
    `ray_address` is `start_ray`'s `address`, used when Ray is not initialised yet; `close()`
    shuts Ray down only when this engine started it. The actors import rlvr, so it must be
    installed on every node of a joined cluster.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        num_workers: int,
        *,
        timeout_s: float = 600.0,
        heartbeat_s: float = 30.0,
        placement: str = "separate",
        weight_transport: str = "object-store",
        device: str = "cpu",
        threads_per_worker: int = 1,
        engine_factory: EngineFactory | None = None,
        ray_address: str | None = None,
    ) -> None:
        _check_settings(num_workers, placement, weight_transport, device, threads_per_worker)
        self.tokenizer, self.timeout_s, self.heartbeat_s = tokenizer, timeout_s, heartbeat_s
        self.close_timeout_s = CLOSE_TIMEOUT_S
        self.weight_transport, self._group = weight_transport, None
        self._started_ray = start_ray(ray_address)
        self._ray = import_ray()
        self.actors: list = []
        self.exact_logprobs, self.logprob_path = False, "Ray actors"
        self.pids: list[int | None] = [None] * num_workers
        try:
            resources = _actor_resources(placement, device, num_workers, threads_per_worker)
            _check_cluster(self._ray, resources, num_workers)
            factory = engine_factory or HFEngineFactory(_hf_config(model))
            # the actors' HFEngine runs the learner's forward code; another factory may not
            self.exact_logprobs = isinstance(factory, HFEngineFactory)
            self.logprob_path = f"{num_workers} Ray actor(s), {type(factory).__name__}"
            self._start_actors(factory, num_workers, device, threads_per_worker, resources)
            self.load_weights(model.state_dict())
        except BaseException:
            self.close()
            raise

    def _start_actors(
        self, factory, num_workers: int, device: str, threads: int, resources: dict
    ) -> None:
        env = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(threads)}  # a shared CPU
        actor_class = self._ray.remote(RolloutActor).options(
            **resources, runtime_env={"env_vars": env}
        )
        tokenizer, device = self._ray.put(self.tokenizer), torch.device(device).type
        self.actors = [
            actor_class.remote(factory, tokenizer, device, threads) for _ in range(num_workers)
        ]
        self.pids = self._gather([a.pid.remote() for a in self.actors], "start")

    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """`num_samples` completions per prompt, group-major, as `HFEngine.generate` returns
        them; prompts are sampled in contiguous chunks, one per actor."""
        if not prompts or not self.actors:
            raise ValueError("RayEngine.generate needs prompts and an engine not yet closed")
        seed = None
        if generator is not None:  # one draw per call, whatever the number of actors
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        chunks = contiguous_chunks(len(prompts), len(self.actors))
        refs = [
            actor.generate.remote(
                None if seed is None else seed + i,
                prompts[start:stop],
                num_samples,
                max_new_tokens,
                temperature,
            )
            for i, (actor, (start, stop)) in enumerate(zip(self.actors, chunks))
        ]
        return concat_batches(self._gather(refs, "answer"), self.tokenizer.pad_token_id)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Every actor loads `state_dict`: through the object store (one `ray.put`, the same
        object for all) or the NCCL broadcast, waiting for all with the timeout."""
        if self.weight_transport == "nccl":
            self._broadcast_weights(state_dict)
            return
        packed = self._ray.put(pack_state_dict(state_dict))
        self._gather([actor.load_weights.remote(packed) for actor in self.actors], "answer")

    def _broadcast_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """The "nccl" transport: the learner (rank 0) broadcasts each distinct tensor from its
        GPU; the actors receive into buffers on theirs and load them. Untested (no GPU)."""
        tensors, aliases = unique_tensors(state_dict)
        tensors = {n: (t if t.is_cuda else t.cuda()).contiguous() for n, t in tensors.items()}
        if self._group is None:
            self._group = self._join_weight_group()
        specs = tensor_specs(tensors)
        refs = [a.receive_weights.remote(specs, aliases, self.timeout_s) for a in self.actors]
        broadcast_tensors(self._group, list(tensors.values()), self.timeout_s)
        self._gather(refs, "answer")

    def _join_weight_group(self):
        host = self._ray.util.get_node_ip_address()
        listener, world_size = listening_socket(host), len(self.actors) + 1
        port = listener.getsockname()[1]
        refs = [
            actor.join_weight_group.remote(host, port, rank, world_size, self.timeout_s)
            for rank, actor in enumerate(self.actors, start=1)
        ]
        group = weight_group("nccl", host, port, 0, world_size, self.timeout_s, listener)
        self._gather(refs, "answer")
        return group

    def _name(self, i: int) -> str:
        pid = self.pids[i]
        return f"rollout actor {i}" + ("" if pid is None else f" (pid {pid})")

    def _gather(self, refs: list, doing: str) -> list:
        """`ray.get(refs)` (refs[i] from actor i) that never hangs: waits in `heartbeat_s`
        slices, one `[rlvr] waiting for rollout actors ...` line on stderr per slice; a
        `WorkerError` naming the actor when one dies, or the ones still pending when
        `timeout_s` runs out (`doing`: "start" or "answer"). Errors raised by an actor's own
        code (a `RayTaskError`, also an instance of the original class) pass through."""
        ray = self._ray
        pending, results = {ref: i for i, ref in enumerate(refs)}, [None] * len(refs)
        start = time.monotonic()
        deadline, beat = start + self.timeout_s, start + self.heartbeat_s
        while pending:
            now = time.monotonic()
            if now >= deadline:
                names = ", ".join(self._name(i) for i in sorted(pending.values()))
                raise WorkerError(names, f"did not {doing} within {self.timeout_s:g} s")
            if now >= beat:
                waiting = ", ".join(str(i) for i in sorted(pending.values()))
                print(
                    f"[rlvr] waiting for rollout actors {waiting} ({now - start:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                beat += self.heartbeat_s
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=min(deadline, beat) - now)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    results[i] = ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0))
                except ray.exceptions.RayActorError as err:
                    raise WorkerError(self._name(i), f"died ({first_line(err)})") from err
        return results

    def close(self) -> None:
        """Kill the actors; shut Ray down if this engine started it. Safe to call twice, and
        after Ray was shut down (the actors went with it).

        The teardown runs in a daemon thread, waited on for at most `close_timeout_s` (or
        `timeout_s`, when shorter), with a `[rlvr] waiting for Ray's teardown (...)` line every
        `CLOSE_HEARTBEAT_S` (Ray's shutdown is known to hang at times, in gRPC or its logger
        thread). Past the bound, one warning line names what it waited for and the run goes on
        without it; Ray's own shutdown at the interpreter's exit is then dropped, as it would
        wait again (Ray's processes end with this one). An error of the teardown is raised."""
        actors, started = self.actors, self._started_ray
        self.actors, self._started_ray = [], False
        if not actors and not started:
            return
        ray = self._ray
        names = ", ".join(self._name(i) for i in range(len(actors)))
        parts = ([f"killing {names}"] if actors else []) + (["its shutdown"] if started else [])
        what = f"Ray's teardown ({', then '.join(parts)})"

        def teardown() -> None:
            for actor in actors if ray.is_initialized() else []:
                ray.kill(actor, no_restart=True)
            if started:
                ray.shutdown()

        done: Future = Future()
        threading.Thread(
            target=_run_into, args=(done, teardown), name="rlvr-ray-close", daemon=True
        ).start()
        bound = min(self.close_timeout_s, self.timeout_s)
        if wait_settled(done, what, bound, CLOSE_HEARTBEAT_S):
            done.result()  # the teardown's own error, if it had one
            return
        warn(f"{what} did not end within {bound:g} s; going on without it")
        if started:
            atexit.unregister(ray.shutdown)

    def __enter__(self) -> RayEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _run_into(future: Future, fn: Callable[[], Any]) -> None:
    """`fn()`, its result or error set on `future` (the body of a thread waited on)."""
    try:
        result = fn()
    except BaseException as exc:
        future.set_exception(exc)
    else:
        future.set_result(result)


def contiguous_chunks(n: int, k: int) -> list[tuple[int, int]]:
    """[(start, stop)] of at most `k` contiguous, non-empty slices of range(n) whose sizes
    differ by at most one, in order."""
    k = min(k, n)
    bounds = [i * n // k for i in range(k + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _check_settings(
    num_workers: int, placement: str, weight_transport: str, device: str, threads: int
) -> None:
    """One-line `RayEngineError`s for settings that cannot work, named by the entry points'
    flags (`--rollout-workers` is `num_workers`, `--placement`, `--weight-transport`)."""
    if num_workers < 1 or threads < 1:
        raise RayEngineError(
            f"--rollout-workers {num_workers} (threads_per_worker {threads}): both must be >= 1"
        )
    if placement not in PLACEMENTS:
        raise RayEngineError(f"--placement {placement}: expected one of {', '.join(PLACEMENTS)}")
    if weight_transport not in WEIGHT_TRANSPORTS:
        raise RayEngineError(
            f"--weight-transport {weight_transport}: expected one of {', '.join(WEIGHT_TRANSPORTS)}"
        )
    if torch.device(device).type not in ("cpu", "cuda"):
        raise RayEngineError(f"--device {device}: Ray rollout actors run on cpu or cuda")
    if weight_transport == "nccl":
        if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
            raise RayEngineError(
                "--weight-transport nccl needs CUDA and NCCL, which this machine lacks; "
                "use --weight-transport object-store"
            )
        if torch.device(device).type != "cuda" or placement != "separate":
            raise RayEngineError(
                "--weight-transport nccl needs --device cuda and --placement separate "
                "(NCCL cannot broadcast between processes sharing one GPU)"
            )


def _actor_resources(placement: str, device: str, num_workers: int, threads: int) -> dict:
    """Ray resource requests of one actor (see `RayEngine`'s placements)."""
    on_gpu = torch.device(device).type == "cuda"
    if placement == "colocated":
        return {"num_cpus": 0, "num_gpus": 1 / num_workers if on_gpu else 0}
    return {"num_cpus": threads, "num_gpus": 1 if on_gpu else 0}


def _check_cluster(ray, resources: dict, num_workers: int) -> None:
    """A `RayEngineError` when the cluster can never hold the actors (they would wait for
    resources forever). An autoscaling cluster is judged by what it has now."""
    have = ray.cluster_resources()
    for key, label in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        need = resources[key] * num_workers
        if need > have.get(label, 0) + 1e-9:
            raise RayEngineError(
                f"--rollout-workers {num_workers}: the rollout actors need {need:g} {label}s, "
                f"the Ray cluster has {have.get(label, 0):g}; use fewer, or --placement colocated"
            )


def _hf_config(model: torch.nn.Module):
    """The Hugging Face config the actors rebuild `model` from."""
    config = getattr(model, "config", None)
    if config is None:
        raise RayEngineError(
            f"RayEngine rebuilds the policy from its Hugging Face config; {type(model).__name__} "
            "has none: pass engine_factory"
        )
    return config
