"""GRPO and its family: sample G completions per prompt, verify, push toward the better ones.

One step, top to bottom (`grpo_step`): sample and verify (with DAPO's dynamic sampling) ->
shape rewards -> reference log-probs -> advantages -> mu update passes -> metrics. Formulas
live in `rlvr.algo`; every switch of `GRPOConfig` was resolved once by `build_plan` into the
`StepPlan` the step reads. The rollout side (`Rollout`) and the learner side (`Learner`) meet
only through a `RolloutBatch` and the learner's weights, so either can move to other processes.

Deviations from DeepSeekMath's GRPO (arXiv:2402.03300) in the defaults, all switchable:
- the loss is averaged over all completion tokens of the step ("token-mean", as DAPO and TRL
  do) rather than per sequence first; `aggregation="seq-mean-token-mean"` restores the paper;
- `beta` defaults to 0 (no KL penalty, no reference model loaded), as in DAPO, Dr. GRPO and
  TRL's default: with verifiable rewards the clip alone keeps updates small;
- the old log-probs are those recorded while sampling (no second forward pass).
"""

from __future__ import annotations

import contextlib
import copy
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rlvr import algo
from rlvr.config import ConfigError
from rlvr.report.run_dir import RunDirectory, read_jsonl
from rlvr.report.timer import StepTimer
from rlvr.rollout.engine import HFEngine, RolloutEngine
from rlvr.rollout.episodes import EpisodeSpec
from rlvr.rollout.sampler import RolloutBatch
from rlvr.tasks.rewards import RewardFn
from rlvr.train.agreement import agreement_check
from rlvr.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from rlvr.train.config import (
    AdvantageInputs,
    GRPOConfig,
    StepPlan,
    build_loop_plan,
    build_plan,
)
from rlvr.train.distributed import (
    DistContext,
    all_ranks_agree,
    broadcast_object,
    single_process,
)
from rlvr.train.learner import Learner, UpdateBatch
from rlvr.train.monitor import HackingMonitor, ZeroRewardWatch, sample_records
from rlvr.train.rollouts import AsyncRollout, BroadcastRollout, EpisodeRollout, Rollout
from rlvr.train.state import TrainState, build_state
from rlvr.train.strategy import make_strategy
from rlvr.train.teacher import distill_metrics, load_teacher
from rlvr.workers import WorkerError, default_workers, torch_threads

Evaluator = Callable[[torch.nn.Module], dict[str, float]]


@dataclass
class StepResult:
    """One step's rollouts, their verifier rewards, and its metrics line."""

    batch: RolloutBatch
    rewards: torch.Tensor  # [N]
    metrics: dict[str, float]


def grpo_step(
    plan: StepPlan,
    rollout: Rollout,
    learner: Learner,
    generator: torch.Generator,
    timer: StepTimer,
) -> StepResult:
    """One step: B prompts x G completions sampled, verified, and learnt from; with a teacher
    in the learner (on-policy distillation), also scored by it token by token."""
    # 1. sample and verify: B prompts x G completions, one reward each (DAPO refills groups)
    batch, rewards, metrics = rollout.collect(generator, timer)  # RolloutBatch[N], [N]
    if len(rewards) == 0:  # dynamic sampling found no informative group: nothing to learn
        skipped = {"reward/mean": 0.0, "update/skipped": 1.0}
        return StepResult(batch, rewards, metrics | skipped | timer.metrics())

    # 2. shape rewards (DAPO's overlong penalty) and mask the loss (truncated rows); identity
    #    functions when those switches are off
    shaped = plan.shape_rewards(rewards, batch.lengths)  # [N]
    loss_mask = plan.loss_mask(batch.policy_mask, batch.truncated)  # [N, T]

    # 3. reference log-probs: no reference exists, and no forward pass runs, when beta == 0
    with timer("ref_logprobs"):
        ref_logp = learner.reference_logprobs(batch)  # [N, T] | None
    teacher_logp = learner.teacher_logprobs(batch, timer)  # [N, T] | None (no teacher)

    # 4. advantages: the group family, GAE against the critic's values (PPO), or the
    #    teacher's per-token reverse KL (on-policy distillation, the verifier's mixed in)
    with timer("advantage"):
        values = learner.values(batch)  # [N, T] | None
        advantages, returns = plan.advantages(
            AdvantageInputs(shaped, batch, loss_mask, ref_logp, values, teacher_logp)
        )
    # 5. rollout correction (off unless chosen): the learner's pi_old against the engine's
    #    behaviour log-probs; importance weights into the advantages, dropped tokens out of
    #    the loss mask, pi_old the ratio's denominator
    if plan.correct is not None:
        with timer("old_logprobs"):
            old_logp = learner.policy_logprobs(batch)  # [N, T]
        batch, advantages, loss_mask, mismatch = plan.correct(
            batch, advantages, loss_mask, old_logp
        )
        metrics |= mismatch
    data = UpdateBatch(batch, advantages, loss_mask, ref_logp, values, returns)

    # 6. policy update: mu passes against the batch's log-probs (the sampler's, kept while
    #    sampling: no second forward pass; pi_old when corrected), then the engine gets the
    #    new weights
    with timer("update"):
        work = learner.plan_update(data)  # rows that carry a gradient, micro-batches, divisors
        for i in range(plan.mu):
            update_metrics = learner.policy_step(data, work, timer, first_pass=i == 0)
            if "update/nonfinite" in update_metrics:  # skipped; the loop counts and stops
                break
            if values is not None:
                update_metrics |= learner.critic_step(data, timer)
        rollout.sync(learner)

    # 7. metrics: where the seconds went (the step ends here), the rollouts', the update's
    times = timer.metrics()
    metrics |= update_metrics | rollout_metrics(batch, rewards, shaped) | throughput(batch, times)
    metrics |= distill_metrics(batch, teacher_logp, loss_mask)  # nothing without a teacher
    return StepResult(batch, rewards, metrics)


def rollout_metrics(
    batch: RolloutBatch, rewards: torch.Tensor, shaped: torch.Tensor
) -> dict[str, float]:
    """Rewards and completion lengths of one step's rollouts (docs/metrics.md)."""
    lengths = batch.lengths
    return {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "reward/shaped_mean": shaped.mean().item(),
        "frac_zero_std_groups": algo.zero_std_group_fraction(rewards, batch.group_ids),
        "completion/len_mean": lengths.mean().item(),
        "completion/len_max": lengths.max().item(),
        "completion/truncated_frac": batch.truncated.float().mean().item(),
    }


def throughput(batch: RolloutBatch, times: dict[str, float]) -> dict[str, float]:
    """`times` (the timer's `time/*`) plus completion tokens per second end to end and while
    generating."""
    tokens = batch.lengths.sum().item()
    return times | {
        "throughput/completion_tokens_per_s": tokens / times["time/step_s"],
        "throughput/generate_tokens_per_s": tokens / max(times["time/generate_s"], 1e-9),
    }


@dataclass
class Trainer:
    """A run's plan, state and roles, built once from its config (`build_trainer`)."""

    plan: StepPlan
    state: TrainState
    rollout: Rollout | AsyncRollout | BroadcastRollout
    learner: Learner


def build_trainer(
    model: torch.nn.Module,
    tokenizer,
    train_rows: Iterator[dict[str, Any]],
    reward_fns: Sequence[RewardFn],
    config: GRPOConfig,
    seed: int,
    reward_weights: Sequence[float] | None = None,
    engine: RolloutEngine | None = None,
    dist_ctx: DistContext | None = None,
    episodes: EpisodeSpec | None = None,
) -> Trainer:
    """Check and resolve `config`, seed and build the state, and the two roles around it; the
    engine defaults to sampling in process with the policy itself. With
    `gradient_checkpointing`, the policy (and the copies made of it: reference, critic body)
    recomputes its layers in the backward pass.

    With `async_steps` > 0 the rollouts run ahead in a background thread (`AsyncRollout`): the
    default engine then samples with its own copy of the policy, synced after each update,
    and the update keeps one CPU thread fewer (sampling has the other).

    The layout is chosen once, `make_strategy(dist_ctx)` (`train/strategy.py`): with
    `dist_ctx` over several ranks (torchrun), the learner trains an FSDP2-split copy of
    `model` (each rank one share of the update's rows and of the no-grad forwards'), and
    `model` itself stays whole: the in-process engine samples with it and every sync gathers
    the learner's weights into it, so `model` holds the trained weights, as in one process.
    Rank 0 samples and verifies; every rank gets its batch (`BroadcastRollout`).

    With `teacher` set, the teacher is loaded once (`load_teacher`: frozen, on `model`'s device
    and dtype; a `TeacherError` when its tokenizer is not `tokenizer`) and given to the
    learner.

    With `episodes` (a multi-turn task: `--env`), the rollouts are episodes in its environment
    (`EpisodeRollout`, through the engine's token-level `generate_tokens`), and the loss, KL,
    ratios and divisors count only the tokens the policy sampled (`RolloutBatch.policy_mask`)."""
    strategy = make_strategy(dist_ctx)
    strategy.check_async(config.async_steps)
    threads = _learner_threads(config.async_steps)
    workers = strategy.update_workers(default_workers(model, config.cpu_workers, threads))
    plan = build_plan(config, workers, threads)
    teacher = None
    if config.distill.teacher is not None:
        weights_at = next(model.parameters())
        chunk = strategy.chunk_tokens(plan.logprob_chunk_tokens)
        teacher = load_teacher(
            config.distill.teacher,
            tokenizer,
            weights_at.device,
            weights_at.dtype,
            config.temperature,
            chunk,
        )
    if plan.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    policy = strategy.learner_copy(model)  # on N ranks the whole `model` stays the sampler's
    state = build_state(
        policy,
        seed=seed,
        lr=config.lr,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_steps,
        reference=plan.reference,
        critic_lr=config.critic.lr if plan.critic else None,
        dist_ctx=dist_ctx,
        strategy=strategy,
    )
    weights = list(reward_weights) if reward_weights is not None else [1.0] * len(reward_fns)
    if engine is None:
        sampler = copy.deepcopy(model).eval() if plan.async_steps > 0 else model
        engine = HFEngine(sampler, tokenizer, strategy.engine_workers(workers))
    if episodes is None:
        rollout = Rollout(
            engine, train_rows, reward_fns, weights, plan.sampling, tokenizer.pad_token_id
        )
    else:  # several turns in an environment (`--env`): the engine's token-level call
        if not hasattr(engine, "generate_tokens"):
            raise ConfigError(
                f"--env runs episodes through an engine's token-level call, which "
                f"{type(engine).__name__} does not have yet; use --engine hf without --ray"
            )
        rollout = EpisodeRollout(
            engine,
            train_rows,
            reward_fns,
            weights,
            plan.sampling,
            tokenizer.pad_token_id,
            episodes,
        )
    if plan.async_steps > 0:
        rollout = AsyncRollout(rollout, plan.async_steps, config.worker_timeout_s)
    rollout = strategy.share_rollout(rollout)
    on_policy = plan.correct is None and plan.async_steps == 0
    agreement = agreement_check(on_policy, engine, next(policy.parameters()).dtype)
    return Trainer(plan, state, rollout, Learner(state, plan, agreement, teacher))


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Turn on Hugging Face's non-reentrant activation checkpointing of `model`'s layers (a
    `ConfigError` for a model without it). It acts only in training mode with gradients on, so
    sampling (eval mode, no grad) keeps its KV cache and speed."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    kwargs = "activation_checkpointing_kwargs"
    if enable is None:  # transformers before the rename
        enable = getattr(model, "gradient_checkpointing_enable", None)
        kwargs = "gradient_checkpointing_kwargs"
    if enable is None or not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(
            "gradient_checkpointing=true needs a Hugging Face model that supports it; "
            f"{type(model).__name__} does not"
        )
    enable(**{kwargs: {"use_reentrant": False}})


def train_grpo(
    model: torch.nn.Module,
    tokenizer,
    train_rows: Iterator[dict[str, Any]],
    reward_fns: Sequence[RewardFn],
    config: GRPOConfig,
    run: RunDirectory,
    evaluate: Evaluator,
    seed: int,
    reward_weights: Sequence[float] | None = None,
    progress: bool = True,
    strict_reward_fn: RewardFn | None = None,
    resume: bool = False,
    engine: RolloutEngine | None = None,
    initial_eval: dict[str, float] | None = None,
    dist_ctx: DistContext | None = None,
    episodes: EpisodeSpec | None = None,
) -> list[dict[str, Any]]:
    """Run the config's steps, logging to `run`; returns the metric records. The loop reads
    only its `LoopPlan` (`build_loop_plan`); the step's switches are the trainer's `StepPlan`.

    `evaluate(model)` returns held-out metrics (logged under `eval/`), called before the first
    step (unless the caller passes that evaluation as `initial_eval`), on the schedule of
    `is_eval_step`, and after the last. `strict_reward_fn` (TRL signature) is the hacking
    monitor's verifier: every `monitor.every` steps it re-scores a sample of the step's
    completions, and a training reward above it by more than `monitor.gap` is logged
    (`monitor/*`) and warned about.

    Checkpoints go to `run.path/checkpoints` every `checkpoint_every` steps, at the end, and
    when SIGINT/SIGTERM asks the run to stop (the current step finishes first). With `resume`,
    the newest complete checkpoint is loaded (weights, optimizer, scheduler, RNG states, the
    data position) and metrics.jsonl / samples.jsonl are cut back to its step, so the resumed
    run appends exactly the steps an uninterrupted run would have written.

    With `dist_ctx` over several ranks every rank runs the loop (the same steps, checkpoints
    and decisions to stop, agreed by all); rank 0 alone evaluates, logs and shows progress,
    and the other ranks return [].
    """
    ctx = dist_ctx or single_process(next(model.parameters()).device)
    t = build_trainer(
        model,
        tokenizer,
        train_rows,
        reward_fns,
        config,
        seed,
        reward_weights,
        engine,
        ctx,
        episodes,
    )
    loop = build_loop_plan(config)
    monitor = HackingMonitor(
        strict_reward_fn,
        reward_fns[0],
        loop.monitor.every,
        loop.monitor.samples,
        loop.monitor.gap,
    )
    checkpoints = run.path / "checkpoints"
    last_eval = _resume_or_evaluate(
        t, model, run, evaluate, checkpoints if resume else None, initial_eval, ctx.is_main
    )
    start, stop, nonfinite_in_a_row = time.perf_counter(), StopRequest(), 0
    zero_reward = ZeroRewardWatch(loop.abort_zero_reward_steps)
    bar = tqdm(
        range(t.state.step + 1, loop.steps + 1),
        desc=loop.label,
        disable=not (progress and ctx.is_main),
    )
    with stop.installed(), _update_threads(t.plan), _closing(t, checkpoints, run):
        for step in bar:
            result = grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())
            t.state.step = step  # the data position is taken when checkpointing
            nonfinite_in_a_row = (
                nonfinite_in_a_row + 1 if "update/nonfinite" in result.metrics else 0
            )
            _stop_if_diverging(step, nonfinite_in_a_row, loop.max_nonfinite_steps, checkpoints)
            zero_reward(step, result.metrics, len(result.rewards))  # the same on every rank
            if not {"update/skipped", "update/nonfinite"} & result.metrics.keys():
                t.state.scheduler.step()
            t.learner.sync_reference(step)
            # decisions every rank must take alike: the ranks' clocks and signals may differ
            out_of_time = 0 < loop.max_seconds <= time.perf_counter() - start
            out_of_time = not all_ranks_agree(not out_of_time, ctx)
            stop.requested = not all_ranks_agree(not stop.requested, ctx)
            if ctx.is_main:
                record = {"step": step, **result.metrics, **device_memory(model)}
                record |= monitor(step, result.batch, result.rewards)
                if out_of_time or is_eval_step(step, loop.eval_every, loop.steps):
                    record |= {f"eval/{k}": v for k, v in evaluate(model).items()}
                    last_eval = record
                record["time/elapsed_s"] = time.perf_counter() - start
                run.log_metrics(record)
                run.log_samples(
                    sample_records(step, result.batch, result.rewards, loop.samples_per_step)
                )
                bar.set_postfix(
                    reward=f"{record['reward/mean']:.2f}",
                    acc=f"{last_eval.get('eval/greedy_acc', float('nan')):.2f}",
                    s_per_step=f"{record['time/step_s']:.2f}",
                )
            every, last = loop.checkpoint_every, step == loop.steps or out_of_time
            if last or (every > 0 and step % every == 0) or stop.requested:
                t.rollout.drain()  # queued sampling at rest: the generator and rows are still
                t.state.data_position = t.rollout.consumed
                _checkpoint(checkpoints, t.state, loop.keep_checkpoints)
            if out_of_time:
                break
            stop.raise_if_requested(step, run)
    return read_jsonl(run.metrics_path) if ctx.is_main else []


def _learner_threads(async_steps: int) -> int:
    """The update's torch threads: all of them, or one fewer with rollouts sampled in a
    background thread (sampling has the other)."""
    threads = torch.get_num_threads()
    return max(1, threads - 1) if async_steps > 0 else threads


def _update_threads(plan: StepPlan) -> contextlib.AbstractContextManager:
    """The loop's torch thread count (process-wide) set to `_learner_threads`."""
    if plan.async_steps == 0:
        return contextlib.nullcontext()
    return torch_threads(_learner_threads(plan.async_steps))


@contextlib.contextmanager
def _closing(t: Trainer, checkpoints: Path, run: RunDirectory) -> Iterator[None]:
    """Stop the rollout side's background work when the loop ends, however it ends; a lost
    worker's error gains the last checkpoint and the command that resumes from it."""
    try:
        yield
    except WorkerError as exc:
        t.rollout.close(wait=False)
        last = latest_checkpoint(checkpoints)
        where = f"the last checkpoint is {last}" if last else "no checkpoint was written yet"
        resume = f"; resume with: rlvr train --resume {run.path}" if last else ""
        raise WorkerError(exc.worker, f"{exc.problem}; {where}{resume}") from exc
    except BaseException:
        t.rollout.close(wait=False)
        raise
    t.rollout.close()


def _resume_or_evaluate(
    t: Trainer,
    model: torch.nn.Module,
    run: RunDirectory,
    evaluate: Evaluator,
    checkpoints: Path | None,
    initial_eval: dict[str, float] | None = None,
    main: bool = True,
) -> dict[str, float]:
    """Load the newest checkpoint under `checkpoints` (None: a fresh run) and cut the logs back
    to its step; otherwise log the starting model's evaluation as step 0: `initial_eval` when
    the caller has it already, else `evaluate(model)`. Returns that evaluation. A resumed run
    with no checkpoint yet (killed before its first) restarts from nothing: the logs the dead
    run wrote are emptied first, as its trackers start afresh. Only the `main` process logs
    and evaluates; every process loads, the checkpoint the main one chose (ranks that each
    listed the directory could see different newest ones, and train from different steps)."""
    latest = latest_checkpoint(checkpoints) if checkpoints is not None and main else None
    if t.state.dist_ctx is not None:
        latest = broadcast_object(latest, t.state.dist_ctx)
    if latest is not None:
        load_checkpoint(latest, t.state)
        t.rollout.skip(t.state.data_position)
        t.rollout.sync(t.learner)  # an engine with weights of its own samples the loaded ones
        if main:
            run.truncate_logs(after_step=t.state.step)
            tqdm.write(f"[rlvr] resumed from {latest} (step {t.state.step})", file=sys.stderr)
        return {}
    if not main:
        return {}
    if checkpoints is not None:  # resumed, but nothing to resume from: the dead run's rows go
        run.truncate_logs(after_step=-1)
    start = initial_eval if initial_eval is not None else evaluate(model)
    record = {f"eval/{k}": v for k, v in start.items()}
    run.log_metrics({"step": 0, **record})
    return record


def _stop_if_diverging(step: int, in_a_row: int, limit: int, checkpoints: Path) -> None:
    if in_a_row >= limit:
        raise FloatingPointError(
            f"step {step}: {in_a_row} updates in a row had a NaN/Inf loss or gradient and "
            "were skipped; stopping. Lower the learning rate or check the rewards; the last "
            f"good checkpoint is in {checkpoints}"
        )


def _checkpoint(checkpoints: Path, state: TrainState, keep_last: int) -> None:
    try:
        save_checkpoint(checkpoints, state, keep_last=keep_last)
    except CheckpointError as exc:  # e.g. a full disk: the previous checkpoint is intact
        tqdm.write(f"[rlvr] WARNING: {exc}", file=sys.stderr)


class StopRequest:
    """SIGINT/SIGTERM set a flag; the loop finishes its step, checkpoints and stops."""

    def __init__(self) -> None:
        self.requested = False

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self  # signals can only be handled on the main thread
            return

        def handler(signum, frame):
            if self.requested:  # a second Ctrl-C stops at once
                raise KeyboardInterrupt
            self.requested = True
            tqdm.write(
                "[rlvr] stop requested: finishing the current step, then checkpointing",
                file=sys.stderr,
            )

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def raise_if_requested(self, step: int, run: RunDirectory) -> None:
        """After the step's checkpoint: say how to resume and stop."""
        if self.requested:
            tqdm.write(
                f"[rlvr] stopped by signal after step {step}; checkpoint written. Resume "
                f"with: rlvr train --resume {run.path}",
                file=sys.stderr,
            )
            raise KeyboardInterrupt


def device_memory(model: torch.nn.Module) -> dict[str, float]:
    """`memory/peak_gpu_gb`: the peak CUDA memory allocated so far (GiB) when `model` is on a
    GPU; nothing on the CPU (peak RSS is a process figure: see the benchmarks)."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return {}
    return {"memory/peak_gpu_gb": torch.cuda.max_memory_allocated(device) / 2**30}


def is_eval_step(step: int, every: int, last: int) -> bool:
    """Multiples of `every`, powers of two below it, and the last step (`every` 0: the last
    step only)."""
    if every <= 0:
        return step == last
    power_of_two = step & (step - 1) == 0
    return step % every == 0 or (step < every and power_of_two) or step == last
