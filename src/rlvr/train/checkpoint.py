"""Checkpoints a GRPO run can resume from, bit for bit.

A checkpoint is a directory `step-000123/` inside a checkpoints directory:

- `policy.safetensors`: the policy's weights, the thing being trained. For a LoRA policy only
  its adapters (the parameters that train): the base is frozen, so the model the run is
  resumed with already holds it. `meta.json` then records a checksum of the base (the sum of
  squares of its weights) and loading refuses a different base.
- `reference.safetensors` (when `beta > 0`): the reference model. It is the *initial* policy
  or a slow EMA of it, which the current policy cannot rebuild. A LoRA policy's reference is
  its own base (adapters disabled): nothing to save.
- `critic.safetensors` (PPO, `gae`): the value model, trained alongside the policy.
- `optimizer.pt`, `critic_optimizer.pt`: AdamW's moments and step counts. Without them the
  next update differs (a fresh Adam takes a bias-corrected, full-size first step).
- `scheduler.pt`: the LR scheduler's position, or warmup would restart.
- `rng.pt`: Python `random`, NumPy's global stream, torch CPU, every CUDA device, and the
  sampling `torch.Generator`. Sampling draws from these; the same state gives the same
  completions, so a resumed run continues exactly as an uninterrupted one.
- `meta.json`: step, `data_position` (training rows consumed, so the row stream restarts
  where it stopped), `extra` (JSON, e.g. the config), the saved components, format version.
- `COMPLETE`: a manifest of every file's name and size, written last. A directory without it
  is not a checkpoint; a file whose size differs from the manifest is reported as damaged.

Weights are written with safetensors (`safetensors.torch.save_model`): loading one runs no
pickled code, it is readable by any safetensors tool (the policy can be inspected without
rlvr), and `save_model` handles the tiny model's tied embedding/LM-head weights, which
`save_file` refuses. Optimizer, scheduler and RNG states are nested dicts and lists of tensors
and numbers, which safetensors cannot hold; they are written with `torch.save` and read back
with `torch.load(weights_only=True)`, which also refuses to run arbitrary pickled code.

Sharded runs (a `TrainState` whose models FSDP2 shards over N torch.distributed ranks) write
the same directory with the weights and optimizer moments through `torch.distributed.checkpoint`
(DCP), each rank writing its own shards: `policy/` (the policy and its optimizer), `reference/`,
`critic/` (with its optimizer) are DCP directories; `scheduler.pt` and `meta.json` (which then
records `world_size`) come from rank 0; `rng-<rank>.pt` from each rank. Every rank must see the
same checkpoints directory (one machine, or a shared file system). A sharded checkpoint resumes
exactly on the same number of ranks; another number, or one process, is refused, as is a
one-process checkpoint in a sharded run.

Atomicity: everything is written into a hidden sibling `.tmp-step-000123-<pid>/`, each file
fsynced, the `COMPLETE` marker last, then the directory is renamed to its final name and the
parent fsynced. A crash or full disk at any point leaves either no `step-000123/` or a complete
one; the previous checkpoints are only pruned (to `keep_last`) after the new one is in place.
Sharded, all ranks write into rank 0's temporary directory, agree that every rank's part is
written (an all-reduce: a rank that failed makes all of them raise, none waits), and rank 0
writes the marker and renames.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from rlvr.models.lora import adapter_state_dict, is_lora
from rlvr.train.distributed import (
    DistContext,
    all_ranks_agree,
    barrier,
    broadcast_object,
    lost_rank_as_error,
    reshard,
)
from rlvr.train.state import TrainState

FORMAT_VERSION = 1
MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says what is still usable."""


def step_dir_name(step: int) -> str:
    """`step-000123`: zero-padded so names sort by step up to a million steps."""
    return f"step-{step:06d}"


# --- listing ---------------------------------------------------------------------------------


def _complete_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for child in directory.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / MARKER).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in `directory`, or None.

    Temporary (`.tmp-*`), half-deleted (`.deleting-*`) and marker-less directories are ignored.
    """
    found = _complete_checkpoints(Path(directory))
    return found[-1][1] if found else None


def latest_checkpoint_step(directory: str | os.PathLike) -> int | None:
    """The step of the newest complete checkpoint in `directory` (a resumed run goes on after
    it), or None when there is none."""
    found = _complete_checkpoints(Path(directory))
    return found[-1][0] if found else None


# --- saving ----------------------------------------------------------------------------------


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, writer: Callable[[Path], None]) -> None:
    """Write one file with `writer(path)` and fsync it before returning."""
    writer(path)
    _fsync_path(path)


def _rng_state(generator: torch.Generator | None) -> dict[str, Any]:
    """Every random stream a run draws from, as tensors, lists and numbers (weights_only-safe)."""
    version, internal, gauss_next = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss_next],
        "numpy": [np_kind, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "generator": generator.get_state() if generator is not None else None,
    }
    return state


def _set_rng_state(state: dict[str, Any], generator: torch.Generator | None) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state(
        (np_kind, np.asarray(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss)
    )
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None:  # absent from checkpoints written before CUDA states
        if torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            warnings.warn(
                f"checkpoint holds RNG states for {len(state['cuda'])} CUDA device(s) but "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} are visible; "
                "CUDA random streams are not restored",
                stacklevel=3,
            )
    if generator is not None:
        generator.set_state(state["generator"])


@torch.no_grad()
def _base_checksum(model: torch.nn.Module) -> float:
    """Sum of squares (float64) of `model`'s frozen weights: tells one LoRA base from another.

    In chunks, so that a large embedding is never copied to float64 whole."""
    total = 0.0
    for param in model.parameters():
        if not param.requires_grad:
            for chunk in param.detach().flatten().split(1 << 24):
                total += chunk.double().square().sum().item()
    return total


def _save_weights(model: torch.nn.Module, path: Path) -> None:
    """All of a plain model's weights; only the trainable ones (adapters) of a LoRA model."""
    if is_lora(model):
        weights = {k: v.detach().contiguous() for k, v in adapter_state_dict(model).items()}
        safetensors.torch.save_file(weights, str(path))
    else:
        safetensors.torch.save_model(model, str(path))


def save_checkpoint(
    directory: str | os.PathLike,
    state: TrainState,
    *,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = 3,
) -> Path:
    """Write `directory/step-NNNNNN/` for `state.step` atomically and return its path.

    Everything in `state` is saved: its models, optimizer and scheduler states, the sampling
    generator and the global RNGs, and `state.data_position` (how many training rows have been
    consumed: a resumed run skips that many); `extra` is any JSON-serialisable dict (e.g. the
    config, the last eval). After the
    new checkpoint is complete, all but the newest `keep_last` complete checkpoints are
    deleted (`None` keeps all). An OSError while writing (a full disk, say) removes the
    temporary directory and raises `CheckpointError` saying which previous checkpoint is intact.
    A sharded state is saved by every rank together (a collective: all ranks call this).
    """
    meta_text = _meta_text(state, extra, keep_last)
    step, ctx = state.step, state.dist_ctx if state.sharded else None
    directory = Path(directory)
    name = step_dir_name(step)
    final = directory / name
    pid = os.getpid() if ctx is None else broadcast_object(os.getpid(), ctx)  # rank 0's
    tmp = directory / f".tmp-{name}-{pid}"
    previous = latest_checkpoint(directory)

    try:
        if ctx is None:
            _fresh_dir(tmp)
            _write_local_files(tmp, state, meta_text)
            _publish(tmp, final)
        else:
            _save_sharded(tmp, final, state, meta_text, ctx)
    except (OSError, CheckpointException) as err:
        if ctx is None or ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        full = getattr(err, "errno", None) == errno.ENOSPC
        reason = "the disk is full" if full else "an OS error"
        kept = (
            f"The previous checkpoint {previous} is intact."
            if previous is not None and (previous / MARKER).is_file()
            else f"There is no earlier complete checkpoint in {directory}."
        )
        raise CheckpointError(
            f"could not write checkpoint {final} ({reason}: {err}); nothing was saved for "
            f"step {step}. {kept}"
        ) from err

    if keep_last is not None and (ctx is None or ctx.is_main):
        for _, old in _complete_checkpoints(directory)[:-keep_last]:
            _remove_dir(old)
    if ctx is not None:
        barrier(ctx, "the end of a checkpoint")
    return final


def _meta_text(state: TrainState, extra: dict[str, Any] | None, keep_last: int | None) -> str:
    """meta.json's text for `state`, after checking its step, data position and `keep_last`
    (ValueError)."""
    step, data_position, generator = state.step, state.data_position, state.generator
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if not isinstance(data_position, int) or data_position < 0:
        raise ValueError(f"data_position must be a non-negative int, got {data_position!r}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None (keep all), got {keep_last!r}")
    models, states = state.modules(), state.stateful()
    meta = {
        "format_version": FORMAT_VERSION,
        "components": sorted(models) + sorted(states) + (["generator"] if generator else []),
        "step": step,
        "data_position": data_position,
        "extra": extra if extra is not None else {},
    }
    if state.sharded:
        meta["world_size"] = state.world_size
    lora = {key: _base_checksum(m) for key, m in models.items() if is_lora(m)}
    if lora:  # only for LoRA runs: other checkpoints stay as they were
        meta["adapter_only"] = lora
        meta["reference_is_base"] = state.reference_is_base
    try:
        return json.dumps(meta, indent=2, sort_keys=True)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint `extra` must be JSON-serialisable: {err}") from err


def _fresh_dir(tmp: Path) -> None:
    """An empty `tmp` (and its parent), whatever an earlier crash left there."""
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()


def _write_local_files(tmp: Path, state: TrainState, meta_text: str) -> None:
    """One process's checkpoint files: weights (safetensors), optimizer and scheduler states,
    RNG states, meta.json."""
    for key, model in state.modules().items():
        _write(tmp / f"{key}.safetensors", lambda p, m=model: _save_weights(m, p))
    for key, obj in state.stateful().items():
        _write(tmp / f"{key}.pt", lambda p, o=obj: torch.save(o.state_dict(), p))
    rng = _rng_state(state.generator)
    _write(tmp / "rng.pt", lambda p: torch.save(rng, p))
    _write(tmp / "meta.json", lambda p: p.write_text(meta_text))


def _publish(tmp: Path, final: Path) -> None:
    """The `COMPLETE` manifest (every file's relative path and size) written last, then `tmp`
    renamed to `final`, each step fsynced."""
    manifest = {
        f.relative_to(tmp).as_posix(): f.stat().st_size
        for f in sorted(tmp.rglob("*"))
        if f.is_file()
    }
    _write(tmp / MARKER, lambda p: p.write_text(json.dumps(manifest, indent=2)))
    _fsync_path(tmp)
    _replace_dir(tmp, final)
    _fsync_path(final.parent)


def _sharded_parts(
    state: TrainState,
) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]]:
    """The DCP directories of a sharded state: each model with the optimizer of its weights."""
    parts = {
        "policy": (state.policy, state.optimizer),
        "reference": (state.reference, None),
        "critic": (state.critic, state.critic_optimizer),
    }
    return {key: (m, o) for key, (m, o) in parts.items() if m is not None}


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """This rank's shards of `model`'s weights and `optimizer`'s moments, as DCP saves them and
    loads into them."""
    reshard(model)  # a no-grad forward leaves the root's weights gathered
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def _save_sharded(
    tmp: Path, final: Path, state: TrainState, meta_text: str, ctx: DistContext
) -> None:
    """Rank 0 makes `tmp`; every rank writes its shards (DCP) and its RNG states; rank 0 writes
    the scheduler, meta.json and the marker and renames `tmp` to `final`. Each phase ends with
    the ranks agreeing that it worked (an OSError on any rank raises on all)."""
    _agreed(lambda: _fresh_dir(tmp), ctx, main_only=True)
    with lost_rank_as_error(ctx, "a checkpoint"):
        for key, (model, optimizer) in _sharded_parts(state).items():
            dcp.save(_dcp_state(model, optimizer), checkpoint_id=tmp / key)
    rng = _rng_state(state.generator)
    _agreed(lambda: _write(tmp / f"rng-{ctx.rank}.pt", lambda p: torch.save(rng, p)), ctx)

    def finish() -> None:
        _write(tmp / "scheduler.pt", lambda p: torch.save(state.scheduler.state_dict(), p))
        _write(tmp / "meta.json", lambda p: p.write_text(meta_text))
        _publish(tmp, final)

    _agreed(finish, ctx, main_only=True)


def _agreed(write: Callable[[], None], ctx: DistContext, *, main_only: bool = False) -> None:
    """Run `write` on every rank (rank 0 only with `main_only`); when it raised OSError on any
    rank, raise OSError on all of them (the rank's own error where it had one)."""
    error: OSError | None = None
    if ctx.is_main or not main_only:
        try:
            write()
        except OSError as err:
            error = err
    if not all_ranks_agree(error is None, ctx):
        raise error or OSError("another rank could not write its part of the checkpoint")


def _replace_dir(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; an existing `final` (a re-save of the same step) is moved aside
    first and deleted after, so a crash never leaves a mix of the two."""
    if final.exists():
        aside = final.parent / f".deleting-{final.name}-{os.getpid()}"
        os.rename(final, aside)
        os.rename(tmp, final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(tmp, final)


def _remove_dir(path: Path) -> None:
    """Rename out of the `step-*` namespace first, so a half-deleted directory that still holds
    its marker is never listed as complete."""
    aside = path.parent / f".deleting-{path.name}-{os.getpid()}"
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


# --- loading ---------------------------------------------------------------------------------


def load_checkpoint(path: str | os.PathLike, state: TrainState) -> dict[str, Any]:
    """Restore everything `save_checkpoint` wrote into `state`, in place (its step and data
    position included).

    `state` must hold the objects that were saved (same shapes; a reference, critic or
    scheduler exactly when one was saved): a mismatch raises `CheckpointError` rather than
    resuming with part of the state silently fresh. Also restores the global Python, NumPy,
    torch and CUDA RNG states. Returns `{"step", "data_position", "extra"}`. A sharded state
    loads on every rank together (a collective), from a checkpoint saved by as many ranks.
    """
    path = Path(path)
    marker = path / MARKER
    if not marker.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    manifest = json.loads(marker.read_text())
    for file_name, size in manifest.items():
        actual = path / file_name
        if not actual.is_file() or actual.stat().st_size != size:
            raise CheckpointError(
                f"{path} is damaged: {file_name} is missing or not {size} bytes as written"
            )
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {meta.get('format_version')}, expected {FORMAT_VERSION}"
        )
    models, states, generator = state.modules(), state.stateful(), state.generator
    given = sorted(models) + sorted(states) + (["generator"] if generator else [])
    if sorted(given) != sorted(meta["components"]):
        raise CheckpointError(
            f"{path} holds {sorted(meta['components'])} but {sorted(given)} were passed to load "
            "into; pass the same objects the run saved"
        )

    saved_ranks = meta.get("world_size", 1)
    if saved_ranks != state.world_size:
        raise CheckpointError(
            f"{path} was saved by {saved_ranks} torch.distributed rank(s) but this run has "
            f"{state.world_size}; resume with the same number (torchrun --nproc-per-node "
            f"{saved_ranks})"
        )
    if state.sharded:
        assert state.dist_ctx is not None
        _load_sharded(path, state, state.dist_ctx)
    else:
        _load_local(path, state, meta)
    _set_rng_state(torch.load(path / _rng_file(state), weights_only=True), generator)
    state.step, state.data_position = meta["step"], meta["data_position"]
    return {"step": meta["step"], "data_position": meta["data_position"], "extra": meta["extra"]}


def _rng_file(state: TrainState) -> str:
    """`rng.pt` in one process; each rank's own `rng-<rank>.pt` when sharded."""
    return f"rng-{state.dist_ctx.rank}.pt" if state.sharded and state.dist_ctx else "rng.pt"


def _load_local(path: Path, state: TrainState, meta: dict[str, Any]) -> None:
    """One process's weights (adapters only for LoRA, checked first) and optimizer and
    scheduler states."""
    models = state.modules()
    adapter_only = meta.get("adapter_only", {})
    _check_lora(path, models, adapter_only, meta.get("reference_is_base", False), state)
    for key, model in models.items():
        device = str(next(model.parameters()).device)
        file = path / f"{key}.safetensors"
        if key in adapter_only:
            _load_adapters(model, file, device)
        else:
            safetensors.torch.load_model(model, file, strict=True, device=device)
    for key, obj in state.stateful().items():
        obj.load_state_dict(torch.load(path / f"{key}.pt", map_location="cpu", weights_only=True))


def _load_sharded(path: Path, state: TrainState, ctx: DistContext) -> None:
    """Every rank reads its shards of each model and optimizer (DCP) and the scheduler."""
    with lost_rank_as_error(ctx, "loading a checkpoint"):
        for key, (model, optimizer) in _sharded_parts(state).items():
            saved = _dcp_state(model, optimizer)
            dcp.load(saved, checkpoint_id=path / key)
            if optimizer is None:
                set_model_state_dict(model, saved["model"])
            else:
                set_state_dict(
                    model,
                    optimizer,
                    model_state_dict=saved["model"],
                    optim_state_dict=saved["optimizer"],
                )
    scheduler = torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True)
    state.scheduler.load_state_dict(scheduler)


def _check_lora(
    path: Path,
    models: dict[str, torch.nn.Module],
    adapter_only: dict[str, float],
    reference_is_base: bool,
    state: TrainState,
) -> None:
    """CheckpointError, before anything is loaded, unless the models are LoRA exactly where the
    checkpoint's were, with the same adapters on the same base weights, and the reference is
    the base exactly when it was."""
    for key, model in models.items():
        if is_lora(model) != (key in adapter_only):
            saved = "LoRA adapters" if key in adapter_only else "a full model"
            raise CheckpointError(
                f"{path} holds {saved} for {key!r} but the {key} passed "
                f"{'is' if is_lora(model) else 'is not'} a LoRA model; build it as the run did"
            )
        if key not in adapter_only:
            continue
        with safetensors.safe_open(path / f"{key}.safetensors", "pt") as file:
            saved_shapes = {k: tuple(file.get_slice(k).get_shape()) for k in file.keys()}
        shapes = {k: tuple(p.shape) for k, p in adapter_state_dict(model).items()}
        if saved_shapes != shapes:
            differ = sorted(
                k
                for k in saved_shapes.keys() | shapes.keys()
                if saved_shapes.get(k) != shapes.get(k)
            )
            raise CheckpointError(
                f"{path}: the {key}'s adapters differ from the checkpoint's ({len(differ)} "
                f"names or shapes, e.g. {differ[:2]}); use the LoRA settings the run used"
            )
        checksum = _base_checksum(model)
        if not math.isclose(checksum, adapter_only[key], rel_tol=1e-9):
            raise CheckpointError(
                f"{path}: the {key}'s frozen base weights differ from the run's (sum of "
                f"squares {checksum!r}, saved {adapter_only[key]!r}); resume on the base "
                "model the run started from"
            )
    if reference_is_base != state.reference_is_base:
        raise CheckpointError(
            f"{path} was saved with reference_is_base={reference_is_base} but the state has "
            f"{state.reference_is_base}; pass the same objects the run saved"
        )


def _load_adapters(model: torch.nn.Module, file: Path, device: str) -> None:
    """Load a LoRA model's trainable weights (checked by `_check_lora`); the frozen base is left
    as it is."""
    result = model.load_state_dict(safetensors.torch.load_file(file, device=device), strict=False)
    assert not result.unexpected_keys, result.unexpected_keys
