"""Train a policy with GRPO: what `rlvr train` (the lab) and a pipeline's `grpo` stage share.

`load_policy` loads the starting model and puts LoRA adapters on it; `train_policy` builds the
rollout engine (on rank 0 only under torchrun: the other ranks get rank 0's batch), runs
`train_grpo` and closes the engine whatever happens. The caller evaluates around it and saves
the policy with `common.save_policy` (a LoRA policy is merged in place when saved, so the lab's
final evaluation comes first).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from rlvr.devices import Precision
from rlvr.models.lora import LoRAConfig
from rlvr.models.tiny import load_model
from rlvr.pipelines.common import with_lora
from rlvr.pipelines.engines import RolloutPlacement, build_engine, close_engine
from rlvr.report.run_dir import RunDirectory
from rlvr.report.run_log import RunLog
from rlvr.rollout.episodes import EpisodeSpec
from rlvr.tasks.rewards import RewardFn
from rlvr.train.config import GRPOConfig
from rlvr.train.distributed import DistContext
from rlvr.train.grpo import Evaluator, train_grpo


def load_policy(
    model_dir: str | Path, lora: LoRAConfig, seed: int, precision: Precision
) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) of `model_dir` on `precision.device`, with LoRA adapters when
    `lora.rank > 0` (seeded by `seed`; `common.with_lora`)."""
    model, tokenizer = load_model(model_dir, device=precision.device)
    return with_lora(model, lora, seed), tokenizer


def train_policy(
    model: torch.nn.Module,
    tokenizer: Any,
    model_dir: str | Path,
    rows: Iterator[dict[str, Any]],
    reward_fns: Sequence[RewardFn],
    grpo: GRPOConfig,
    run: RunDirectory,
    evaluate: Evaluator,
    *,
    lora: LoRAConfig,
    rollout: RolloutPlacement,
    precision: Precision,
    seed: int,
    log: RunLog,
    reward_weights: Sequence[float] | None = None,
    strict_reward_fn: RewardFn | None = None,
    resume: bool = False,
    initial_eval: dict[str, float] | None = None,
    dist_ctx: DistContext | None = None,
    episodes: EpisodeSpec | None = None,
) -> list[dict[str, Any]]:
    """GRPO on `model` from `rows` (`train_grpo`, logging to `run`); returns its records.

    The rollout engine samples where `rollout` says (`build_engine`: in-process, vLLM or Ray
    actors that load `model_dir` and get the weights after every update); under torchrun only
    rank 0 builds one. It is closed when training ends or fails. `lora` is checked against the
    placement by the caller (`check_placement`). With `episodes` the rollouts are episodes in
    a multi-turn task's environment (`rlvr.rollout.episodes`)."""
    main = dist_ctx is None or dist_ctx.is_main
    engine = None
    if main:
        engine = build_engine(
            rollout, model, tokenizer, Path(model_dir), precision, seed, grpo.worker_timeout_s
        )
    try:
        return train_grpo(
            model,
            tokenizer,
            rows,
            reward_fns,
            grpo,
            run,
            evaluate,
            seed=seed,
            reward_weights=reward_weights,
            progress=log.progress,
            strict_reward_fn=strict_reward_fn,
            resume=resume,
            engine=engine,
            initial_eval=initial_eval,
            dist_ctx=dist_ctx,
            episodes=episodes,
        )
    finally:
        close_engine(engine)
