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

Runs on N torch.distributed ranks (a `TrainState` whose strategy is `FSDP2Strategy`) write the
same directory with the weights and optimizer moments through `torch.distributed.checkpoint`
(DCP), each rank writing its own shards: `policy/` (the policy and its optimizer), `reference/`,
`critic/` (with its optimizer) are DCP directories; `scheduler.pt` and `meta.json` (which then
records `world_size`) come from rank 0; `rng-<rank>.pt` from each rank. Every rank must see the
same checkpoints directory (one machine, or a shared file system). Such a checkpoint resumes
exactly on the same number of ranks; another number, or one process, is refused, as is a
one-process checkpoint in a run on N ranks. What differs between the two layouts (the model
files, the RNG file's name, the ranks' agreement) is the strategy's (`train/strategy.py`); what
a LoRA policy changes (adapter-only weights, the base checksum) is `train/lora_state.py`'s.

Atomicity: everything is written into a hidden sibling `.tmp-step-000123-<pid>/`, each file
fsynced, the `COMPLETE` marker last, then the directory is renamed to its final name and the
parent fsynced. A crash or full disk at any point leaves either no `step-000123/` or a complete
one; the previous checkpoints are only pruned (to `keep_last`) after the new one is in place.
On N ranks, all write into rank 0's temporary directory, agree that every rank's part is
written (an all-reduce: a rank that failed makes all of them raise, none waits), and rank 0
writes the marker and renames.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.api import CheckpointException

from rlvr.train.lora_state import LoRACheckpointError, check_checkpoint, checkpoint_meta
from rlvr.train.state import TrainState
from rlvr.train.strategy import Parts

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
    On N ranks every rank saves together (a collective: all ranks call this).
    """
    meta_text = _meta_text(state, extra, keep_last)
    step, strategy = state.step, state.strategy
    directory = Path(directory)
    name = step_dir_name(step)
    final = directory / name
    tmp = directory / f".tmp-{name}-{strategy.broadcast(os.getpid())}"  # rank 0's pid
    previous = latest_checkpoint(directory)

    try:
        _write_files(tmp, final, state, meta_text)
    except (OSError, CheckpointException) as err:
        if strategy.is_main:
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

    if keep_last is not None and strategy.is_main:
        for _, old in _complete_checkpoints(directory)[:-keep_last]:
            _remove_dir(old)
    strategy.barrier("the end of a checkpoint")
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
    meta |= state.strategy.checkpoint_meta() | checkpoint_meta(models, state.reference_is_base)
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


def _write_files(tmp: Path, final: Path, state: TrainState, meta_text: str) -> None:
    """Rank 0 (or the one process) makes `tmp`; every rank writes its models and optimizers
    (`Strategy.save_models`: safetensors and .pt files, or DCP shards) and its RNG states; rank
    0 writes the scheduler, meta.json and the marker and renames `tmp` to `final`. On N ranks
    each phase ends with the ranks agreeing that it worked (an OSError on any rank raises on
    all; `Strategy.agreed`)."""
    strategy = state.strategy
    strategy.agreed(lambda: _fresh_dir(tmp), main_only=True)
    strategy.save_models(tmp, _parts(state), _write)
    rng = _rng_state(state.generator)
    strategy.agreed(lambda: _write(tmp / strategy.rng_file(), lambda p: torch.save(rng, p)))

    def finish() -> None:
        if state.scheduler is not None:
            _write(tmp / "scheduler.pt", lambda p: torch.save(state.scheduler.state_dict(), p))
        _write(tmp / "meta.json", lambda p: p.write_text(meta_text))
        _publish(tmp, final)

    strategy.agreed(finish, main_only=True)


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


def _parts(state: TrainState) -> Parts:
    """The state's models, each with the optimizer of its weights, by checkpoint name."""
    parts = {
        "policy": (state.policy, state.optimizer),
        "reference": (state.reference, None),
        "critic": (state.critic, state.critic_optimizer),
    }
    return {key: (m, o) for key, (m, o) in parts.items() if m is not None}


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
    torch and CUDA RNG states. Returns `{"step", "data_position", "extra"}`. On N ranks it
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
    try:
        check_checkpoint(path, models, meta, state.reference_is_base)
    except LoRACheckpointError as err:
        raise CheckpointError(str(err)) from err
    state.strategy.load_models(path, _parts(state))
    if state.scheduler is not None:
        scheduler = torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True)
        state.scheduler.load_state_dict(scheduler)
    _set_rng_state(torch.load(path / state.strategy.rng_file(), weights_only=True), generator)
    state.step, state.data_position = meta["step"], meta["data_position"]
    return {"step": meta["step"], "data_position": meta["data_position"], "extra": meta["extra"]}
