"""`rlvr dpo` and the pipelines' `dpo` stage.

The pairs and the loop are `rlvr.train.dpo` (`sample_pair_pool`, `train_dpo`); this module
chooses the model (the lab's cached base, as `rlvr lab` builds it, or a local checkpoint), the
task, the prompts, the held-out evaluation, and writes the run directory: config.yaml,
metrics.jsonl (per step `loss`, `rewards/*`, `completions` generated so far, `time/elapsed_s`;
`eval/greedy_acc` and `eval/sampled_acc` before training, every `eval_every` steps and at the
end, as the lab logs them), pools.jsonl (each sampling round's counts), summary.json (the
evaluations before and after with 95% Wilson intervals `ci95` over the held-out problems,
completions generated, wall seconds) and model/.

Prompts: the task's training stream from `seed`, consumed in order; offline DPO samples
`prompts_per_round` of them once, iterated DPO the next `prompts_per_round` every round, so a
run generates `rounds x prompts_per_round x samples_per_prompt` completions
(`dpo_completions`). What kinds of errors the trained models make is the `error_kinds` stage
(`rlvr.pipelines.error_kinds`).

Checkpoints (`checkpoints/step-NNNNNN/`) every `checkpoint_every` steps, at the end and on
SIGINT/SIGTERM; `rlvr dpo --resume RUN` continues from the newest with the run's config.yaml
(other settings refused), bit for bit: the weights, AdamW, RNG, the round's pool and the place
in it come back, metrics.jsonl and pools.jsonl are cut back to the checkpoint's step, and the
prompt stream goes on where the next round would have taken it. Under torchrun (`torchrun
--nproc-per-node N -m rlvr dpo ...`) rank 0 samples each pool and writes the run directory;
every rank trains its share of each step's pairs (`rlvr.train.dpo.train_dpo`).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar

import torch
import tyro

from rlvr.config import ConfigError, RunPlace, flat_layout_moves
from rlvr.devices import Precision, on_device, resolve_precision
from rlvr.models.tiny import TinyModelConfig, load_model, save_model
from rlvr.pipelines.base_model import (
    BaseConfig,
    cached_base_model,
    check_base,
    check_shape,
    resolved_hedge_prob,
)
from rlvr.pipelines.common import (
    TRAIN_ROWS_SEED_OFFSET,
    PipelineContext,
    field_at,
    model_flag,
    open_run_directory,
    start_run_files,
    user_task,
)
from rlvr.pipelines.resume import resumed_config
from rlvr.report.run_dir import RunDirectory, read_jsonl
from rlvr.report.run_log import RunLog
from rlvr.report.stats import wilson_interval
from rlvr.tasks.registry import TaskChoice
from rlvr.tasks.spec import TaskSpec
from rlvr.train.distributed import DistContext, barrier, destroy, init_distributed, main_first
from rlvr.train.dpo import PairPool, sample_pair_pool, train_dpo
from rlvr.train.evaluate import held_out_accuracy
from rlvr.train.sft import Checkpoints

LOSS_TYPES = ("sigmoid", "ipo")


@dataclass(frozen=True)
class DPOPlace(RunPlace):
    """`RunPlace` for `rlvr dpo`: it trains in float32, so its precision is no flag."""

    dtype: Annotated[str, tyro.conf.Suppress] = "float32"
    """Not a flag of `rlvr dpo`: float32 compute."""


@dataclass(frozen=True)
class DPOConfig:
    """`rlvr dpo`: DPO (or IPO) on (correct, wrong) pairs of the model's own verified samples;
    writes a run directory with model/."""

    model: str = "lab"
    """A local Hugging Face model directory, or "lab" for the lab's cached base model of --task
    (built as `rlvr lab` builds it, from --base.*, --tiny.* and the task's settings)."""
    task: Annotated[TaskChoice, tyro.conf.arg(name="")] = field(default_factory=TaskChoice)
    """The task whose training prompts are sampled and whose strict verifier grades them, with
    its generators' options (flags without a prefix: --task, --columns, --arithmetic.*,
    --reasoning.*: any task of `rlvr lab --task`); in Python a task name alone
    (`task="reasoning"`) is `TaskChoice("reasoning")`."""
    run_dir: str = "runs/dpo"
    """The run directory to write (config.yaml, metrics.jsonl, pools.jsonl, summary.json,
    model/)."""
    resume: str | None = None
    """A run directory to continue from its newest complete checkpoint with the run's saved
    config.yaml (`rlvr dpo --resume runs/NAME`); other settings are refused unless they equal
    the saved ones (--device, --threads and --progress may change)."""
    checkpoint_every: int = 25
    """Checkpoint every N steps (0: only at the end and when stopped by SIGINT/SIGTERM)."""
    keep_checkpoints: int = 3
    """Keep the newest N checkpoints."""
    beta: float = 0.1
    """DPO's inverse temperature of the implicit reward (IPO: the regulariser tau)."""
    loss_type: str = "sigmoid"
    """sigmoid (DPO) or ipo; both on per-sequence summed log-probs (`rlvr.algo.dpo`)."""
    label_smoothing: float = 0.0
    """cDPO's label noise eps in [0, 0.5) (sigmoid only)."""
    steps: int = 40
    """Optimizer steps."""
    pairs_per_step: int = 32
    """Pairs per optimizer step; the step's loss is their mean."""
    micro_batch_pairs: int = 32
    """Pairs per forward/backward pass (the divisor stays --pairs-per-step)."""
    samples_per_prompt: int = 8
    """Completions sampled per prompt to find a correct and a wrong one."""
    pairs_per_prompt: int = 2
    """At most this many (correct, wrong) pairs per prompt, no completion in two."""
    prompts_per_round: int = 256
    """Training prompts sampled per round (offline: the one round)."""
    iterate_every: int = 0
    """0: offline DPO on one pool of the starting model's pairs. K > 0: iterated DPO, a fresh
    pool from the current policy (the next --prompts-per-round prompts) every K steps."""
    temperature: float = 1.0
    """Sampling temperature of the pairs' completions."""
    max_new_tokens: int | None = None
    """Completion budget in tokens (None: the task's)."""
    lr: float = 1e-4
    """AdamW learning rate (constant)."""
    grad_clip: float = 1.0
    """Clip the gradient's global norm to this value."""
    eval_every: int = 10
    """Evaluate every N steps as well as before and after training (0: before and after)."""
    eval_samples: int = 1
    """Sampled completions per held-out problem for eval/sampled_acc (at --temperature)."""
    eval_seed: int = 1
    """Seed of eval/sampled_acc's sampling."""
    place: Annotated[DPOPlace, tyro.conf.arg(name="")] = field(default_factory=DPOPlace)
    """Device, CPU threads, seed (of the prompts, the sampling of pairs and their order),
    progress bars and --overwrite, without a prefix."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """The lab base's shape (with --model lab)."""
    base: BaseConfig = field(default_factory=BaseConfig)
    """The lab base's pretraining (with --model lab)."""

    MOVED_KEYS: ClassVar[dict[str, str]] = flat_layout_moves(
        ("device", "threads", "seed", "progress", "overwrite"), ("arithmetic", "reasoning")
    )
    """Keys of the flat layout (config.yaml of runs before `place` and `task` were nested) and
    where they live now; `from_dict` moves them, so those runs resume."""

    def __post_init__(self) -> None:
        if isinstance(self.task, str):  # `DPOConfig(task="reasoning")`: the task's name alone
            object.__setattr__(self, "task", TaskChoice(self.task))


def check_dpo_config(config: DPOConfig) -> None:
    """Refuse a bad setting with a one-line ConfigError naming its flag."""
    checks = [
        (config.loss_type in LOSS_TYPES, f"--loss-type must be one of {list(LOSS_TYPES)}"),
        (config.beta > 0, "--beta must be > 0"),
        (0.0 <= config.label_smoothing < 0.5, "--label-smoothing must be in [0, 0.5)"),
        (
            config.loss_type == "sigmoid" or config.label_smoothing == 0.0,
            "--label-smoothing applies to --loss-type sigmoid only",
        ),
        (config.steps >= 1, "--steps must be >= 1"),
        (config.pairs_per_step >= 1, "--pairs-per-step must be >= 1"),
        (config.micro_batch_pairs >= 1, "--micro-batch-pairs must be >= 1"),
        (
            config.samples_per_prompt >= 2,
            "--samples-per-prompt must be >= 2: a pair needs a correct and a wrong sample",
        ),
        (config.pairs_per_prompt >= 1, "--pairs-per-prompt must be >= 1"),
        (config.prompts_per_round >= 1, "--prompts-per-round must be >= 1"),
        (config.iterate_every >= 0, "--iterate-every must be >= 0 (0: offline DPO)"),
        (config.temperature > 0, "--temperature must be > 0: pairs need diverse samples"),
        (config.eval_every >= 0, "--eval-every must be >= 0"),
        (config.eval_samples >= 1, "--eval-samples must be >= 1"),
        (config.checkpoint_every >= 0, "--checkpoint-every must be >= 0 (0: only at the end)"),
        (config.keep_checkpoints >= 1, "--keep-checkpoints must be >= 1"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def dpo_rounds(steps: int, iterate_every: int) -> int:
    """Sampling rounds of a run: 1 offline, else one every `iterate_every` steps."""
    return 1 if iterate_every == 0 else -(-steps // iterate_every)


def dpo_completions(config: DPOConfig) -> int:
    """Completions a run generates for its pairs (the held-out evaluations not counted)."""
    rounds = dpo_rounds(config.steps, config.iterate_every)
    return rounds * config.prompts_per_round * config.samples_per_prompt


# --- rlvr dpo ----------------------------------------------------------------------------


DPO_RESUME_FREE = (
    "resume",
    "run_dir",
    "place.overwrite",
    "place.progress",
    "place.device",
    "place.threads",
)
"""`DPOConfig` fields (dotted paths) a resume takes from the call, not from the saved
config.yaml."""
DIST_TIMEOUT_S = 600.0
"""How long a collective waits for the other torchrun ranks before failing."""


def resume_dpo_config(config: DPOConfig) -> DPOConfig:
    """The saved config of the run `config.resume`, to continue it there (`resumed_config`)."""
    assert config.resume is not None
    if config.place.overwrite:
        raise ConfigError("rlvr dpo: --resume continues a run; drop --overwrite (or --resume)")
    saved = resumed_config(config, config.resume, DPO_RESUME_FREE, "rlvr dpo")
    return replace(saved, run_dir=str(config.resume))


def run_dpo(config: DPOConfig) -> Path:
    """Train as `config` says; write the run directory and return its `model/` directory.
    With `config.resume` the run there continues (`resume_dpo_config`). Under torchrun every
    rank calls this; rank 0 makes the base model and writes the run directory."""
    if config.resume is not None:
        config = resume_dpo_config(config)
    check_dpo_config(config)
    precision = resolve_precision(config.place.device, config.place.dtype)
    ctx = init_distributed(precision.device, DIST_TIMEOUT_S)  # torchrun's ranks, if any
    precision = replace(precision, device=ctx.device)
    try:
        with on_device(precision):
            task = user_task(config.task, seed=config.place.seed)
            with main_first(ctx, "the base model"):
                model_dir = _model_dir(config, task)
            path, resume = Path(config.run_dir), config.resume is not None
            run = open_run_directory(
                path.parent, path.name, overwrite=config.place.overwrite, resume=resume, ctx=ctx
            )
            with run:
                out = dpo_run(config, task, model_dir, run, precision, ctx)
        barrier(ctx, "the end of the run")  # the ranks leave the group together
        return out
    finally:
        if ctx.sharded:
            destroy()


def _model_dir(config: DPOConfig, task: TaskSpec) -> Path:
    """`config.model`, or the lab's cached base of `config.task` (trained if not cached): the
    base `rlvr lab` trains on the strict verifier from the same settings, under its cache key."""
    if config.model != "lab":
        return model_flag(config.model, hint=" (or --model lab: the lab's base)")
    check_base(task, config.base)
    check_shape(task, config.tiny)
    task_config = config.task.generator_config()  # a dataset file: its column mapping
    base = replace(config.base, hedge_prob=resolved_hedge_prob(config.base.hedge_prob, "strict"))
    log = RunLog(config.place.progress)
    directory, _ = cached_base_model(
        config.task.name, task, task_config, config.tiny, base, log=log
    )
    return directory


def dpo_run(
    config: DPOConfig,
    task: TaskSpec,
    model_dir: str | Path,
    run: RunDirectory,
    precision: Precision,
    ctx: DistContext | None = None,
) -> Path:
    """DPO from `model_dir` on `task` into the open `run`; returns its `model/` directory.
    `config.resume`: the run continues from its newest checkpoint in `run` (none: afresh).
    Under torchrun (`ctx`) rank 0 alone evaluates, samples the pools and writes."""
    start = time.perf_counter()
    check_dpo_config(config)
    config = replace(config, max_new_tokens=config.max_new_tokens or task.max_new_tokens)
    main, resume = ctx is None or ctx.is_main, config.resume is not None
    checkpoints = run.path / "checkpoints"
    pools_path = run.path / "pools.jsonl"
    if main:  # an overwritten run's checkpoints and pools are not this run's
        start_run_files(run, config, resume=resume, stale=(checkpoints, pools_path))
    if precision.is_cpu:  # the ranks of one machine share its cores
        torch.set_num_threads(max(1, config.place.threads // (ctx.world_size if ctx else 1)))
    model, tokenizer = load_model(model_dir, device=precision.device)
    held_out = task.held_out_rows()
    prompts = task.train_rows(config.place.seed + TRAIN_ROWS_SEED_OFFSET)

    evaluate = _evaluator(config, task, tokenizer, held_out)
    new_pool = _pool_sampler(config, task, tokenizer, prompts, model_dir)
    generated = [0]

    def on_pool(step: int, pool: PairPool) -> None:
        generated[0] += pool.completions
        _append(pools_path, {"step": step, **pool.summary()})

    def log(step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics, with the evaluation's where it is due."""
        every = config.eval_every and step % config.eval_every == 0
        if step == 0 or step == config.steps or every:
            metrics = {**metrics, **{f"eval/{k}": v for k, v in evaluate(model).items()}}
        record = {"step": step, **metrics, "completions": generated[0]}
        run.log_metrics({**record, "time/elapsed_s": time.perf_counter() - start})

    def on_start(step: int) -> None:
        """Cut the logs back to the step the run continues after (the pools drawn before it
        stay: a pool drawn at that step comes again); a fresh start logs the evaluation of the
        starting model as step 0."""
        if not main:
            return
        if step > 0 or resume:
            run.truncate_logs(after_step=step if step > 0 else -1)
            kept = [p for p in read_jsonl(pools_path) if p["step"] < step]
            pools_path.write_text("".join(json.dumps(p) + "\n" for p in kept))
            generated[0] = sum(p["completions"] for p in kept)
        if step == 0:
            log(0, {})

    train_dpo(
        model,
        tokenizer,
        new_pool,
        config.steps,
        config.pairs_per_step,
        config.beta,
        config.lr,
        loss_type=config.loss_type,
        label_smoothing=config.label_smoothing,
        iterate_every=config.iterate_every,
        micro_batch_pairs=config.micro_batch_pairs,
        grad_clip=config.grad_clip,
        seed=config.place.seed,
        on_step=log if main else None,
        on_pool=on_pool if main else None,
        progress=config.place.progress and main,
        checkpoints=Checkpoints(
            checkpoints,
            config.checkpoint_every,
            config.keep_checkpoints,
            resume=resume,
            resume_command=f"rlvr dpo --resume {run.path}",
        ),
        dist_ctx=ctx,
        on_start=on_start,
    )
    if not main:
        return run.model_path
    save_model(model, tokenizer, run.model_path)
    run.write_summary(_summary(config, run, str(model_dir), len(held_out), generated[0], start))
    return run.model_path


def _evaluator(
    config: DPOConfig, task: TaskSpec, tokenizer, held_out: list[dict[str, Any]]
) -> Callable[[torch.nn.Module], dict[str, float]]:
    """Held-out accuracy of a model: greedy, and sampled at the pairs' temperature."""

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        budget = config.max_new_tokens
        return {
            "greedy_acc": held_out_accuracy(m, tokenizer, held_out, task.score, budget),
            "sampled_acc": held_out_accuracy(
                m,
                tokenizer,
                held_out,
                task.score,
                budget,
                temperature=config.temperature,
                num_samples=config.eval_samples,
                seed=config.eval_seed,
            ),
        }

    return evaluate


def _pool_sampler(
    config: DPOConfig,
    task: TaskSpec,
    tokenizer,
    prompts: Iterator[dict[str, Any]],
    model_dir: str | Path,
) -> Callable[[torch.nn.Module, int], PairPool]:
    """`new_pool(policy, round)` for `train_dpo`: round `round`'s `prompts_per_round` training
    prompts (the stream skipped to them: a resumed run starts at its round), sampled by
    `policy` and paired; round 0 without a pair is a ConfigError naming the flags."""
    taken = [0]  # training prompts consumed so far

    def new_pool(policy: torch.nn.Module, round_index: int) -> PairPool:
        first = round_index * config.prompts_per_round
        for _ in itertools.islice(prompts, max(0, first - taken[0])):
            pass
        rows = list(itertools.islice(prompts, config.prompts_per_round))
        taken[0] = first + len(rows)
        pool = sample_pair_pool(
            policy,
            tokenizer,
            rows,
            task.score,
            config.samples_per_prompt,
            config.max_new_tokens,
            config.pairs_per_prompt,
            config.temperature,
            seed=config.place.seed + 1000 * round_index,
        )
        if not pool.pairs and round_index == 0:
            raise ConfigError(
                f"{model_dir}: {pool.completions} samples of {pool.prompts} prompts gave no "
                f"(correct, wrong) pair ({pool.correct} correct): raise --samples-per-prompt "
                f"(now {config.samples_per_prompt}) or --prompts-per-round"
            )
        return pool

    return new_pool


def _summary(
    config: DPOConfig,
    run: RunDirectory,
    init_model: str,
    problems: int,
    generated: int,
    start: float,
) -> dict[str, Any]:
    """summary.json's fields, from metrics.jsonl and pools.jsonl (a resumed run's too)."""
    records, pools = read_jsonl(run.metrics_path), read_jsonl(run.path / "pools.jsonl")
    losses = [r["loss"] for r in records if "loss" in r]
    return {
        "model_dir": str(run.model_path),
        "init_model": init_model,
        "loss_type": config.loss_type,
        "steps": config.steps,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "rounds": len(pools),
        "pairs": sum(p["pairs"] for p in pools),
        "completions_generated": generated,
        "held_out_problems": problems,
        "eval_before": _with_intervals(records[0], problems),
        "eval_after": _with_intervals(records[-1], problems),
        "wall_seconds": time.perf_counter() - start,
    }


def _with_intervals(record: dict[str, Any], problems: int) -> dict[str, Any]:
    """A record's `eval/` values without the prefix, and `ci95`: each one's 95% Wilson interval
    over the `problems` held-out problems (conservative for sampled accuracy)."""
    values = {k.removeprefix("eval/"): v for k, v in record.items() if k.startswith("eval/")}
    return {**values, "ci95": {k: list(wilson_interval(v, problems)) for k, v in values.items()}}


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


# --- the dpo stage -----------------------------------------------------------------------


DPO_STAGE_OWNS = (
    "model",
    "task.name",
    "run_dir",
    "place.overwrite",
    "place.progress",
    "place.device",
    "resume",
)
"""`DPOConfig` fields (dotted paths) a pipeline's DPO stage sets itself: its `dpo:` settings
may not."""


@dataclass(frozen=True)
class DPOStage:
    """DPO (or iterated DPO) from `model` on the pipeline's task: the trainer's options are
    `dpo` (YAML `dpo: {steps: 40, iterate_every: 10}`), `DPOConfig`'s defaults where not
    given; the fields in `DPO_STAGE_OWNS` are the stage's to set. The prompts are the
    training stream a GRPO stage of the same `seed` draws, in the same order."""

    model: str | None = None
    """Stage whose model is trained (default: the previous model-producing stage)."""
    seed: int = 0
    """Added to the pipeline's seed for this stage's prompts and sampling."""
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """The trainer's options (`rlvr.pipelines.dpo.DPOConfig`)."""

    def __post_init__(self) -> None:
        default = DPOConfig()
        taken = [f for f in DPO_STAGE_OWNS if field_at(self.dpo, f) != field_at(default, f)]
        if taken:
            raise ConfigError(
                f"dpo: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} set by the "
                "stage itself (use the stage's model key)"
            )
        check_dpo_config(self.dpo)


def run_dpo_stage(s: DPOStage, ctx: PipelineContext, stage_dir: Path) -> dict[str, str]:
    """DPO from the stage's model on the pipeline's task; the run directory is `dpo/`."""
    config = replace(
        s.dpo,
        model=ctx.model_of(s.model),
        place=replace(
            s.dpo.place,
            seed=ctx.seed + s.seed,
            progress=ctx.log.progress,
            device=str(ctx.precision.device),
        ),
        max_new_tokens=s.dpo.max_new_tokens or ctx.task.max_new_tokens,
    )
    run = RunDirectory(stage_dir, "dpo", overwrite=True)
    with run:
        model_dir = dpo_run(config, ctx.task, config.model, run, ctx.precision)
    return {"model": str(model_dir)}
