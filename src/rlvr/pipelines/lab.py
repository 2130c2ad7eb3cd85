"""The lab: R1-Zero in miniature on a laptop CPU.

1. Build a base model that can *sometimes* add: a ~1 M-parameter model trained by next-token
   prediction on worked solutions, many of which drop a carry. Cached by a hash of its config
   (`rlvr.pipelines.base_model`, the cache the pipelines' `base` stage shares).
2. GRPO on the verifiable reward (the strict math verifier) from that base.
3. Report: metrics, samples, reward curve, summary, final model.

RL adds no knowledge here; it selects the correct procedure that the base shows only sometimes,
which is the module's claim about R1-Zero.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import torch
import tyro

from rlvr.config import (
    ConfigError,
    RunPlace,
    UserError,
    apply_overrides,
    flat_layout_moves,
    from_dict,
    read_yaml,
    to_dict,
    warn,
)
from rlvr.devices import Precision, on_device, resolve_precision
from rlvr.models.chat import format_rows, has_chat_template
from rlvr.models.lora import LoRAConfig
from rlvr.models.tiny import TinyModelConfig, count_parameters
from rlvr.pipelines.base_model import (
    BaseConfig,
    base_model_dir,
    cached_base_model,
    check_base,
    check_shape,
    resolved_hedge_prob,
)
from rlvr.pipelines.common import (
    TRAIN_ROWS_SEED_OFFSET,
    env_task,
    episode_limits,
    episode_spec,
    few_shot_examples,
    model_flag,
    open_run_directory,
    save_policy,
    user_task,
)
from rlvr.pipelines.engines import RolloutPlacement, check_placement
from rlvr.pipelines.resume import differing_settings
from rlvr.pipelines.train_policy import load_policy, train_policy
from rlvr.report.loggers import check_installed, open_loggers, parse_report_to
from rlvr.report.plots import plot_reward_curve
from rlvr.report.run_dir import RunDirectory
from rlvr.report.run_log import RunLog
from rlvr.report.stats import format_interval, wilson_interval
from rlvr.report.step_time import format_step_time, step_time_split
from rlvr.rollout.episodes import EpisodeSpec
from rlvr.tasks.registry import ENVIRONMENTS, EnvChoice, TaskChoice, training_reward
from rlvr.tasks.rewards import RewardFn
from rlvr.tasks.spec import TaskSpec
from rlvr.train.checkpoint import latest_checkpoint_step
from rlvr.train.config import GRPOConfig, check_grpo_config
from rlvr.train.distributed import (
    DistContext,
    barrier,
    destroy,
    init_distributed,
    main_first,
)
from rlvr.train.evaluate import (
    HeldOutSamples,
    held_out_accuracy,
    held_out_episodes,
    held_out_samples,
)
from rlvr.train.lora_state import check_reference_sync
from rlvr.train.monitor import never_parsed_warning, unparsed_share
from rlvr.train.recipes import recipe_config


@dataclass(frozen=True)
class LabConfig:
    """`rlvr lab` / `rlvr train [RECIPE]`: build (or reuse) a base model, run RL on a task,
    report."""

    run_name: str = "lab"
    """Name of the run directory under --runs-dir."""
    runs_dir: str = "runs"
    """Where run directories are created."""
    resume: str | None = None
    """A run directory to continue from its newest complete checkpoint, with the run's saved
    config.yaml (`rlvr train --resume runs/NAME`); other settings are refused unless they equal
    the saved ones."""
    model: str | None = None
    """A local Hugging Face model directory to start from instead of the lab's base model."""
    chat_template: bool = True
    """Put each prompt through the model's chat template (a user turn and the assistant's
    generation prompt) when its tokenizer has one, in training and evaluation alike; the lab's
    character tokenizer has none. samples.jsonl records prompts as the model saw them."""
    system_prompt: str | None = None
    """A system message in front of every templated prompt (with --chat-template)."""
    few_shot: int = 0
    """With a chat template: this many worked examples of the task (correct solutions drawn
    from its training distribution, never from the held-out set) as earlier user/assistant
    turns in front of every prompt, in training and evaluation alike."""
    cache_dir: str | None = None
    """Where base models are cached (default: $RLVR_CACHE or ~/.cache/rlvr)."""
    eval_samples: int = 8
    """Sampled completions per held-out problem for the start and end pass@1."""
    eval_seed: int = 1
    """Seed of the sampled held-out evaluation (the same at the start and the end)."""
    verifier: str = "strict"
    """Training reward: strict (the math verifier) or weak (substring match, gameable: a
    demonstration of reward hacking). Held-out accuracy and the monitor always use strict."""
    recipe: Annotated[str | None, tyro.conf.Suppress] = None
    """The named recipe (`rlvr recipes`: grpo, rloo, dr_grpo, dapo, gspo, cispo, gmpo, opd,
    reinforce++, ppo) `grpo` starts from;
    on the command line the subcommand `rlvr train RECIPE`, whose flags override the recipe's
    switches. A `LabConfig(recipe=NAME)` whose `grpo` is left out (every field
    `GRPOConfig`'s default) gets the recipe's config (`recipe_lab_config`); a `grpo` given
    is taken as it is."""
    set: tuple[str, ...] = ()
    """Overrides of GRPO switches as key=value, applied last (e.g. --set
    surrogate.epsilon_high=0.28 beta=0.01): the same as --grpo.surrogate.epsilon-high 0.28
    --grpo.beta 0.01."""
    report_to: str = "none"
    """Trackers that get the same metrics as metrics.jsonl, the samples and the config:
    none, or a comma-separated list of tensorboard (event files in the run directory), wandb
    (WANDB_MODE=offline works), trackio (local); `pip install 'rlvr[tensorboard]'` etc."""
    place: Annotated[RunPlace, tyro.conf.arg(name="")] = field(default_factory=RunPlace)
    """Device, precision, threads, seed (of the RL run: sampling, data order), progress output
    and --overwrite (flags without a prefix)."""
    task: Annotated[TaskChoice, tyro.conf.arg(name="")] = field(default_factory=TaskChoice)
    """The task and its generators' options (flags without a prefix: --task, --columns,
    --arithmetic.*, --reasoning.*); in Python a task name alone (`task="rows.jsonl"`) is
    `TaskChoice("rows.jsonl")`."""
    env: EnvChoice = field(default_factory=EnvChoice)
    """A multi-turn environment (`--env guess_number`, `--env FILE.py:NAME`) and its budgets
    (`--env.max-turns`, `--env.max-tokens`, timeouts, `--env.turn-discount`,
    `--env.reward`); none by default: one-turn rollouts on --task."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    base: BaseConfig = field(default_factory=BaseConfig)
    grpo: GRPOConfig = field(default_factory=lambda: _LeftOut())
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters on the policy (`--lora.rank 16`): only they train; with beta > 0 the
    reference is the same model with its adapters off (no second copy)."""
    rollout: Annotated[RolloutPlacement, tyro.conf.OmitArgPrefixes] = field(
        default_factory=RolloutPlacement
    )
    """Where rollouts are sampled (flags without a prefix): `--engine hf|vllm` (vLLM: `pip
    install vllm` on a GPU machine, or its CPU build in a venv of its own,
    scripts/vllm_check.sh); `--ray --rollout-workers N` samples on N Ray actors, each with its
    own copy of the policy and the weights pushed after every update (`pip install
    'rlvr[ray]'`; a local Ray on 127.0.0.1 unless `--ray-address auto|HOST:PORT` joins one
    started with `ray start --head`); `--placement separate|colocated`, `--weight-transport
    object-store|nccl` (GPUs only)."""

    MOVED_KEYS: ClassVar[dict[str, str]] = flat_layout_moves(
        ("device", "dtype", "threads", "seed", "progress", "overwrite"),
        ("columns", "arithmetic", "reasoning"),
    )
    """Keys of the flat layout (config.yaml of runs before `place` and `task` were nested) and
    where they live now; `from_dict` moves them, so those runs resume."""

    def __post_init__(self) -> None:
        if isinstance(self.task, str):  # `LabConfig(task="rows.jsonl")`: the task's name alone
            object.__setattr__(self, "task", TaskChoice(self.task))
        # the recipe is the default of `grpo`: applied here, once, and only to a grpo left out
        # (a given one, even one equal to GRPOConfig(), is taken as it is)
        if type(self.grpo) is _LeftOut:
            grpo = recipe_config(self.recipe) if self.recipe is not None else GRPOConfig()
            object.__setattr__(self, "grpo", grpo)


@dataclass(frozen=True)
class _LeftOut(GRPOConfig):
    """`LabConfig.grpo`'s default before `__post_init__`: marks a grpo the caller left out,
    which becomes the recipe's config (or `GRPOConfig()`); never seen outside the constructor."""


def recipe_lab_config(recipe: str) -> LabConfig:
    """The lab's defaults with `grpo` the config of `recipe` (`recipe_config`): what `rlvr
    train RECIPE` starts from before its flags apply (tyro's default instance)."""
    return LabConfig(recipe=recipe, grpo=recipe_config(recipe))


def resolve(config: LabConfig) -> LabConfig:
    """`config` with every derived field filled and checked: what `run_lab` trains and writes
    to config.yaml. Run once, right after parsing (`run_lab` calls it; so does the CLI,
    through `run_lab`).

    The recipe is not applied here: it is `grpo`'s default (tyro's default instance on the
    command line, `LabConfig.__post_init__` in Python), so `grpo` already holds it. In this
    order:
    1. `resume`: the run's saved config.yaml (resolved when it was written) replaces `config`
       (`resume_config`); nothing below applies again.
    2. `set`: the `key=value` overrides, applied last and type-checked, then cleared.
    3. `grpo.max_new_tokens` None becomes the task's budget.
    4. Checked before anything is written or loaded (`_check`): the GRPO switches
       (`check_grpo_config`, the one validator), the budget against the task's longest
       answer, the verifier, the trackers, the lab's own numbers, the model directory (or,
       without one, the base's settings and the task's corpus to train it on).

    User mistakes raise `rlvr.config.UserError` subclasses naming what to change.
    """
    return _resolve(config)[0]


def _resolve(config: LabConfig) -> tuple[LabConfig, TaskSpec]:
    """`resolve(config)` and the task it was checked against."""
    if config.resume is not None:
        config = resume_config(config)
        return config, lab_task(config)
    grpo = apply_overrides(config.grpo, list(config.set))
    task = lab_task(dataclasses.replace(config, grpo=grpo))
    if grpo.max_new_tokens is None:
        grpo = dataclasses.replace(grpo, max_new_tokens=task.max_new_tokens)
    config = dataclasses.replace(config, grpo=grpo, set=())
    _check(config, task)
    return config, task


def _check(config: LabConfig, task: TaskSpec) -> None:
    """Refuse impossible settings before anything is written or loaded, as `UserError`s."""
    check_installed(parse_report_to(config.report_to))
    for flag, value, least in (
        ("--threads", config.place.threads, 1),
        ("--few-shot", config.few_shot, 0),
        ("--eval-samples", config.eval_samples, 1),
    ):
        if value < least:
            raise ConfigError(f"{flag} must be >= {least}, got {value}")
    if task.environment is not None and (config.rollout.engine != "hf" or config.rollout.ray):
        flag = "--ray" if config.rollout.ray else f"--engine {config.rollout.engine}"
        raise ConfigError(
            f"--env runs episodes through the in-process engine's token-level call, which "
            f"{flag} does not have yet; drop {flag}"
        )
    if config.model is not None:
        model_flag(config.model)
    elif task.environment is not None and config.env.name not in ENVIRONMENTS:
        raise ConfigError(
            f"--env {config.env.name}: an environment of your own has no corpus to pretrain "
            "the lab's tiny base on; pass --model DIR (a model to start from)"
        )
    else:  # the base model is trained (or found in the cache) from the task's corpus
        check_base(task, config.base)
        budget = config.grpo.max_new_tokens
        if task.environment is not None:  # an episode: every turn after the opening prompt
            budget = episode_limits(task, config.env, budget).max_tokens
        check_shape(task, config.tiny, budget)
    teacher = config.grpo.distill.teacher
    if config.recipe == "opd" and teacher is None:
        warn(
            "recipe opd without --grpo.distill.teacher DIR distils from no one: it trains on the "
            "verifier's reward alone, one completion per prompt"
        )
    if teacher is not None and not (Path(teacher) / "config.json").is_file():
        raise ConfigError(
            f"--grpo.distill.teacher {teacher}: not a local model directory (no config.json); "
            "pass the model/ directory of a finished run or a prepared checkpoint"
        )
    try:
        check_grpo_config(config.grpo)
        training_reward(config.verifier, task)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    try:  # with LoRA and beta > 0 the reference is the frozen base: the learner's own rule
        base_reference = config.lora.enabled and config.grpo.beta > 0
        check_reference_sync(base_reference, config.grpo.ref_sync_every)
    except ValueError as exc:
        raise ConfigError(f"--lora.rank {config.lora.rank}: {exc}") from exc
    check_placement(config.rollout, config.lora.enabled)
    assert config.grpo.max_new_tokens is not None  # filled by _resolve
    if config.grpo.max_new_tokens < task.min_new_tokens:
        raise ConfigError(
            f"grpo.max_new_tokens={config.grpo.max_new_tokens} is below the longest correct "
            f"completion of this task ({task.min_new_tokens} tokens with EOS)"
        )


RESUME_FREE = (
    "resume",
    "runs_dir",
    "run_name",
    "place.progress",
    "place.overwrite",
    "place.device",
    "place.dtype",
    "rollout",
    "report_to",
)
"""Fields (dotted paths; a part's name frees all of it) that a resume takes from the call, not
from the saved config.yaml (where the run samples may change: a resume on Ray workers
continues a run begun in one process)."""
KEPT_UNLESS_GIVEN = ("rollout", "report_to")
"""Of those, the ones a call that leaves them at their default keeps from the saved config: a
bare `--resume` of a Ray run resumes on Ray with as many actors, logging where it logged."""


def resume_config(config: LabConfig) -> LabConfig:
    """The saved config of the run `config.resume`, to continue it: runs_dir and run_name from
    the path, progress from `config`. Every other field of `config` must be its default or
    equal the saved value (it would be ignored otherwise), or it is refused, naming it."""
    run_dir = Path(config.resume or "")
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        raise UserError(f"{run_dir} has no config.yaml: nothing to resume")
    data = read_yaml(saved_path) or {}
    for key in ("resume", "overwrite"):  # older runs saved `resume: false`
        data.pop(key, None)
    saved = from_dict(LabConfig, data, where=str(saved_path))
    differ = differing_settings(config, saved, RESUME_FREE)
    if differ:
        raise ConfigError(
            f"--resume continues {run_dir} with its saved config.yaml; these settings differ "
            f"from it and would be ignored, so they are refused: {', '.join(differ)}"
        )
    unset = LabConfig()
    taken = {
        key: getattr(saved if getattr(config, key) == getattr(unset, key) else config, key)
        for key in KEPT_UNLESS_GIVEN
    }
    return dataclasses.replace(
        saved,
        runs_dir=str(run_dir.parent),
        run_name=run_dir.name,
        resume=str(run_dir),
        place=dataclasses.replace(
            saved.place,
            progress=config.place.progress,
            device=config.place.device,
            dtype=config.place.dtype,
        ),
        **taken,
    )


def lab_task(config: LabConfig) -> TaskSpec:
    """The TaskSpec of `config.task`, or of `config.env` when one is given, from the task
    registry (an unknown task or environment: `TaskError`)."""
    if config.env.name is not None:
        return env_task(config.env, config.task, seed=config.place.seed)
    return user_task(config.task, hedge_prob=effective_hedge_prob(config), seed=config.place.seed)


def _task_name(config: LabConfig) -> str:
    """The name the base model is cached under: the environment's, else the task's."""
    return config.env.name or config.task.name


def effective_hedge_prob(config: LabConfig) -> float:
    """The base corpus's hedge probability: `--base.hedge-prob`, else by `--verifier`."""
    return resolved_hedge_prob(config.base.hedge_prob, config.verifier)


def _base_settings(config: LabConfig) -> tuple[object | None, BaseConfig]:
    """(the task's config, the base's settings with the hedge resolved): with the task name and
    the model shape, what keys the lab's base model in the cache."""
    task_config = config.task.generator_config()  # a dataset file: its column mapping
    return task_config, dataclasses.replace(config.base, hedge_prob=effective_hedge_prob(config))


def lab_base_dir(config: LabConfig) -> Path:
    """The cache directory of the lab's base model (present or not)."""
    task_config, base = _base_settings(config)
    return base_model_dir(_task_name(config), task_config, config.tiny, base, config.cache_dir)


def build_base_model(
    config: LabConfig, task: TaskSpec, log: RunLog | None = None
) -> tuple[Path, bool]:
    """Return (directory of the base model, whether it came from the cache); its training's
    progress bar shows unless `log` is quiet (default: `--progress`)."""
    task_config, base = _base_settings(config)
    log = RunLog(config.place.progress) if log is None else log
    return cached_base_model(
        _task_name(config), task, task_config, config.tiny, base, config.cache_dir, log
    )


def run_lab(config: LabConfig) -> dict:
    """The whole lab; returns the summary written to summary.json. `config` is resolved first
    (`resolve`: resume, --set, derived fields, checks), as the CLI's is."""
    config, task = _resolve(config)
    if config.resume is not None:
        print(f"[rlvr] resuming {config.resume} with its saved config.yaml")
    precision = resolve_precision(config.place.device, config.place.dtype)  # before any write
    ctx = init_distributed(precision.device, config.grpo.worker_timeout_s)  # torchrun's ranks
    precision = dataclasses.replace(precision, device=ctx.device)
    try:
        with on_device(precision):
            summary = _run(config, task, precision, ctx)
        barrier(ctx, "the end of the run")  # the ranks leave the group together
        return summary
    finally:
        destroy()


def _run(config: LabConfig, task: TaskSpec, precision: Precision, ctx: DistContext) -> dict:
    """`run_lab` once the config is resolved, inside the run's device and precision. Under
    torchrun every rank runs it: rank 0 makes the base model and the run directory first, the
    others then find them; all train; rank 0 alone reports (the others return {})."""
    reward_fn = training_reward(config.verifier, task)
    log = RunLog(config.place.progress).only_if(ctx.is_main)
    if precision.is_cpu:  # the ranks of one machine share its cores
        torch.set_num_threads(max(1, config.place.threads // ctx.world_size))
    resume = config.resume is not None
    run = open_run_directory(
        config.runs_dir,
        config.run_name,
        overwrite=config.place.overwrite,
        resume=resume,
        ctx=ctx,
    )
    if ctx.is_main:  # the trackers are opened (or refused) before any model loads
        resume_step = latest_checkpoint_step(run.path / "checkpoints") if resume else None
        trackers = parse_report_to(config.report_to)
        run.attach(open_loggers(trackers, run.path, config.run_name, to_dict(config), resume_step))
    with run:
        return _train(config, task, precision, ctx, run, reward_fn, log)


def _train(
    config: LabConfig,
    task: TaskSpec,
    precision: Precision,
    ctx: DistContext,
    run: RunDirectory,
    reward_fn: RewardFn,
    log: RunLog,
) -> dict:
    """`_run` once the run directory is open (and its trackers attached): the base model, its
    held-out evaluation, GRPO (`train_policy`), the final evaluation, the report."""
    start = time.perf_counter()
    if config.model is None:
        with main_first(ctx, "the base model"):
            base_dir, cached = build_base_model(config, task, log)
        log.say(f"base model: {base_dir} ({'cached' if cached else 'trained'})")
    else:
        base_dir = Path(config.model)
    model, tokenizer = load_policy(base_dir, config.lora, config.place.seed, precision)
    if ctx.is_main:
        written = dataclasses.replace(config.place, overwrite=False)
        run.write_config(to_dict(dataclasses.replace(config, resume=None, place=written)))
    base_seconds, seed = time.perf_counter() - start, config.place.seed
    log.say(
        f"{count_parameters(model):,} parameters on {precision.describe()}, "
        f"base ready in {base_seconds:.0f} s"
    )
    template = _template(config, task, tokenizer, base_dir)
    episodes = episode_spec(
        task, config.env, tokenizer, config.chat_template, config.grpo.max_new_tokens
    )
    if episodes is not None:  # an environment's rows: its reset renders their messages
        held_out, rows = task.held_out_rows(), task.train_rows(seed + TRAIN_ROWS_SEED_OFFSET)
    else:
        held_out = format_rows(tokenizer, task.held_out_rows(), *template)
        rows = format_rows(tokenizer, task.train_rows(seed + TRAIN_ROWS_SEED_OFFSET), *template)
    evaluate = _Evaluator(config, task, tokenizer, held_out, episodes)
    base_eval = _evaluate_base(evaluate, model, config, task, log) if ctx.is_main else {}

    rl_start = time.perf_counter()
    records = train_policy(
        model,
        tokenizer,
        base_dir,
        rows,
        [reward_fn],
        config.grpo,
        run,
        evaluate,
        lora=config.lora,
        rollout=config.rollout,
        precision=precision,
        seed=seed,
        log=log,
        strict_reward_fn=task.reward_fn if episodes is None else None,  # the monitor's
        resume=config.resume is not None,
        initial_eval=base_eval,  # step 0 of metrics.jsonl: the base, evaluated once
        dist_ctx=ctx,
        episodes=episodes,
    )
    rl_seconds = time.perf_counter() - rl_start
    if not ctx.is_main:
        return {}
    final_eval = evaluate(model, config.eval_samples)  # before the save merges LoRA in place
    save_policy(model, tokenizer, run.model_path, config.lora)
    plot_reward_curve(
        records,
        run.path / "reward_curve.png",
        title=_plot_title(task.describe, base_eval, final_eval),
    )
    seconds = {"base_seconds": base_seconds, "rl_seconds": rl_seconds}
    seconds["wall_seconds"] = time.perf_counter() - start
    summary = _summary(config, base_dir, len(held_out), records, base_eval, final_eval, seconds)
    run.write_summary(summary)
    _say_summary(log, summary, run.path)
    return summary


def _template(
    config: LabConfig, task: TaskSpec, tokenizer: Any, model_dir: Path
) -> tuple[bool, str | None, list[tuple[str, str]]]:
    """(chat template on, system prompt, few-shot examples): how every prompt is formatted,
    in training and evaluation alike; warns when the few-shot examples cannot be used."""
    examples = few_shot_examples(task, config.few_shot)
    if examples and not has_chat_template(tokenizer, config.chat_template):
        warn(
            f"--few-shot {config.few_shot} needs a chat template, which {model_dir} lacks "
            "(or --no-chat-template is set): the examples are not used"
        )
    return config.chat_template, config.system_prompt, examples


class _Evaluator:
    """The lab's held-out evaluation: greedy, and sampled at the training temperature; keeps
    the latest greedy completions (`greedy`) for the never-parsed check. A multi-turn task's
    accuracy is its episodes' success (return above 0), with their mean turns."""

    def __init__(
        self,
        config: LabConfig,
        task: TaskSpec,
        tokenizer: Any,
        rows: list[dict],
        episodes: EpisodeSpec | None = None,
    ):
        self.config, self.task, self.tokenizer, self.rows = config, task, tokenizer, rows
        self.episodes = episodes
        self.greedy: HeldOutSamples | None = None

    def __call__(self, model: torch.nn.Module, sampled_samples: int = 1) -> dict[str, float]:
        """Held-out accuracy of `model`: greedy, and the mean of `sampled_samples` samples per
        problem at the training temperature (seeded by `--eval-seed`)."""
        if self.episodes is not None:
            return self._episodes(model, sampled_samples)
        budget, score = self.config.grpo.max_new_tokens, self.task.score
        self.greedy = held_out_samples(model, self.tokenizer, self.rows, score, budget)
        sampled = held_out_accuracy(
            model,
            self.tokenizer,
            self.rows,
            score,
            budget,
            temperature=self.config.grpo.temperature,
            num_samples=sampled_samples,
            seed=self.config.eval_seed,
        )
        return {"greedy_acc": self.greedy.accuracy, "sampled_acc": sampled}

    def _episodes(self, model: torch.nn.Module, sampled_samples: int) -> dict[str, float]:
        """Held-out success of greedy and sampled episodes, and their replies per episode and
        per successful episode."""
        assert self.episodes is not None
        greedy = held_out_episodes(model, self.tokenizer, self.rows, self.episodes)
        sampled = held_out_episodes(
            model,
            self.tokenizer,
            self.rows,
            self.episodes,
            temperature=self.config.grpo.temperature,
            num_samples=sampled_samples,
            seed=self.config.eval_seed,
        )
        return {
            "greedy_acc": greedy.success,
            "sampled_acc": sampled.success,
            "greedy_turns": greedy.turns_mean,
            "sampled_turns": sampled.turns_mean,
            "sampled_turns_per_success": sampled.turns_per_success,
        }


def _evaluate_base(
    evaluate: _Evaluator, model: torch.nn.Module, config: LabConfig, task: TaskSpec, log: RunLog
) -> dict[str, float]:
    """The base model's held-out accuracy (said), with a warning when the task's verifier
    parses none of its greedy completions."""
    base_eval = evaluate(model, config.eval_samples)
    log.say(
        f"base held-out accuracy: greedy {base_eval['greedy_acc']:.3f}, "
        f"sampled {base_eval['sampled_acc']:.3f}"
    )
    if evaluate.greedy is None:  # episodes: the environment reads the replies
        return base_eval
    completions = [c for (c,) in evaluate.greedy.completions]
    share = unparsed_share(task.reward_fn, evaluate.rows, completions)
    if message := never_parsed_warning(share, len(evaluate.rows)):
        warn(message)
    return base_eval


def _summary(
    config: LabConfig,
    base_dir: Path,
    problems: int,
    records: list[dict],
    base_eval: dict[str, float],
    final_eval: dict[str, float],
    seconds: dict[str, float],
) -> dict:
    """summary.json: held-out accuracy before and after (with Wilson intervals over the
    `problems` held-out problems), the step rewards, the times (`seconds`: base, RL, wall) and
    the hacking monitor's account."""
    steps = [r for r in records if "reward/mean" in r]
    return {
        "base_model": str(base_dir),
        "base_greedy_acc": base_eval["greedy_acc"],
        "base_sampled_acc": base_eval["sampled_acc"],
        "final_greedy_acc": final_eval["greedy_acc"],
        "final_sampled_acc": final_eval["sampled_acc"],
        "ci95": {  # Wilson intervals over the held-out problems (conservative when sampled)
            f"{when}_{kind}_acc": wilson_interval(result[f"{kind}_acc"], problems)
            for when, result in (("base", base_eval), ("final", final_eval))
            for kind in ("greedy", "sampled")
        },
        "sampled_acc_samples_per_problem": config.eval_samples,
        "held_out_problems": problems,
        "steps": len(steps),
        "first_step_reward": steps[0]["reward/mean"] if steps else None,
        "last_step_reward": steps[-1]["reward/mean"] if steps else None,
        **seconds,
        "median_step_seconds": _median([r["time/step_s"] for r in steps]),
        "step_time": step_time_split(records),
        "verifier": config.verifier,
        "hacking_monitor": _monitor_summary(records),
    }


def _say_summary(log: RunLog, summary: dict, run_path: Path) -> None:
    """The summary's lines: the monitor's warning (always, on stderr), then the held-out
    accuracy before -> after and the step-time split (unless the log is quiet)."""
    if summary["hacking_monitor"]["warning"]:
        print(f"[rlvr] WARNING: {summary['hacking_monitor']['warning']}", file=sys.stderr)
    n = summary["held_out_problems"]
    acc = {key: format_interval(summary[key], n) for key in summary if key.endswith("_acc")}
    log.say(
        f"held-out accuracy (95% intervals, {n} problems): greedy "
        f"{acc['base_greedy_acc']} -> {acc['final_greedy_acc']}, sampled "
        f"{acc['base_sampled_acc']} -> {acc['final_sampled_acc']} in "
        f"{summary['wall_seconds']:.0f} s; see {run_path}/"
    )
    log.say(format_step_time(summary["step_time"]))


def _monitor_summary(records: list[dict]) -> dict:
    """The summary's account of the hacking monitor: checks, flagged steps, largest gap."""
    checks = [r for r in records if "monitor/gap" in r]
    flagged = [r["step"] for r in checks if r["monitor/flagged"]]
    return {
        "checks": len(checks),
        "flagged_steps": flagged,
        "max_gap": max((r["monitor/gap"] for r in checks), default=None),
        "warning": (
            "training reward diverged from strict accuracy: the reward is being gamed"
            if flagged
            else None
        ),
    }


def _plot_title(describe: str, base: dict, final: dict) -> str:
    """The reward curve's title: the task and held-out accuracy before -> after."""
    return (
        f"RL on {describe}: greedy {base['greedy_acc']:.2f} -> {final['greedy_acc']:.2f}, "
        f"sampled {base['sampled_acc']:.2f} -> {final['sampled_acc']:.2f}"
    )


def _median(values: list[float]) -> float | None:
    """The upper median of `values` (None when there are none)."""
    return sorted(values)[len(values) // 2] if values else None
