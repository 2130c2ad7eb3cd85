"""The stages a pipeline is made of: each reads models/data of earlier stages, writes its own.

A stage is a kind plus its settings (one frozen dataclass per kind, filled from the pipeline
file; unknown keys are refused, naming the valid ones):

- `base`     "pretrain" a fresh tiny model on the task's flawed corpus (carry slips, mixed
             notation): the stand-in for a pretrained checkpoint;
- `sft`      supervised fine-tuning (`rlvr sft`'s trainer) on a mix of data sources: the task's
             readable solutions, no-think examples, or an earlier `sample` stage's output;
- `grpo`     GRPO on the task's strict verifier, optionally plus the format/consistency reward,
             on prompts in one or more thinking modes; with `teacher: STAGE`, on-policy
             distillation from that earlier stage's model (the reverse KL per token);
- `sample`   rejection sampling (`rlvr sample`): verified completions, optionally only readable
             ones, written as SFT data;
- `thinking_budget`  accuracy and tokens against a thinking budget, with its figure.
- `dpo`      DPO / IPO (`rlvr.pipelines.dpo`) on pairs of the model's verified samples, offline
             or iterated (pairs regenerated from the policy every K steps);
- `error_kinds`  the kinds of earlier stages' held-out errors, and their accuracy curves
             (`rlvr.pipelines.error_kinds`).

Every stage function has the signature `(settings, ctx, stage_dir) -> outputs`, where outputs
name the files it wrote (`model`, `data`, `figure`). `ctx` is the pipeline's shared state
(`rlvr.pipelines.common.PipelineContext`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from rlvr.config import ConfigError, apply_overrides, from_dict, to_dict
from rlvr.models.lora import LoRAConfig
from rlvr.models.tiny import load_model
from rlvr.pipelines.base_model import BaseConfig, cached_base_model, resolved_hedge_prob
from rlvr.pipelines.common import (
    SAMPLE_ROWS_SEED_OFFSET,
    TRAIN_ROWS_SEED_OFFSET,
    PipelineContext,
    field_at,
    save_policy,
)
from rlvr.pipelines.dpo import DPOStage, run_dpo_stage
from rlvr.pipelines.engines import RolloutPlacement, check_placement
from rlvr.pipelines.error_kinds import ErrorKindsStage, run_error_kinds_stage
from rlvr.pipelines.sft import SFTConfig, run_sft
from rlvr.pipelines.train_policy import load_policy, train_policy
from rlvr.report.loggers import open_loggers
from rlvr.report.plots import format_table, plot_thinking_budget
from rlvr.report.run_dir import RunDirectory
from rlvr.tasks import reasoning
from rlvr.tasks.spec import TaskSpec
from rlvr.train.config import GRPOConfig, check_grpo_config
from rlvr.train.evaluate import held_out_accuracy, think_mode_check, thinking_budget_curve
from rlvr.train.rejection import RejectionConfig, rejection_sample

# --- base --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseStage(BaseConfig):
    """A fresh tiny model trained by next-token prediction on the task's flawed corpus: the
    settings of `BaseConfig` (the lab's base uses the same class and cache), plus `tiny`."""

    tiny: dict[str, int] = field(default_factory=dict)
    """Model-shape overrides of the pipeline's `tiny` (e.g. a smaller student)."""


def run_base(s: BaseStage, ctx: PipelineContext, stage_dir: Path) -> dict[str, str]:
    """Train the base, or take it from the cache the lab uses too (`$RLVR_CACHE`, keyed by
    everything that determines its weights), so runs that start from the same base train it
    once."""
    shape = apply_overrides(ctx.tiny, s.tiny)
    # pipelines train on the strict verifier; the reasoning corpus has no hedges anyway
    base = dataclasses.replace(s, hedge_prob=resolved_hedge_prob(s.hedge_prob, "strict"))
    directory, cached = cached_base_model(
        "reasoning", ctx.task, ctx.task_config, shape, base, log=ctx.log
    )
    return {"model": str(directory), **({"cached": "true"} if cached else {})}


# --- sft ---------------------------------------------------------------------------------


SFT_STAGE_OWNS = (
    "data",
    "task.name",
    "model",
    "run_dir",
    "resume",
    "place.overwrite",
    "place.progress",
    "chat_template",
    "place.device",
    "place.dtype",
)
"""`SFTConfig` fields (dotted paths) a pipeline's SFT stage sets itself: its `sft:` settings
may not."""


@dataclass(frozen=True)
class SFTStage:
    """Supervised fine-tuning on `data`: a list of sources, each `readable:N` (clean long
    chain of thought), `think:N` (the same, prompts tagged /think), `no_think:N` (empty
    think block), the name of an earlier `sample` stage (all its verified rows), or
    `STAGE@MODE` (those rows with their prompts re-tagged, e.g. `samples@think`). The
    trainer's own options are `sft` (YAML `sft: {steps: 30, lr: 5.0e-4}`), `SFTConfig`'s
    defaults where not given; the fields in `SFT_STAGE_OWNS` are the stage's to set."""

    data: tuple[str, ...] = ("readable:200",)
    model: str | None = None
    """Stage whose model is fine-tuned (default: the previous model-producing stage)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """The trainer's options (`rlvr.pipelines.sft.SFTConfig`); its seed also seeds the data."""

    def __post_init__(self) -> None:
        default = SFTConfig()
        taken = [f for f in SFT_STAGE_OWNS if field_at(self.sft, f) != field_at(default, f)]
        if taken:
            raise ConfigError(
                f"sft: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} set by the "
                "stage itself (use the stage's data and model keys)"
            )


def sft_pairs(sources: tuple[str, ...], ctx: PipelineContext, seed: int) -> list[dict[str, str]]:
    """The (prompt, completion) rows of `sources` (see `SFTStage.data`)."""
    rows: list[dict[str, str]] = []
    makers: dict[str, Callable[[int], list[tuple[str, str]]]] = {
        "readable": lambda n: reasoning.readable_solutions(ctx.task_config, n, seed),
        "think": lambda n: reasoning.readable_solutions(ctx.task_config, n, seed, mode="think"),
        "no_think": lambda n: reasoning.no_think_examples(ctx.task_config, n, seed + 1),
    }
    for source in sources:
        kind, _, count = source.partition(":")
        stage, _, mode = source.partition("@")
        if kind in makers and count.isdigit():
            rows += [{"prompt": p, "completion": c} for p, c in makers[kind](int(count))]
        elif "data" in ctx.outputs.get(stage, {}) and mode in ("", *reasoning.MODES):
            with open(ctx.outputs[stage]["data"]) as f:
                stage_rows = [json.loads(line) for line in f]
            if mode:
                stage_rows = [
                    {**r, "prompt": reasoning.set_mode(r["prompt"], mode)} for r in stage_rows
                ]
            rows += stage_rows
        else:
            raise ConfigError(
                f"unknown SFT data source {source!r}: use readable:N, think:N, no_think:N, "
                "the name of an earlier sample stage, or STAGE@MODE"
            )
    return rows


def run_sft_stage(s: SFTStage, ctx: PipelineContext, stage_dir: Path) -> dict[str, str]:
    """Write the stage's SFT data (`sft_pairs`) and fine-tune the stage's model on it."""
    rows = sft_pairs(s.data, ctx, s.sft.place.seed + ctx.seed)
    if not rows:
        raise ValueError(f"{stage_dir.name}: the SFT data sources {list(s.data)} are empty")
    data = stage_dir / "sft_data.jsonl"
    with open(data, "w") as f:
        for row in rows:
            f.write(json.dumps({"prompt": row["prompt"], "completion": row["completion"]}) + "\n")
    config = dataclasses.replace(
        s.sft,
        data=str(data),
        model=ctx.model_of(s.model),
        chat_template=False,
        place=dataclasses.replace(
            s.sft.place,
            progress=ctx.log.progress,
            overwrite=True,
            device=str(ctx.precision.device),
            dtype=ctx.precision.dtype_name,
        ),
    )
    model_dir = run_sft(config, run_dir=stage_dir / "sft")
    return {"model": str(model_dir), "data": str(data)}


# --- grpo --------------------------------------------------------------------------------


MAX_STEPS_WITH_TIME_LIMIT = 10_000
"""The step cap of a GRPO stage with `same_time_as`: its time limit ends it first."""


@dataclass(frozen=True)
class GRPOStage:
    """GRPO from `model` on the strict verifier (+ `consistency_weight` x readability); the
    trainer's own switches are `grpo` (YAML `grpo: {steps: 40, lr: 1.0e-4}`), GRPOConfig's
    defaults where not given (`max_new_tokens` None: the task's budget)."""

    model: str | None = None
    """Stage whose model is trained (default: the previous model-producing stage)."""
    consistency_weight: float = 0.0
    """Weight of R1's language-consistency reward (the readability score of each completion)."""
    mode_weight: float = 0.0
    """Weight of the mode-following reward (empty think block for /no_think, else thinking)."""
    modes: tuple[str, ...] = ("default",)
    """Thinking modes of the training prompts, cycled (e.g. [think, no_think])."""
    same_time_as: str | None = None
    """Stop after as many wall seconds as this earlier stage took (equal-compute comparison);
    `grpo.steps` is then `MAX_STEPS_WITH_TIME_LIMIT`."""
    seed: int = 0
    """Added to the pipeline's seed for this stage's rows and sampling."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """The trainer's switches (`rlvr.train.config.GRPOConfig`)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters on the policy (YAML `lora: {rank: 16}`); the stage's model is saved with
    them merged (or as the adapter alone with `save_adapter_only`)."""
    rollout: RolloutPlacement = field(default_factory=RolloutPlacement)
    """Where the stage's rollouts are sampled (YAML `rollout: {ray: true, rollout_workers:
    2}` or `{engine: vllm}`), as `rlvr train`'s `--ray`, `--rollout-workers`, `--engine`."""
    teacher: str | None = None
    """On-policy distillation: the earlier stage whose model is the teacher (its per-token
    reverse KL on this stage's own samples is the advantage, `grpo.distill.kl_coef` and
    `grpo.distill.reward_coef` weigh it and the verifier's); the stage sets
    `grpo.distill.teacher`."""


def grpo_stage_config(
    s: GRPOStage, task: TaskSpec, max_seconds: float = 0.0, teacher_dir: str | None = None
) -> GRPOConfig:
    """The stage's GRPOConfig as it trains: the task's budget where `max_new_tokens` is None,
    with a time limit the step cap, and with a `teacher` stage its model directory
    `teacher_dir` (None, before the pipeline runs: a stand-in naming the stage). Checked by
    `check_grpo_config` (a ConfigError)."""
    config = s.grpo
    if s.teacher is not None:
        if config.distill.teacher is not None:
            raise ConfigError(
                "teacher: the stage's teacher is set by `teacher: STAGE`; leave "
                "grpo.distill.teacher unset"
            )
        stand_in = f"<the model of stage {s.teacher}>"
        distill = dataclasses.replace(config.distill, teacher=teacher_dir or stand_in)
        config = dataclasses.replace(config, distill=distill)
    if config.max_new_tokens is None:
        config = dataclasses.replace(config, max_new_tokens=task.max_new_tokens)
    if max_seconds:
        config = dataclasses.replace(
            config, steps=MAX_STEPS_WITH_TIME_LIMIT, max_seconds=max_seconds
        )
    try:
        check_grpo_config(config)
    except ValueError as exc:
        raise ConfigError(f"grpo: {exc}") from exc
    try:
        check_placement(s.rollout, s.lora.enabled)
    except ConfigError as exc:
        raise ConfigError(f"rollout: {exc}") from exc
    return config


def run_grpo_stage(s: GRPOStage, ctx: PipelineContext, stage_dir: Path) -> dict[str, str]:
    """GRPO from the stage's model on the task's strict reward plus the weighted extras."""
    max_seconds = 0.0
    if s.same_time_as is not None:
        if s.same_time_as not in ctx.seconds:
            raise ConfigError(f"same_time_as: stage {s.same_time_as!r} has not run")
        max_seconds = ctx.seconds[s.same_time_as]
    teacher_dir = None
    if s.teacher is not None:
        try:
            teacher_dir = ctx.model_of(s.teacher)
        except ConfigError as exc:
            raise ConfigError(f"teacher: {exc}") from None
    config = grpo_stage_config(s, ctx.task, max_seconds, teacher_dir)
    model_dir = Path(ctx.model_of(s.model))
    seed = ctx.seed + s.seed
    model, tokenizer = load_policy(model_dir, s.lora, seed, ctx.precision)
    reward_fns, weights = [ctx.task.reward_fn], [1.0]
    if s.consistency_weight:
        reward_fns.append(reasoning.format_consistency_reward)
        weights.append(s.consistency_weight)
    if s.mode_weight:
        reward_fns.append(reasoning.mode_following_reward)
        weights.append(s.mode_weight)
    held_out = ctx.task.held_out_rows()

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        """Greedy held-out accuracy of `m`."""
        budget = ctx.task.max_new_tokens
        return {"greedy_acc": held_out_accuracy(m, tokenizer, held_out, ctx.task.score, budget)}

    write_stage_config(stage_dir, dataclasses.replace(s, grpo=config))
    run = RunDirectory(stage_dir, "grpo", overwrite=True)
    run_name = f"{stage_dir.parent.name}-{stage_dir.name}"  # e.g. pipeline-r1-03-rl
    run.attach(open_loggers(ctx.report_to, run.path, run_name, to_dict(config), None))
    run.write_config(to_dict(config))
    try:
        train_policy(
            model,
            tokenizer,
            model_dir,
            rows_in_modes(ctx.task.train_rows(seed + TRAIN_ROWS_SEED_OFFSET), s.modes),
            reward_fns,
            config,
            run,
            evaluate,
            lora=s.lora,
            rollout=s.rollout,
            precision=ctx.precision,
            seed=seed,
            log=ctx.log,
            reward_weights=weights,
            strict_reward_fn=ctx.task.reward_fn,
        )
    finally:
        run.close()
    return {"model": str(save_policy(model, tokenizer, stage_dir / "model", s.lora))}


def rows_in_modes(rows: Iterator[dict[str, Any]], modes: tuple[str, ...]) -> Iterator[dict]:
    """`rows` with their prompts tagged by `modes` in turn."""
    for i, row in enumerate(rows):
        yield {**row, "prompt": reasoning.set_mode(row["prompt"], modes[i % len(modes)])}


# --- sample ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleStage:
    """Rejection sampling from `model`: verified completions as SFT data. How to sample and
    what to keep is `sampling` (`rlvr.train.rejection.RejectionConfig`, YAML
    `sampling: {num_samples: 4, max_per_prompt: 1}`); `max_new_tokens` None is the task's
    budget, and `sampling.seed` is added to the pipeline's seed."""

    model: str | None = None
    """Stage whose model samples (default: the previous model-producing stage)."""
    prompts: int = 512
    """Training prompts to sample for."""
    readable_only: bool = True
    """Keep only completions whose think block is entirely in digit notation (R1 filters out
    mixed-language chains of thought)."""
    modes: tuple[str, ...] = ("default",)
    """Thinking modes of the prompts, cycled."""
    sampling: RejectionConfig = field(default_factory=RejectionConfig)
    """How many completions per prompt, at what temperature, and which to keep."""


def run_sample_stage(s: SampleStage, ctx: PipelineContext, stage_dir: Path) -> dict[str, str]:
    """Rejection-sample the stage's model on training prompts; write the kept rows."""
    seed = ctx.seed + s.sampling.seed
    config = dataclasses.replace(
        s.sampling,
        max_new_tokens=s.sampling.max_new_tokens or ctx.task.max_new_tokens,
        seed=seed,
        progress=ctx.log.progress and s.sampling.progress,
    )
    write_stage_config(stage_dir, dataclasses.replace(s, sampling=config))
    model, tokenizer = load_model(ctx.model_of(s.model), device=ctx.precision.device)
    stream = rows_in_modes(ctx.task.train_rows(seed + SAMPLE_ROWS_SEED_OFFSET), s.modes)
    rows = [next(stream) for _ in range(s.prompts)]

    def readable(row: dict, completion: str) -> bool:
        """Whether the completion's think block is all in digit notation."""
        return reasoning.readability(completion) == 1.0

    kept, summary = rejection_sample(
        model, tokenizer, rows, ctx.task.reward_fn, config, readable if s.readable_only else None
    )
    data = stage_dir / "samples.jsonl"
    with open(data, "w") as f:
        for row in kept:
            f.write(json.dumps(row) + "\n")
    (stage_dir / "sample_summary.json").write_text(json.dumps(summary, indent=2))
    return {"data": str(data)}


# --- thinking budget ---------------------------------------------------------------------


@dataclass(frozen=True)
class ThinkingBudgetStage:
    """Held-out accuracy and tokens against a thinking budget, with its figure."""

    model: str | None = None
    budgets: tuple[int, ...] = ()
    """Budgets in thinking tokens (default: those that end on a step boundary, plus 4 and a
    few in between); `none` (no budget) is always added."""


def run_thinking_budget_stage(
    s: ThinkingBudgetStage, ctx: PipelineContext, stage_dir: Path
) -> dict[str, str]:
    """The thinking-budget curve (json, table, figure) and the mode check of the stage's model."""
    model, tokenizer = load_model(ctx.model_of(s.model), device=ctx.precision.device)
    rows = ctx.task.held_out_rows()
    budgets = list(s.budgets) or sorted(
        {*reasoning.step_budgets(ctx.task_config.digits), 4, 12, 22}
    )
    curve = thinking_budget_curve(
        model, tokenizer, rows, ctx.task.score, budgets=[*budgets, None], seed=ctx.seed
    )
    (stage_dir / "thinking_budget.json").write_text(json.dumps(curve, indent=2))
    (stage_dir / "thinking_budget.md").write_text(format_table(curve) + "\n")
    figure = plot_thinking_budget(curve, stage_dir / "thinking_budget.png")
    modes = think_mode_check(
        model,
        tokenizer,
        rows,
        ctx.task.score,
        ctx.task.max_new_tokens,
        modes=("default", "think", "no_think"),
    )
    (stage_dir / "modes.json").write_text(json.dumps(modes, indent=2))
    return {"figure": str(figure), "modes": str(stage_dir / "modes.json")}


STAGE_KINDS: dict[str, tuple[type, Callable[..., dict[str, str]]]] = {
    "base": (BaseStage, run_base),
    "sft": (SFTStage, run_sft_stage),
    "grpo": (GRPOStage, run_grpo_stage),
    "sample": (SampleStage, run_sample_stage),
    "thinking_budget": (ThinkingBudgetStage, run_thinking_budget_stage),
    "dpo": (DPOStage, run_dpo_stage),
    "error_kinds": (ErrorKindsStage, run_error_kinds_stage),
}


def stage_settings(kind: str, params: dict[str, Any], where: str = "") -> Any:
    """The settings dataclass of a stage of `kind`, every value type-checked (`from_dict`);
    unknown kinds and keys name the valid ones, errors name the field's path under `where`."""
    if kind not in STAGE_KINDS:
        raise ConfigError(
            f"{where}: unknown stage kind {kind!r}; valid kinds: {sorted(STAGE_KINDS)}"
        )
    return from_dict(STAGE_KINDS[kind][0], params, where=where)


def write_stage_config(stage_dir: Path, settings: Any) -> Path:
    """Write the stage's settings to `stage_dir/config.yaml` (`run_pipeline` writes them as
    read; a stage with derived fields writes them again, resolved)."""
    path = stage_dir / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(settings), sort_keys=False))
    return path


def settings_dict(settings: Any) -> dict[str, Any]:
    """A stage's settings as plain data (tuples become lists): its config.yaml and its key."""
    return to_dict(settings)
