"""How the learner's work is laid out over processes: one (`LocalStrategy`) or the N ranks of a
torch.distributed process group with FSDP2-sharded models (`FSDP2Strategy`).

`make_strategy(dist_ctx)` chooses once (`build_trainer`, `build_state`); the `TrainState` holds
the choice and everything that differs between the two layouts asks it instead of testing the
context: preparing the models, a pass's gradients, the no-grad forwards, the full weights, the
lost-rank error context, the checkpoint's model files and RNG file, the settings a layout cannot
honour, and where the rollouts come from. The low-level collectives stay in
`rlvr.train.distributed`.

The no-grad forwards (reference, critic values, teacher, pi_old) run once over the ranks: under
FSDP2 each rank scores a contiguous block of ceil(N / ranks) rows (the last ranks' blocks padded
with copies of a row, dropped after: a sharded forward is a collective, so every rank must make
the same calls on the same shapes) and the [N, T] results are all-gathered, so the ranks do the
whole batch's work once between them instead of once each.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from rlvr.config import ConfigError
from rlvr.models.lora import is_lora
from rlvr.rollout.sampler import RolloutBatch, select_rows
from rlvr.train.distributed import (
    DistContext,
    all_ranks_agree,
    all_reduce_sum,
    barrier,
    broadcast_object,
    full_state_dict,
    lost_rank_as_error,
    reshard,
    rollout_copy,
    shard_model,
)
from rlvr.train.lora_state import load_weights, save_weights
from rlvr.train.rollouts import BroadcastRollout
from rlvr.train.update import LossFn, UpdateResult, UpdateWork, accumulate_gradients, rank_gradients

Parts = dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]]
"""A checkpoint's models by name ("policy", "reference", "critic"), each with the optimizer of
its weights (None: a frozen model)."""

Writer = Callable[[Path, Callable[[Path], None]], None]
"""`write(path, writer)`: run `writer(path)` and fsync the file (`checkpoint._write`)."""

WHOLE_BATCH_FORWARDS_ENV = "RLVR_WHOLE_BATCH_FORWARDS"
"""Private, for `benchmarks/bench_scale.py`: set to 1, FSDP2 runs every no-grad forward on the
whole batch on every rank (the layout before the row split), to measure the split against."""


def optimizer_file(key: str) -> str:
    """The checkpoint name of part `key`'s optimizer: `optimizer` (the policy's) or
    `KEY_optimizer`."""
    return "optimizer" if key == "policy" else f"{key}_optimizer"


class Strategy(Protocol):
    """What differs between one process and N ranks; every method says what each does."""

    rank: int
    world_size: int

    @property
    def is_main(self) -> bool: ...

    def prepare(self, policy: torch.nn.Module, *copies: torch.nn.Module | None) -> None: ...
    def update_workers(self, local_workers: int) -> int: ...
    def engine_workers(self, workers: int) -> int: ...
    def chunk_tokens(self, chunk_tokens: int) -> int: ...
    def forwards(self, forwards: tuple[str, ...]) -> tuple[str, ...]: ...
    def check_async(self, async_steps: int) -> None: ...
    def describe(self, workers: int) -> str: ...
    def learner_copy(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def share_rollout(self, rollout: Any) -> Any: ...
    def ranks(self, what: str) -> contextlib.AbstractContextManager: ...
    def accumulate(
        self,
        policy: torch.nn.Module,
        batch: RolloutBatch,
        work: UpdateWork,
        per_token: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        loss_fn: LossFn,
        temperature: float,
        workers: int,
        chunk_tokens: int,
    ) -> UpdateResult: ...
    def no_grad_rows(
        self, forward: Callable[[RolloutBatch], torch.Tensor], batch: RolloutBatch, what: str
    ) -> torch.Tensor: ...
    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]: ...
    def broadcast(self, obj: Any) -> Any: ...
    def sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]: ...
    def all_agree(self, ok: bool) -> bool: ...
    def agreed(self, write: Callable[[], None], main_only: bool = False) -> None: ...
    def barrier(self, what: str) -> None: ...
    def rng_file(self) -> str: ...
    def checkpoint_meta(self) -> dict[str, Any]: ...
    def save_models(self, directory: Path, parts: Parts, write: Writer) -> None: ...
    def load_models(self, directory: Path, parts: Parts) -> None: ...


class LocalStrategy:
    """One process: the models as they are, the update's worker threads, every forward on the
    whole batch, one-process checkpoint files."""

    rank, world_size = 0, 1

    @property
    def is_main(self) -> bool:
        return True

    def prepare(self, policy: torch.nn.Module, *copies: torch.nn.Module | None) -> None:
        """Nothing: the models stay whole."""

    def update_workers(self, local_workers: int) -> int:
        """`local_workers`: the CPU threads the update shares its rows among."""
        return local_workers

    def engine_workers(self, workers: int) -> int:
        """`workers`: the in-process engine samples with as many threads as the update."""
        return workers

    def chunk_tokens(self, chunk_tokens: int) -> int:
        """`chunk_tokens` as set (`logprob_chunk_tokens`)."""
        return chunk_tokens

    def forwards(self, forwards: tuple[str, ...]) -> tuple[str, ...]:
        """`forwards` as planned (`GRPOConfig.forward`)."""
        return forwards

    def check_async(self, async_steps: int) -> None:
        """Nothing: one process runs any `async_steps`."""

    def describe(self, workers: int) -> str:
        """How the update ran, for an agreement warning: `W worker thread(s)`."""
        return f"{workers} worker thread(s)"

    def learner_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` itself: the learner trains the model the engine samples with."""
        return model

    def share_rollout(self, rollout: Any) -> Any:
        """`rollout` itself."""
        return rollout

    def ranks(self, what: str) -> contextlib.AbstractContextManager:
        """Nothing to lose: a null context."""
        return contextlib.nullcontext()

    def accumulate(
        self,
        policy: torch.nn.Module,
        batch: RolloutBatch,
        work: UpdateWork,
        per_token: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        loss_fn: LossFn,
        temperature: float,
        workers: int,
        chunk_tokens: int,
    ) -> UpdateResult:
        """`update.accumulate_gradients`: `workers` threads, gradients summed in worker order.
        `per_token` is (advantages, loss mask, reference log-probs)."""
        advantages, loss_mask, ref_logp = per_token
        return accumulate_gradients(
            policy,
            batch,
            work,
            advantages,
            loss_mask,
            ref_logp,
            loss_fn,
            temperature,
            workers,
            logprob_chunk_tokens=chunk_tokens,
        )

    def no_grad_rows(
        self, forward: Callable[[RolloutBatch], torch.Tensor], batch: RolloutBatch, what: str
    ) -> torch.Tensor:
        """`forward(batch)`: [N, T] of the whole batch."""
        return forward(batch)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """`model.state_dict()`."""
        return full_state_dict(model)

    def broadcast(self, obj: Any) -> Any:
        """`obj`."""
        return obj

    def sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        """`values` (a copy): one process holds the whole sum."""
        return dict(values)

    def all_agree(self, ok: bool) -> bool:
        """`ok`."""
        return ok

    def agreed(self, write: Callable[[], None], main_only: bool = False) -> None:
        """`write()`; its OSError passes."""
        write()

    def barrier(self, what: str) -> None:
        """Nothing to wait for."""

    def rng_file(self) -> str:
        """`rng.pt`."""
        return "rng.pt"

    def checkpoint_meta(self) -> dict[str, Any]:
        """Nothing: a checkpoint without `world_size` is a one-process one."""
        return {}

    def save_models(self, directory: Path, parts: Parts, write: Writer) -> None:
        """`KEY.safetensors` per model (`lora_state.save_weights`: a LoRA model's adapters
        only) and `optimizer.pt` / `KEY_optimizer.pt` per optimizer (`torch.save`)."""
        for key, (model, optimizer) in parts.items():
            write(directory / f"{key}.safetensors", lambda p, m=model: save_weights(m, p))
            if optimizer is not None:
                state = optimizer.state_dict()
                write(directory / f"{optimizer_file(key)}.pt", lambda p, o=state: torch.save(o, p))

    def load_models(self, directory: Path, parts: Parts) -> None:
        """What `save_models` wrote, into `parts` in place."""
        for key, (model, optimizer) in parts.items():
            load_weights(model, directory / f"{key}.safetensors")
            if optimizer is not None:
                file = directory / f"{optimizer_file(key)}.pt"
                optimizer.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))


class FSDP2Strategy:
    """N torch.distributed ranks, each one process: FSDP2-sharded models, one share of the
    update's rows per rank, the no-grad forwards split by rows and all-gathered, DCP
    checkpoints. Every method that runs a collective must be called by every rank."""

    def __init__(self, ctx: DistContext, split_forwards: bool = True) -> None:
        self.ctx, self.split_forwards = ctx, split_forwards
        self.rank, self.world_size = ctx.rank, ctx.world_size

    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    def prepare(self, policy: torch.nn.Module, *copies: torch.nn.Module | None) -> None:
        """`fully_shard` the policy with its gradients summed over the ranks (each rank's loss
        is its share of a global sum) and each copy (the reference, the critic, copied from the
        policy before: a sharded model cannot be deep-copied whole) with FSDP's averaged
        gradients (the critic trains on the whole batch on every rank). A LoRA policy is a
        `ConfigError`: its adapter-only checkpoints and adapters-off reference are not built
        for sharded weights."""
        if is_lora(policy):
            raise ConfigError(
                "LoRA with more than one torch.distributed rank is not supported: run LoRA in "
                "one process (drop torchrun / --nproc-per-node) or train the full model"
            )
        shard_model(policy, self.ctx, sum_gradients=True)
        for model in copies:
            if model is not None:
                shard_model(model, self.ctx)

    def update_workers(self, local_workers: int) -> int:
        """The world size: one update worker per rank (`local_workers` unused)."""
        return self.world_size

    def engine_workers(self, workers: int) -> int:
        """1: rank 0 samples with one thread (its cores are shared with the other ranks')."""
        return 1

    def chunk_tokens(self, chunk_tokens: int) -> int:
        """0, whole logits: the chunked head calls the decoder outside the root module's FSDP
        hooks, which leaves the root's parameters sharded."""
        return 0

    def forwards(self, forwards: tuple[str, ...]) -> tuple[str, ...]:
        """`rank_forwards(forwards)`."""
        return rank_forwards(forwards)

    def check_async(self, async_steps: int) -> None:
        """`ConfigError` for `async_steps > 0`: not built for several ranks yet."""
        if async_steps > 0:
            raise ConfigError(
                "async_steps > 0 with several torchrun ranks is not supported yet: run the "
                "asynchronous mode in one process (with --ray rollout workers if you like)"
            )

    def describe(self, workers: int) -> str:
        """`FSDP ranks`."""
        return "FSDP ranks"

    def learner_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        """A plain deep copy of `model` (`rollout_copy`) for the learner to shard; `model`
        stays whole for this rank's engine, which every sync gathers the weights into."""
        return rollout_copy(model)

    def share_rollout(self, rollout: Any) -> Any:
        """`BroadcastRollout`: rank 0 samples and verifies, every rank gets the batch."""
        return BroadcastRollout(rollout, self.ctx)

    def ranks(self, what: str) -> contextlib.AbstractContextManager:
        """A rank lost during `what` raises `WorkerError` naming it (`lost_rank_as_error`)."""
        return lost_rank_as_error(self.ctx, what)

    def accumulate(
        self,
        policy: torch.nn.Module,
        batch: RolloutBatch,
        work: UpdateWork,
        per_token: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
        loss_fn: LossFn,
        temperature: float,
        workers: int,
        chunk_tokens: int,
    ) -> UpdateResult:
        """`update.rank_gradients`: this rank runs `work.shards[rank]`, the gradients summed
        over the ranks by FSDP, the loss and metrics all-reduced (the same on every rank)."""
        return rank_gradients(policy, batch, work, per_token, loss_fn, temperature, self.ctx)

    def no_grad_rows(
        self, forward: Callable[[RolloutBatch], torch.Tensor], batch: RolloutBatch, what: str
    ) -> torch.Tensor:
        """[N, T] `forward` of the batch with each rank running its own rows once: rank r the
        rows [r * B, (r + 1) * B) of the N, B = ceil(N / ranks), a block short of B rows padded
        with copies of its last row (or of row N - 1) so every rank calls `forward` on B rows;
        the blocks all-gathered in rank order and cut back to N rows: the same on every rank.
        Run on the whole batch on every rank instead when `split_forwards` is off."""
        with self.ranks(what):
            if not self.split_forwards:
                return forward(batch)
            n = len(batch.completion_ids)
            block = max(1, -(-n // self.world_size))
            start = min(self.rank * block, n)
            rows = torch.arange(start, min(start + block, n))
            if len(rows) < block:  # a copy of a real row: its values are dropped below
                fill = rows[-1] if len(rows) else torch.tensor(n - 1)
                rows = torch.cat([rows, fill.repeat(block - len(rows))])
            mine = forward(select_rows(batch, rows)).contiguous()
            blocks = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(blocks, mine)
            return torch.cat(blocks)[:n]

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The unsharded weights gathered on every rank (`distributed.full_state_dict`)."""
        with self.ranks("gathering the weights"):
            return full_state_dict(model)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        return broadcast_object(obj, self.ctx)

    def sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        """Each key's sum over the ranks (float64), the same on every rank
        (`distributed.all_reduce_sum`; every rank passes the same keys)."""
        return all_reduce_sum(values, self.ctx)

    def all_agree(self, ok: bool) -> bool:
        """True on every rank when `ok` is true on every rank (`distributed.all_ranks_agree`):
        decisions the ranks' clocks and signals could take differently."""
        return all_ranks_agree(ok, self.ctx)

    def agreed(self, write: Callable[[], None], main_only: bool = False) -> None:
        """Run `write` on every rank (rank 0 only with `main_only`); when it raised OSError on
        any rank, raise OSError on all of them (the rank's own error where it had one)."""
        error: OSError | None = None
        if self.is_main or not main_only:
            try:
                write()
            except OSError as err:
                error = err
        if not all_ranks_agree(error is None, self.ctx):
            raise error or OSError("another rank could not write its part of the checkpoint")

    def barrier(self, what: str) -> None:
        """Wait for every rank at `what` (`distributed.barrier`)."""
        barrier(self.ctx, what)

    def rng_file(self) -> str:
        """`rng-<rank>.pt`: each rank's own random streams."""
        return f"rng-{self.rank}.pt"

    def checkpoint_meta(self) -> dict[str, Any]:
        """`world_size`: such a checkpoint resumes on as many ranks only."""
        return {"world_size": self.world_size}

    def save_models(self, directory: Path, parts: Parts, write: Writer) -> None:
        """One DCP directory `KEY/` per model, holding this rank's shards of its weights and
        optimizer moments (every rank writes its own; `write` unused: DCP writes the files)."""
        with self.ranks("a checkpoint"):
            for key, (model, optimizer) in parts.items():
                dcp.save(_dcp_state(model, optimizer), checkpoint_id=directory / key)

    def load_models(self, directory: Path, parts: Parts) -> None:
        """Every rank reads its shards of each model and optimizer (DCP)."""
        with self.ranks("loading a checkpoint"):
            for key, (model, optimizer) in parts.items():
                saved = _dcp_state(model, optimizer)
                dcp.load(saved, checkpoint_id=directory / key)
                if optimizer is None:
                    set_model_state_dict(model, saved["model"])
                else:
                    set_state_dict(
                        model,
                        optimizer,
                        model_state_dict=saved["model"],
                        optim_state_dict=saved["optimizer"],
                    )


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """This rank's shards of `model`'s weights and `optimizer`'s moments, as DCP saves them and
    loads into them."""
    reshard(model)  # a no-grad forward leaves the root's weights gathered
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def rank_forwards(forwards: tuple[str, ...]) -> tuple[str, ...]:
    """The loss's forwards FSDP2 ranks can run: `forwards` without the shared-prompt one, which
    calls the decoder outside the root module's FSDP hooks (padded when nothing is left)."""
    return tuple(f for f in forwards if f != "shared-prompt") or ("padded",)


def make_strategy(ctx: DistContext | None) -> LocalStrategy | FSDP2Strategy:
    """`FSDP2Strategy` for a context over more than one rank (`DistContext.sharded`), else
    `LocalStrategy`. `RLVR_WHOLE_BATCH_FORWARDS=1` (benchmarks only) turns the row split of
    the no-grad forwards off."""
    if ctx is None or not ctx.sharded:
        return LocalStrategy()
    return FSDP2Strategy(ctx, split_forwards=os.environ.get(WHOLE_BATCH_FORWARDS_ENV) != "1")
