"""Where a run's rollouts are sampled: `--engine hf|vllm`, `--ray --rollout-workers N`.

`RolloutPlacement` is the part of an entry point's config that says it; `build_engine` turns it
into the `RolloutEngine` the loop samples from, or None for the loop's default (in process, with
the policy itself). The choices compose: vLLM or the in-process sampler, in this process or in
each of N Ray actors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.config import ConfigError
from rlvr.devices import Precision
from rlvr.rollout.engine import RolloutEngine, VLLMEngine
from rlvr.rollout.ray_engine import PLACEMENTS  # imports no Ray
from rlvr.rollout.weight_transport import WEIGHT_TRANSPORTS

ENGINES = ("hf", "vllm")


@dataclass(frozen=True)
class RolloutPlacement:
    """`--engine`, `--ray`, `--rollout-workers`, `--ray-address`, `--placement`,
    `--weight-transport` of an entry point (the fields of its config)."""

    engine: str = "hf"
    """hf: rlvr's sampler with the policy itself; vllm: vLLM's engine (a GPU, or vLLM's CPU
    build in its own venv: scripts/vllm_check.sh)."""
    ray: bool = False
    """Sample on Ray rollout actors, each with its own copy of the policy."""
    rollout_workers: int = 2
    """Ray rollout actors (with --ray)."""
    ray_address: str | None = None
    """Join this Ray cluster (auto, or HOST:PORT of `ray start --head`); default: start a local
    one on 127.0.0.1."""
    placement: str = "separate"
    """separate: each actor on devices of its own; colocated: the actors share the learner's."""
    weight_transport: str = "object-store"
    """object-store: numpy arrays through Ray's object store; nccl: a GPU broadcast (CUDA)."""


def check_placement(p: RolloutPlacement, lora: bool) -> None:
    """Refuse impossible combinations before any model loads (one `ConfigError` line)."""
    if p.engine not in ENGINES:
        raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, got {p.engine!r}")
    if p.placement not in PLACEMENTS:
        raise ConfigError(f"--placement must be one of {', '.join(PLACEMENTS)}")
    if p.weight_transport not in WEIGHT_TRANSPORTS:
        raise ConfigError(f"--weight-transport must be one of {', '.join(WEIGHT_TRANSPORTS)}")
    if p.rollout_workers < 1:
        raise ConfigError(f"--rollout-workers must be >= 1, got {p.rollout_workers}")
    if not p.ray and p.ray_address is not None:
        raise ConfigError("--ray-address joins a Ray cluster for rollout workers: add --ray")
    if (p.engine == "vllm" or p.ray) and lora:
        flag = "--engine vllm" if p.engine == "vllm" else "--ray"
        raise ConfigError(
            f"{flag} loads the policy's full weights into its own model after each update; "
            "with --lora.rank the policy is an adapter model: sample in process (leave "
            f"{flag} out)"
        )


def build_engine(
    p: RolloutPlacement,
    model: torch.nn.Module,
    tokenizer,
    model_dir: Path,
    precision: Precision,
    seed: int,
    timeout_s: float,
) -> RolloutEngine | None:
    """The engine `p` asks for, holding `model`'s current weights: None for the in-process
    default; a `VLLMEngine` over `model_dir` (the weights the run starts from); or a
    `RayEngine` of `rollout_workers` actors, each sampling with its own copy (vLLM's, with
    `--engine vllm`), every wait bounded by `timeout_s`."""
    factory = (
        VLLMFactory(str(model_dir), precision.dtype_name, seed) if p.engine == "vllm" else None
    )
    if not p.ray:
        return factory(tokenizer, str(precision.device)) if factory else None
    from rlvr.rollout.ray_engine import RayEngine

    return RayEngine(
        model,
        tokenizer,
        p.rollout_workers,
        timeout_s=timeout_s,
        placement=p.placement,
        weight_transport=p.weight_transport,
        device=precision.device.type,
        engine_factory=factory,
        ray_address=p.ray_address,
    )


def close_engine(engine: RolloutEngine | None) -> None:
    """Stop an engine's workers (Ray actors; Ray itself when the engine started it)."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


@dataclass(frozen=True)
class VLLMFactory:
    """Builds a `VLLMEngine` inside a Ray actor (picklable: a path and two settings)."""

    model_dir: str
    dtype: str
    seed: int

    def __call__(self, tokenizer, device: str) -> RolloutEngine:
        return VLLMEngine(self.model_dir, tokenizer, device, self.dtype, seed=self.seed)
