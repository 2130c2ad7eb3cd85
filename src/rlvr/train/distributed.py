"""Learners on torch.distributed: one process per rank, the policy sharded with FSDP2.

`torchrun --nproc-per-node N -m rlvr train ...` starts N processes with `RANK`, `WORLD_SIZE`,
`LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` set; a Ray actor that sets the same variables
before calling `init_distributed` joins the same way. `init_distributed` turns them into a
process group (gloo on the CPU, NCCL on CUDA) and a `DistContext`; without them there is one
process and no process group at all: today's path, unchanged.

These are the low-level pieces: the context, the collectives with their lost-rank errors, and
FSDP2's model helpers. What the learner does with them is `rlvr.train.strategy.FSDP2Strategy`
(chosen once by `make_strategy(ctx)` for a context of more than one rank; `LocalStrategy`
otherwise): the rest of the trainer asks the strategy, never `DistContext.sharded`.

`shard_model` applies `fully_shard` to every decoder layer and then to the root, so that each
rank holds 1/N of every parameter (a `DTensor` sharded on dim 0) and a layer's full weights exist
only while it runs. Every rank holds the whole global batch; the update shares its rows among the
ranks (`rlvr.train.update.rank_gradients`), and the gradient collectives of FSDP sum the ranks'
shares; the no-grad forwards split the rows among the ranks too and all-gather the results
(`FSDP2Strategy.no_grad_rows`).

A lost rank is an error, not a hang. Every collective runs under the process group's timeout
(`init_distributed`'s `timeout_s`). With gloo a rank whose peer died gets an error at its next
collective at once ("Connection reset by peer"); one whose peer hangs gets it after the timeout;
the collectives here turn both into `WorkerError` naming the other rank(s). With NCCL the
watchdog aborts the process on a timeout. torchrun itself, when any rank exits with an error,
stops the others (SIGTERM) and exits non-zero naming the failed rank and its exit code; it
restarts nothing unless `--max-restarts` says so. A barrier (`barrier`: the end of the run, a
checkpoint's end, rank 0 making the base model) says every `heartbeat_s` what it waits for.

A lost launcher ends its ranks. torchrun starts every rank in a session of its own, so a
SIGKILL of the launcher's process group (a killed job, `kill -9 -PGID`) does not reach them:
they used to go on training as orphans, writing checkpoints, logs and the model into the run
directory, while a `--resume` of the same run read and wrote it too (issue 28: a resumed run
whose ranks loaded different checkpoints, ended with other weights and then hung).
`init_distributed` therefore has the kernel SIGKILL each rank started by torchrun when its
launcher dies (`die_with_parent`, Linux).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from rlvr.workers import WorkerError

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for each rank, and what a process must have to join a process group."""

_LOST = re.compile(
    r"connection (reset|closed) by peer|timed out|timeout|pair closure|broken pipe",
    re.IGNORECASE,
)
"""Words of the errors gloo and NCCL raise when a peer died or stopped answering."""

HEARTBEAT_S = 60.0
"""Seconds between the `[rlvr] rank R waiting for ...` lines of a barrier that waits."""

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class DistContext:
    """This process's place among the ranks; `world_size == 1` with `backend=None`: one process,
    no process group."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # "gloo" | "nccl" | None (no process group)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes shared files and logs."""
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """More than one rank: models are sharded and the update's rows shared among ranks."""
        return self.world_size > 1

    def peers(self) -> str:
        """The other ranks, for an error naming who was lost: "rank 1", "ranks 1-3"."""
        others = [r for r in range(self.world_size) if r != self.rank]
        if len(others) == 1:
            return f"rank {others[0]}"
        return f"one of ranks {others[0]}-{others[-1]}" if others else "no other rank"


def single_process(device: torch.device) -> DistContext:
    """The context of a run without torch.distributed."""
    return DistContext(rank=0, world_size=1, local_rank=0, device=device, backend=None)


def init_distributed(device: torch.device, timeout_s: float) -> DistContext:
    """Join the process group torchrun's environment variables describe (`ENV_VARS`).

    Without `WORLD_SIZE` in the environment: one process, no process group (`single_process`).
    Otherwise gloo for a CPU `device`, NCCL for CUDA (the rank's device is then
    `cuda:LOCAL_RANK`, made current), every collective failing after `timeout_s` seconds.
    A partial environment is a `ValueError` naming the missing variables."""
    if "WORLD_SIZE" not in os.environ:
        return single_process(device)
    missing = [name for name in ENV_VARS if name not in os.environ]
    if missing:
        raise ValueError(
            f"torch.distributed needs {', '.join(ENV_VARS)} in the environment; "
            f"{', '.join(missing)} missing (start the ranks with torchrun)"
        )
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: go when it goes
        die_with_parent()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    return DistContext(rank, world, local, device, backend)


def die_with_parent() -> bool:
    """Have the kernel SIGKILL this process when its parent (torchrun's launcher, which starts
    each rank in a session of its own) dies; if it died already, exit now. True when set
    (Linux); False elsewhere, where a killed launcher can still leave its ranks running.

    The signal follows the thread that started this process: torch's elastic agent starts
    its ranks from its main thread, which lives as long as the launcher."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() == 1:  # the launcher died before the call: nothing would signal us
        print("[rlvr] the torchrun launcher is gone: this rank stops", file=sys.stderr)
        os._exit(1)
    return True


def destroy() -> None:
    """Leave the process group, if this process is in one."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def lost_rank_as_error(ctx: DistContext, what: str) -> Iterator[None]:
    """Inside the block, a collective failing because a peer died or timed out raises
    `WorkerError` naming the peer(s) and `what` was running; other errors pass unchanged."""
    try:
        yield
    except RuntimeError as err:
        if isinstance(err, WorkerError) or not (
            isinstance(err, dist.DistError) or _LOST.search(str(err))
        ):
            raise
        raise WorkerError(
            ctx.peers(),
            f"lost during {what} as seen from rank {ctx.rank} (it died or did not answer "
            f"within the collective timeout): {err}",
        ) from err


def all_reduce_sum(values: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """Each key's sum over the ranks (float64), the same on every rank; `values` unchanged in
    one process. Every rank must pass the same keys (they are reduced in sorted order)."""
    if not ctx.sharded:
        return dict(values)
    keys = sorted(values)
    total = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    with lost_rank_as_error(ctx, "a metrics all-reduce"):
        total = _on_backend(total, ctx)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return dict(zip(keys, total.cpu().tolist()))


def all_reduce_max(value: float, ctx: DistContext) -> float:
    """The largest `value` over the ranks (NaN if any rank's is NaN), the same on every rank;
    `value` itself in one process."""
    if not ctx.sharded:
        return value
    box = torch.tensor([value], dtype=torch.float64)
    with lost_rank_as_error(ctx, "a metrics all-reduce"):
        box = _on_backend(box, ctx)
        nan = torch.isnan(box).to(box.dtype)
        dist.all_reduce(nan, op=dist.ReduceOp.MAX)
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
    return float("nan") if nan.item() else box.item()


def broadcast_object(obj: Any, ctx: DistContext, src: int = 0) -> Any:
    """Rank `src`'s `obj` (picklable) on every rank; `obj` itself in one process."""
    if not ctx.sharded:
        return obj
    box = [obj]
    with lost_rank_as_error(ctx, "a broadcast"):
        dist.broadcast_object_list(box, src=src, device=ctx.device)
    return box[0]


def barrier(ctx: DistContext, what: str, heartbeat_s: float = HEARTBEAT_S) -> None:
    """Wait until every rank gets here, at most the process group's timeout (then a
    `WorkerError` naming the other ranks and `what`, the place); every `heartbeat_s` seconds
    of waiting a `[rlvr] rank R waiting for ... at WHAT (N s)` line on stderr."""
    if not ctx.sharded:
        return
    with lost_rank_as_error(ctx, what):
        work = dist.barrier(async_op=True)
        start = next_line = time.perf_counter()
        while not work.is_completed():
            time.sleep(0.01)
            if (now := time.perf_counter()) - next_line >= heartbeat_s:
                next_line = now
                print(
                    f"[rlvr] rank {ctx.rank} waiting for {ctx.peers()} at {what} "
                    f"({now - start:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        work.wait()  # raises what the barrier failed with (a lost rank, the timeout)


@contextlib.contextmanager
def main_first(ctx: DistContext, what: str) -> Iterator[None]:
    """Rank 0 runs the block first (it makes what the others then find: a cached base model,
    the run directory), the other ranks after it, all waiting at one barrier."""
    if not ctx.is_main:
        barrier(ctx, f"waiting for rank 0 to make {what}")
    yield
    if ctx.is_main:
        barrier(ctx, f"rank 0 made {what}")


def all_ranks_agree(ok: bool, ctx: DistContext) -> bool:
    """True on every rank when `ok` is true on every rank (a MIN all-reduce): lets all ranks
    raise together when one of them failed, instead of the others waiting at a barrier."""
    if not ctx.sharded:
        return ok
    flag = _on_backend(torch.tensor([1 if ok else 0], dtype=torch.int32), ctx)
    with lost_rank_as_error(ctx, "an agreement all-reduce"):
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _on_backend(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """NCCL reduces device tensors only; gloo takes CPU tensors."""
    return tensor.to(ctx.device) if ctx.backend == "nccl" else tensor


# --- models ----------------------------------------------------------------------------------


def is_sharded(model: torch.nn.Module) -> bool:
    """`model` went through `shard_model` (its root is an FSDP2 module)."""
    return isinstance(model, FSDPModule)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks to shard one by one: Hugging Face's `model.model.layers`, or else
    every module whose class name ends in `DecoderLayer` (a value model's body, say)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
        return list(layers)
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def shard_model(
    model: torch.nn.Module, ctx: DistContext, *, sum_gradients: bool = False
) -> torch.nn.Module:
    """FSDP2 over `ctx`'s ranks, in place: `fully_shard` on each decoder layer
    (`decoder_layers`), then on the root (embeddings, final norm, output head: tied weights stay
    one parameter). Returns `model`, now an `FSDPModule`.

    Gradients: by default FSDP averages them over the ranks, right when every rank computed the
    same loss on the same rows (the critic, which trains on the whole batch on every rank).
    `sum_gradients` sets the divide factor to 1 with sum-only reductions: the gradient is the
    plain sum of the ranks', right when each rank's loss is its share of a global sum (the
    policy: every micro-batch divides by the whole step's tokens or rows). That is exact; the
    alternative, scaling each rank's loss by the world size and letting FSDP divide by it
    again, is a multiply and a divide that round."""
    if not dist.is_initialized() or dist.get_world_size() != ctx.world_size:
        raise ValueError("shard_model needs the process group of init_distributed")
    for layer in decoder_layers(model):  # the default mesh: every rank of the process group
        fully_shard(layer)
    fully_shard(model)
    if sum_gradients:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
    return model


def reshard(model: torch.nn.Module) -> None:
    """Free the gathered weights of every FSDP unit of `model`, leaving only this rank's shards
    registered. FSDP keeps the root's weights gathered after a forward (for the backward that
    usually follows), so after a no-grad forward they are plain tensors beside DTensor shards
    elsewhere: an in-place update from another model or a sharded state dict needs this first.
    Nothing for a model that is not sharded."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights of a sharded `model`, the same full tensors on every rank (one
    all-gather per parameter: a collective, so every rank must call it), on the model's device
    (the CPU under gloo). `model.state_dict()` for a model that is not sharded.

    Every rank gets them, rather than rank 0 and a broadcast, because every rank samples with
    its own unsharded copy (`rollout_copy`); with `cpu_offload` torch would keep them on rank 0
    only."""
    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (a collective); any other tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def rollout_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain deep copy of `model` for the rollout engine of this rank, made before
    `shard_model` (a sharded model cannot be copied into an unsharded one); the loop keeps it
    current with `Learner.state_dict()` once per sync."""
    if is_sharded(model):
        raise ValueError("rollout_copy needs the model before shard_model: copy it first")
    return copy.deepcopy(model)
