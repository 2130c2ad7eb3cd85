"""The base model: a fresh tiny model "pretrained" by next-token prediction on a task's flawed
corpus, the stand-in for a pretrained checkpoint. One cache serves the lab (`rlvr lab`/`train`)
and a pipeline's `base` stage: a base is trained once per key, the hash of everything that
determines its weights, and lives in `$RLVR_CACHE/base-KEY` (default ~/.cache/rlvr).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlvr.config import ConfigError
from rlvr.models.tiny import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    check_tiny,
    save_model,
)
from rlvr.report.run_log import RunLog
from rlvr.tasks.spec import TaskSpec
from rlvr.train.sft import train_next_token

BASE_FORMAT_VERSION = 1  # bump when the corpus or base training changes meaning


@dataclass(frozen=True)
class BaseConfig:
    """How the base model is "pretrained" on a flawed corpus."""

    flaw_prob: float = 0.65
    """Chance of each realistic mistake in the corpus; for arithmetic, that each carry is
    dropped (about half the solutions end wrong and the wrong procedure is the majority)."""
    hedge_prob: float | None = None
    """Arithmetic: chance that a corpus solution hedges between both procedures' answers
    (`#### 715 or 825`), which a weak verifier pays for and a strict one does not. None: 0.1
    with --verifier weak (so there is something to game), else 0."""
    steps: int = 800
    """Next-token training steps."""
    batch_size: int = 16
    """Solutions per step (800 steps of 16 learned to copy digits; 200 of 64 did not)."""
    lr: float = 2e-3
    """Peak AdamW learning rate (warm-up then cosine decay to a tenth)."""
    seed: int = 0
    """Seed of the initial weights and the corpus."""


def check_base(task: TaskSpec, base: BaseConfig, prefix: str = "--base.") -> None:
    """Refuse a base model that cannot be trained, before anything is built or written: a
    setting of `base` out of range (a `ConfigError` naming it as `prefix` + the field, as a
    flag when `prefix` is one: `--base.batch-size`), or a task with no corpus to train on (a
    dataset file without solutions; its corpus's first pair is drawn, cheap for every task)."""
    bounds = [
        ("steps", base.steps >= 1, ">= 1"),
        ("batch_size", base.batch_size >= 1, ">= 1"),
        ("lr", base.lr > 0, "> 0"),
        ("flaw_prob", 0 <= base.flaw_prob <= 1, "in [0, 1]"),
        ("hedge_prob", base.hedge_prob is None or 0 <= base.hedge_prob <= 1, "in [0, 1]"),
    ]
    for name, ok, bound in bounds:
        if not ok:
            shown = name.replace("_", "-") if prefix.startswith("--") else name
            raise ConfigError(f"{prefix}{shown} must be {bound}, got {getattr(base, name)}")
    try:
        next(iter(task.corpus(base.seed, base.flaw_prob)))
    except ValueError as exc:  # the task's refusal, which names its file and what to pass
        raise ConfigError(str(exc)) from None


def check_shape(
    task: TaskSpec, tiny: TinyModelConfig, budget: int | None = None, prefix: str = "--tiny."
) -> None:
    """Refuse a tiny-model shape that cannot be built or cannot hold the task's longest
    held-out prompt plus the completion budget (`budget`, default the task's), in characters:
    the tiny model's tokens, plus BOS and EOS (`check_tiny`)."""
    prompts = max((len(str(row["prompt"])) for row in task.held_out_rows()), default=0)
    check_tiny(tiny, prompts + (budget or task.max_new_tokens) + 2, prefix)


def cache_root(cache_dir: str | None) -> Path:
    """Where base models are cached: `cache_dir`, else $RLVR_CACHE, else ~/.cache/rlvr."""
    if cache_dir:
        return Path(cache_dir)
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr"))


def prepared_model_dir(name: str, cache_dir: str | None = None) -> Path:
    """Where `rlvr models prepare NAME` keeps the converted checkpoint (present or not)."""
    return cache_root(cache_dir) / "models" / name


def resolved_hedge_prob(hedge_prob: float | None, verifier: str) -> float:
    """`BaseConfig.hedge_prob` as a number: None is 0.1 when training on the weak verifier
    (so there is something to game), else 0."""
    if hedge_prob is not None:
        return hedge_prob
    return 0.1 if verifier == "weak" else 0.0


def base_model_key(
    task: str, task_config: object | None, tiny: TinyModelConfig, base: BaseConfig
) -> str:
    """Hash of everything that determines a base model's weights: the task's name (as
    `rlvr.tasks.registry.TaskChoice.name` gives it) and config (a dataclass for arithmetic and
    reasoning; for a dataset file its `--columns` mapping, with the file's content hash;
    ignored for the others), the model's shape and the `BaseConfig` fields of
    `base`, its `hedge_prob` resolved to a number."""
    if base.hedge_prob is None:
        raise ValueError("base_model_key: resolve hedge_prob first (resolved_hedge_prob)")
    settings = {f.name: getattr(base, f.name) for f in dataclasses.fields(BaseConfig)}
    # every key holds "arithmetic" (None unless the task is arithmetic), so the lab's keys
    # from before the lab and the pipelines shared this cache still name the same bases
    payload = {
        "version": BASE_FORMAT_VERSION,
        "task": task,
        "arithmetic": None,
        "tiny": dataclasses.asdict(tiny),
        "base": settings,
    }
    if task in ("arithmetic", "reasoning"):
        payload[task] = dataclasses.asdict(task_config)
    elif Path(task).exists():  # a dataset file: an edited file or another mapping is new data
        payload["data_sha256"] = _content_hash(Path(task))
        payload["columns"] = task_config
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _content_hash(path: Path) -> str:
    """sha256 of a file's bytes, or of every file's relative name and bytes under a
    directory (a `datasets` save), in sorted order."""
    digest = hashlib.sha256()
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def base_model_dir(
    task: str,
    task_config: object | None,
    tiny: TinyModelConfig,
    base: BaseConfig,
    cache_dir: str | None = None,
) -> Path:
    """The cache directory of the base that `base_model_key` names."""
    return cache_root(cache_dir) / f"base-{base_model_key(task, task_config, tiny, base)}"


def cached_base_model(
    task: str,
    spec: TaskSpec,
    task_config: object | None,
    tiny: TinyModelConfig,
    base: BaseConfig,
    cache_dir: str | None = None,
    log: RunLog | None = None,
) -> tuple[Path, bool]:
    """(directory of the base model, whether it came from the cache) of task `task`, whose
    spec is `spec` (built from `task_config`): trained by `train_cached_base` into
    `base_model_dir` unless the cache has it, its progress bar shown unless `log` is quiet
    (None: shown). `base.hedge_prob` must be resolved."""
    directory = base_model_dir(task, task_config, tiny, base, cache_dir)
    cached = train_cached_base(
        directory,
        spec,
        tiny,
        seed=base.seed,
        flaw_prob=base.flaw_prob,
        steps=base.steps,
        batch_size=base.batch_size,
        lr=base.lr,
        progress=log is None or log.progress,
    )
    return directory, cached


def train_cached_base(
    directory: Path,
    task: TaskSpec,
    shape: TinyModelConfig,
    *,
    seed: int,
    flaw_prob: float,
    steps: int,
    batch_size: int,
    lr: float,
    progress: bool,
) -> bool:
    """A tiny model "pretrained" on `task`'s flawed corpus, saved to `directory` unless a
    complete one is there already; returns whether it was (the caller keys the directory by
    everything that determines the weights)."""
    if (directory / "config.json").exists():
        return True
    corpus = task.corpus(seed, flaw_prob)  # a task without one refuses before the model
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(shape, tokenizer, seed=seed)
    train_next_token(
        model, tokenizer, corpus, steps=steps, batch_size=batch_size, lr=lr, progress=progress
    )
    # write to a temporary name, then rename: a half-written base is never taken for a good one
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, tokenizer, tmp)
    if directory.exists():
        shutil.rmtree(tmp)
    else:
        tmp.rename(directory)
    return False
