"""GRPO and its family: sample G completions per prompt, verify, push toward the better ones.

One step, top to bottom (`grpo_step`): sample (with DAPO's dynamic sampling) -> verify ->
shape rewards -> advantages -> loss and update (mu passes) -> metrics. Formulas live in
`rlvr.algo`; each switch below picks one small function from a registry there, once.

Named recipes (`rlvr.train.recipes`) are nothing but sets of these switches.

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
import functools
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from rlvr import algo
from rlvr.models.logprobs import completion_logprobs, completion_logprobs_shared_prompts
from rlvr.models.value import ValueModel
from rlvr.report.run_dir import RunDirectory, read_jsonl
from rlvr.report.step_time import STEP_PARTS
from rlvr.rollout.engine import HFEngine, RolloutEngine
from rlvr.rollout.sampler import RolloutBatch, concat_batches, select_rows
from rlvr.tasks.rewards import RewardFn, reward_columns, total_rewards
from rlvr.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from rlvr.train.config import WORKER_MICRO_BATCH_TOKENS, GRPOConfig, check_grpo_config
from rlvr.train.micro_batches import plan_update, trimmed_rows
from rlvr.train.reference import sync_reference
from rlvr.workers import default_workers, map_in_threads

Evaluator = Callable[[torch.nn.Module], dict[str, float]]


@dataclass
class Models:
    """What one step trains and consults: the policy, and only what the switches need."""

    policy: torch.nn.Module
    optimizer: torch.optim.Optimizer
    reference: torch.nn.Module | None = None  # when beta > 0
    critic: ValueModel | None = None  # when advantage_estimator == "gae"
    critic_optimizer: torch.optim.Optimizer | None = None
    engine: RolloutEngine | None = None  # None: sample in process with the policy itself


def build_models(policy: torch.nn.Module, config: GRPOConfig) -> Models:
    """The policy's optimizer plus the reference and critic that `config` asks for."""
    models = Models(
        policy=policy,
        optimizer=torch.optim.AdamW(
            policy.parameters(), lr=config.lr, weight_decay=config.weight_decay
        ),
    )
    if config.beta > 0:
        models.reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if config.advantage_estimator == "gae":
        models.critic = ValueModel(policy)
        models.critic_optimizer = torch.optim.AdamW(models.critic.parameters(), lr=config.critic_lr)
    return models


def sample_and_score(
    models: Models,
    tokenizer,
    next_rows: Callable[[], list[dict[str, Any]]],
    reward_fns: Sequence[RewardFn],
    reward_weights: Sequence[float],
    config: GRPOConfig,
    generator: torch.Generator,
    workers: int = 1,
) -> tuple[RolloutBatch, list[dict[str, Any]], torch.Tensor, dict[str, float]]:
    """Sample G completions for B prompts and score them; with dynamic sampling, keep only
    groups whose rewards differ and draw more prompts (at most `max_sampling_tries` rounds)."""
    batches, all_rows, all_rewards, metrics = [], [], [], {}
    kept_groups, tries, generate_s, verify_s = 0, 0, 0.0, 0.0
    while tries < (config.max_sampling_tries if config.dynamic_sampling else 1):
        tries += 1
        rows = next_rows()
        t0 = time.perf_counter()
        engine = models.engine or HFEngine(models.policy, tokenizer, workers)
        batch = engine.generate(
            [r["prompt"] for r in rows], config.group_size, config.max_new_tokens,
            config.temperature, generator,
        )  # fmt: skip
        t1 = time.perf_counter()
        per_completion = [r for r in rows for _ in range(config.group_size)]  # group-major
        rewards, metrics = total_rewards(
            reward_fns, reward_weights, [r["prompt"] for r in per_completion],
            batch.completions, reward_columns(per_completion),
        )  # fmt: skip
        generate_s, verify_s = generate_s + t1 - t0, verify_s + time.perf_counter() - t1
        if config.dynamic_sampling:
            keep = algo.dynamic_sampling_keep(rewards, batch.group_ids).nonzero().squeeze(1)
            batch, rewards = select_rows(batch, keep), rewards[keep]
            rows = [rows[g] for g in batch.group_ids.unique().tolist()]
        batches.append(batch)
        all_rows.extend(rows)
        all_rewards.append(rewards)
        kept_groups += len(rows)
        if kept_groups >= config.prompts_per_step:
            break
    # one sampling round (always, without dynamic sampling) needs no re-padding copy
    batch = batches[0] if len(batches) == 1 else concat_batches(batches, tokenizer.pad_token_id)
    rewards = torch.cat(all_rewards)
    if config.dynamic_sampling and len(rewards) > 0:
        # train on exactly B groups when more were kept: the first B, in sampling order
        first = batch.group_ids < batch.group_ids.unique()[: config.prompts_per_step].max() + 1
        batch, rewards = select_rows(batch, first.nonzero().squeeze(1)), rewards[first]
        all_rows = all_rows[: config.prompts_per_step]
    if config.dynamic_sampling:
        metrics["sampling/tries"] = float(tries)
        metrics["sampling/kept_groups"] = float(kept_groups)
    metrics["time/generate_s"], metrics["time/verify_s"] = generate_s, verify_s
    return batch, all_rows, rewards, metrics


def grpo_step(
    models: Models,
    tokenizer,
    next_rows: Callable[[], list[dict[str, Any]]],
    reward_fns: Sequence[RewardFn],
    reward_weights: Sequence[float],
    config: GRPOConfig,
    generator: torch.Generator,
    num_threads: int,
) -> tuple[dict[str, float], RolloutBatch, list[dict[str, Any]], torch.Tensor]:
    """One step; returns (metrics, rollouts, their rows, verifier rewards)."""
    t0 = time.perf_counter()

    # --- sample and verify: G completions per prompt, one reward each ------------------------
    workers = default_workers(models.policy, config.cpu_workers, num_threads)
    torch.set_num_threads(generation_threads(config, num_threads))
    batch, rows, rewards, metrics = sample_and_score(
        models, tokenizer, next_rows, reward_fns, reward_weights, config, generator, workers
    )
    torch.set_num_threads(num_threads)
    t1 = time.perf_counter()
    if len(rewards) == 0:  # dynamic sampling found no informative group: nothing to learn
        skipped = {"reward/mean": 0.0, "update/skipped": 1.0, "time/step_s": t1 - t0}
        return {**metrics, **skipped}, batch, rows, rewards

    # --- shape rewards: DAPO's overlong penalty ------------------------------------------
    shaped = rewards
    if config.overlong_buffer > 0:
        shaped = rewards + algo.overlong_penalty(
            batch.lengths, config.max_new_tokens, config.overlong_buffer, config.overlong_penalty
        )
    loss_mask = batch.completion_mask
    if config.mask_truncated:
        loss_mask = algo.truncation_mask(loss_mask, batch.truncated)
    cols = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)

    # --- reference log-probs (KL in the loss or in the reward) ------------------------------
    ref_logp, ref_s = None, 0.0
    if models.reference is not None:  # beta = 0 builds no reference: no forward pass here
        t_ref = time.perf_counter()
        with torch.no_grad():
            ref_logp = completion_logprobs(models.reference, *cols, config.temperature)
        ref_s = time.perf_counter() - t_ref

    # --- advantages: group baseline, or GAE with the learned critic (PPO) ------------------
    # PPO credits tokens: the outcome reward sits on the last completion token
    gae = config.advantage_estimator == "gae"
    returns_in = algo.outcome_to_token_rewards(shaped, batch.completion_mask) if gae else shaped
    if config.kl_in_reward and ref_logp is not None:  # same shape out: [N] or [N, T]
        returns_in = algo.kl_in_reward(
            returns_in, batch.logprobs, ref_logp, batch.completion_mask, config.beta,
            config.kl_estimator,
        )  # fmt: skip
    values = returns = None
    if gae:
        with torch.no_grad():
            values = models.critic(*cols)
        advantages, returns = algo.gae_advantages(
            returns_in, values, batch.completion_mask, config.gamma, config.lam
        )
        advantages = algo.masked_whiten(advantages, loss_mask)
    else:
        estimator = algo.ADVANTAGE_ESTIMATORS[config.advantage_estimator]
        advantages = estimator(returns_in, batch.group_ids, scale_rewards=config.scale_rewards)
    t2 = time.perf_counter()

    # --- loss and update: mu passes against the sampling log-probs --------------------------
    # (no forward pass for the old log-probs: the sampler kept them, also for mu > 1)
    models.policy.train()
    beta_in_loss = 0.0 if config.kl_in_reward else config.beta
    # rows whose advantage is exactly 0 (every row of a zero-variance group) add nothing to
    # the loss or its gradient unless a KL term is in the loss: they get no forward pass
    carrying = torch.arange(len(rewards))
    if beta_in_loss == 0 and advantages.dim() == 1:
        carrying = (advantages != 0).nonzero().squeeze(1)
    # each worker gets a share of the rows, balanced by tokens, cut into micro-batches; whole
    # groups, each prompt run once, when that runs fewer tokens than rows sorted by length
    budget = config.micro_batch_tokens or (WORKER_MICRO_BATCH_TOKENS if workers > 1 else 0)
    shards, share = plan_update(
        carrying, batch.group_ids, batch.prompt_mask.sum(dim=1), batch.lengths, workers, budget,
        config.share_prompt_forward and config.group_size > 1,
    )  # fmt: skip
    parts = [part for shard in shards for part in shard]
    whole = len(parts) == 1 and len(carrying) == len(rewards)
    # every micro-batch's loss keeps the whole step's divisors: the summed gradient is the
    # gradient of one pass over the whole batch
    step_divisors = (
        {}
        if whole
        else {"num_tokens": max(1.0, loss_mask.sum().item()), "num_seqs": float(len(rewards))}
    )
    carried_tokens = max(1.0, loss_mask[carrying].sum().item())  # weights of policy/* metrics
    params = [p for p in models.policy.parameters() if p.requires_grad]

    def shard_gradients(
        shard: list[torch.Tensor],
    ) -> tuple[list, float, dict[str, float], float, float]:
        """Gradients (summed), loss and token-weighted metrics of one worker's micro-batches."""
        grads, loss_sum, metrics_sum, fwd_s, bwd_s = None, 0.0, {}, 0.0, 0.0
        for part in shard:
            cols_mb, (old_mb, adv_mb, mask_mb, ref_mb) = _micro_batch(
                batch, part, not whole, batch.logprobs, advantages, loss_mask, ref_logp
            )
            t_fwd = time.perf_counter()
            if share:  # each group's prompt runs once; same values and gradients
                logp = completion_logprobs_shared_prompts(
                    models.policy, *cols_mb, batch.group_ids[part], config.temperature
                )
            else:
                logp = completion_logprobs(models.policy, *cols_mb, config.temperature)
            loss, metrics_mb = algo.policy_loss(
                logp, old_mb, adv_mb, mask_mb,
                epsilon_low=config.epsilon_low, epsilon_high=config.epsilon_high,
                clip_ratio_c=config.clip_ratio_c, ratio_level=config.ratio_level,
                beta=beta_in_loss, ref_logp=ref_mb, kl_estimator=config.kl_estimator,
                aggregation=config.aggregation, max_len=config.max_new_tokens, **step_divisors,
            )  # fmt: skip
            t_bwd = time.perf_counter()
            part_grads = torch.autograd.grad(loss, params, allow_unused=True)
            fwd_s, bwd_s = fwd_s + t_bwd - t_fwd, bwd_s + time.perf_counter() - t_bwd
            grads = part_grads if grads is None else [_add(a, b) for a, b in zip(grads, part_grads)]
            loss_sum += loss.item()
            weight = mask_mb.sum().item() / carried_tokens
            # policy/* metrics: token-weighted means over the rows that carry a gradient
            for key, value in metrics_mb.items():
                metrics_sum[key] = metrics_sum.get(key, 0.0) + weight * value
        return grads, loss_sum, metrics_sum, fwd_s, bwd_s

    timings = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0, "critic": 0.0}
    for _ in range(config.mu):
        models.optimizer.zero_grad(set_to_none=True)
        loss_value, loss_metrics = 0.0, {}
        if not parts:  # nothing carries a gradient: the optimizer still steps (Adam momentum)
            for p in params:
                p.grad = torch.zeros_like(p)
            loss_metrics = {"policy/clip_frac": 0.0, "policy/approx_kl": 0.0}
        else:
            t_update = time.perf_counter()
            results = map_in_threads(shard_gradients, shards, workers)
            wall = time.perf_counter() - t_update
            for p, *shard_grads in zip(params, *[r[0] for r in results]):
                p.grad = _sum_grads(p, shard_grads)
            loss_value = sum(r[1] for r in results)
            for r in results:
                for key, value in r[2].items():
                    loss_metrics[key] = loss_metrics.get(key, 0.0) + value
            # the workers overlap: the wall time is split in the ratio of their summed parts
            fwd_s, bwd_s = sum(r[3] for r in results), sum(r[4] for r in results)
            timings["forward"] += wall * fwd_s / max(fwd_s + bwd_s, 1e-12)
            timings["backward"] += wall * bwd_s / max(fwd_s + bwd_s, 1e-12)
        t_opt = time.perf_counter()
        grad_norm = torch.nn.utils.clip_grad_norm_(models.policy.parameters(), config.grad_clip)
        if not (math.isfinite(loss_value) and torch.isfinite(grad_norm)):
            # a NaN/Inf would poison the weights and Adam's moments: skip, count, let the
            # caller stop after max_nonfinite_steps in a row
            models.optimizer.zero_grad(set_to_none=True)
            metrics["update/nonfinite"] = 1.0
            break
        models.optimizer.step()
        timings["optimizer"] += time.perf_counter() - t_opt
        if models.critic is not None:
            t_critic = time.perf_counter()
            critic_loss, critic_metrics = algo.value_loss(
                models.critic(*cols), values, returns, loss_mask, config.value_clip
            )
            models.critic_optimizer.zero_grad(set_to_none=True)
            critic_loss.backward()
            torch.nn.utils.clip_grad_norm_(models.critic.parameters(), config.grad_clip)
            models.critic_optimizer.step()
            loss_metrics.update(critic_metrics)
            timings["critic"] += time.perf_counter() - t_critic
    if models.engine is not None:
        models.engine.sync_weights(models.policy)
    t3 = time.perf_counter()

    # --- metrics ------------------------------------------------------------------------
    lengths = batch.lengths
    metrics.update(loss_metrics)
    metrics.update(
        {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
            "reward/shaped_mean": shaped.mean().item(),
            "frac_zero_std_groups": algo.zero_std_group_fraction(rewards, batch.group_ids),
            "completion/len_mean": lengths.mean().item(),
            "completion/len_max": lengths.max().item(),
            "completion/truncated_frac": batch.truncated.float().mean().item(),
            "loss": loss_value,
            "grad_norm": grad_norm.item(),
            "lr": models.optimizer.param_groups[0]["lr"],
            "update/micro_batches": float(len(parts)),
            "update/shared_prompts": float(share),
            "update/rows_skipped_frac": 1.0 - len(carrying) / len(rewards),
            "time/ref_logprobs_s": ref_s,
            "time/advantage_s": t2 - t1 - ref_s,
            "time/forward_s": timings["forward"],
            "time/backward_s": timings["backward"],
            "time/optimizer_s": timings["optimizer"],
            "time/update_s": t3 - t2,
            "time/step_s": t3 - t0,
            "throughput/completion_tokens_per_s": lengths.sum().item() / (t3 - t0),
            "throughput/generate_tokens_per_s": lengths.sum().item()
            / max(metrics["time/generate_s"], 1e-9),
        }
    )
    if models.critic is not None:
        metrics["time/critic_s"] = timings["critic"]
    named = sum(metrics[f"time/{k}_s"] for k in STEP_PARTS if f"time/{k}_s" in metrics)
    metrics["time/other_s"] = max(0.0, metrics["time/step_s"] - named)
    return metrics, batch, rows, rewards


def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else a + b


def _sum_grads(param: torch.Tensor, grads: list[torch.Tensor | None]) -> torch.Tensor:
    """The workers' gradients of `param` summed in worker order (zeros if none reached it)."""
    total = functools.reduce(_add, grads, None)
    return total if total is not None else torch.zeros_like(param)


def generation_threads(config: GRPOConfig, update_threads: int) -> int:
    """The sampling thread count (`GRPOConfig.generation_threads`; 0 is by budget); several
    workers sample on one torch thread each whatever this says."""
    if config.generation_threads > 0:
        return config.generation_threads
    return 1 if (config.max_new_tokens or 0) <= 64 else update_threads


def _micro_batch(
    batch: RolloutBatch, rows: torch.Tensor, trim: bool, *per_token: torch.Tensor | None
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
    """(loss-forward columns, per-token tensors) of micro-batch `rows`; untrimmed (the whole
    batch as it is) when there is a single micro-batch."""
    if not trim:
        cols = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
        return cols, per_token
    prompt_ids, prompt_mask, completion_mask, completion_ids, *rest = trimmed_rows(
        rows, batch.prompt_ids, batch.prompt_mask, batch.completion_mask, batch.completion_ids,
        *per_token,
    )  # fmt: skip
    return (prompt_ids, prompt_mask, completion_ids, completion_mask), tuple(rest)


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
) -> list[dict[str, Any]]:
    """Run `config.steps` steps, logging to `run`; returns the metric records.

    `evaluate(model)` returns held-out metrics (logged under `eval/`), called before the first
    step, on the schedule of `is_eval_step`, and after the last. `strict_reward_fn` (TRL
    signature) is the hacking monitor's verifier: every `monitor_every` steps it re-scores a
    sample of the step's completions, and a training reward above it by more than
    `monitor_gap` is logged (`monitor/*`) and warned about.

    Checkpoints go to `run.path/checkpoints` every `checkpoint_every` steps, at the end, and
    when SIGINT/SIGTERM asks the run to stop (the current step finishes first). With `resume`,
    the newest complete checkpoint is loaded (weights, optimizer, scheduler, RNG states, the
    data position) and metrics.jsonl / samples.jsonl are cut back to its step, so the resumed
    run appends exactly the steps an uninterrupted run would have written.
    """
    check_grpo_config(config)
    weights = list(reward_weights) if reward_weights is not None else [1.0] * len(reward_fns)
    num_threads = torch.get_num_threads()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    models = build_models(model, config)
    models.engine = engine
    warmup = max(1, config.warmup_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        models.optimizer, lambda s: min(1.0, (s + 1) / warmup)
    )

    consumed = 0  # training rows taken from the stream: the data position of a checkpoint

    def next_rows() -> list[dict[str, Any]]:
        nonlocal consumed
        consumed += config.prompts_per_step
        return [next(train_rows) for _ in range(config.prompts_per_step)]

    checkpoints = run.path / "checkpoints"
    first_step = 1
    start = time.perf_counter()
    last_eval: dict[str, float] = {}
    if resume and (latest := latest_checkpoint(checkpoints)) is not None:
        state = load_checkpoint(
            latest, policy=model, optimizer=models.optimizer, scheduler=schedule,
            reference=models.reference, critic=models.critic,
            critic_optimizer=models.critic_optimizer, generator=generator,
        )  # fmt: skip
        for _ in range(state["data_position"]):
            next(train_rows)
        consumed, first_step = state["data_position"], state["step"] + 1
        run.truncate_logs(after_step=state["step"])
        tqdm.write(f"[rlvr] resumed from {latest} (step {state['step']})", file=sys.stderr)
    else:
        last_eval = {f"eval/{k}": v for k, v in evaluate(model).items()}
        run.log_metrics({"step": 0, **last_eval})

    def checkpoint(step: int) -> None:
        try:
            save_checkpoint(
                checkpoints, step, policy=model, optimizer=models.optimizer, scheduler=schedule,
                reference=models.reference, critic=models.critic,
                critic_optimizer=models.critic_optimizer, generator=generator,
                data_position=consumed, keep_last=config.keep_checkpoints,
            )  # fmt: skip
        except CheckpointError as exc:  # e.g. a full disk: the previous checkpoint is intact
            tqdm.write(f"[rlvr] WARNING: {exc}", file=sys.stderr)

    stop = StopRequest()
    nonfinite_in_a_row = 0
    steps = range(first_step, config.steps + 1)
    bar = tqdm(steps, desc=config.advantage_estimator, disable=not progress)
    with stop.installed():
        for step in bar:
            metrics, batch, rows, rewards = grpo_step(
                models, tokenizer, next_rows, reward_fns, weights, config, generator, num_threads
            )
            nonfinite_in_a_row = nonfinite_in_a_row + 1 if "update/nonfinite" in metrics else 0
            if nonfinite_in_a_row >= config.max_nonfinite_steps:
                raise FloatingPointError(
                    f"step {step}: {nonfinite_in_a_row} updates in a row had a NaN/Inf loss or "
                    "gradient and were skipped; stopping. Lower the learning rate or check the "
                    f"rewards; the last good checkpoint is in {checkpoints}"
                )
            if "update/skipped" not in metrics and "update/nonfinite" not in metrics:
                schedule.step()
            out_of_time = 0 < config.max_seconds <= time.perf_counter() - start
            record = _record_step(
                step, metrics, batch, rows, rewards, models, config, evaluate, strict_reward_fn,
                start, final=out_of_time, train_reward_fn=reward_fns[0],
            )  # fmt: skip
            if "eval/greedy_acc" in record:
                last_eval = record
            run.log_metrics(record)
            run.log_samples(_sample_records(step, rows, batch, rewards, config))
            bar.set_postfix(
                reward=f"{metrics['reward/mean']:.2f}",
                acc=f"{last_eval.get('eval/greedy_acc', float('nan')):.2f}",
                s_per_step=f"{metrics['time/step_s']:.2f}",
            )
            every = config.checkpoint_every
            last = step == config.steps or out_of_time
            if last or (every > 0 and step % every == 0) or stop.requested:
                checkpoint(step)
            if out_of_time:
                break
            if stop.requested:
                tqdm.write(
                    f"[rlvr] stopped by signal after step {step}; checkpoint written. Resume "
                    f"with: rlvr train --resume {run.path}",
                    file=sys.stderr,
                )
                raise KeyboardInterrupt
    return read_jsonl(run.metrics_path)


def _record_step(
    step: int,
    metrics: dict[str, float],
    batch: RolloutBatch,
    rows: list[dict[str, Any]],
    rewards: torch.Tensor,
    models: Models,
    config: GRPOConfig,
    evaluate: Evaluator,
    strict_reward_fn: RewardFn | None,
    start: float,
    final: bool = False,
    train_reward_fn: RewardFn | None = None,
) -> dict[str, Any]:
    """The metrics line of one step: the step's own, the monitor's and the evaluation's."""
    model = models.policy
    if models.reference is not None and config.ref_sync_every > 0:
        if step % config.ref_sync_every == 0:
            sync_reference(models.reference, model, config.ref_sync_alpha)
    record: dict[str, Any] = {"step": step, **metrics}
    if strict_reward_fn is not None and config.monitor_every > 0 and len(rewards) > 0:
        if step % config.monitor_every == 0:
            record.update(
                monitor_hacking(strict_reward_fn, rows, batch, rewards, config, train_reward_fn)
            )
            if record["monitor/flagged"]:
                tqdm.write(
                    f"[rlvr] step {step}: training reward {record['monitor/train_reward']:.2f}"
                    f" but strict accuracy {record['monitor/strict_acc']:.2f} on the same "
                    "completions: the reward is being gamed (see docs/metrics.md, monitor/)",
                    file=sys.stderr,
                )
    if final or is_eval_step(step, config.eval_every, config.steps):
        record.update({f"eval/{k}": v for k, v in evaluate(model).items()})
    record["time/elapsed_s"] = time.perf_counter() - start
    return record


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


def monitor_hacking(
    strict_reward_fn: RewardFn,
    rows: list[dict[str, Any]],
    batch: RolloutBatch,
    rewards: torch.Tensor,
    config: GRPOConfig,
    train_reward_fn: RewardFn | None = None,
) -> dict[str, float]:
    """Re-score the first `monitor_samples` completions with the strict verifier and compare
    with the training verifier's score of the same completions: `train_reward_fn` (the first
    reward function, the one that judges correctness) when given, else the step's total
    reward. Other terms of a weighted reward (a format bonus, say) are not hacking."""
    n = min(config.monitor_samples, len(batch.completions))
    sample_rows = rows_per_completion(rows, batch.group_ids)[:n]
    prompts, columns = [r["prompt"] for r in sample_rows], reward_columns(sample_rows)
    strict, _ = total_rewards([strict_reward_fn], [1.0], prompts, batch.completions[:n], columns)
    train = rewards[:n]
    if train_reward_fn is not None:
        train, _ = total_rewards([train_reward_fn], [1.0], prompts, batch.completions[:n], columns)
    train_reward, strict_acc = train.mean().item(), strict.mean().item()
    gap = train_reward - strict_acc
    return {
        "monitor/train_reward": train_reward,
        "monitor/strict_acc": strict_acc,
        "monitor/gap": gap,
        "monitor/flagged": float(gap > config.monitor_gap),
    }


def rows_per_completion(
    rows: list[dict[str, Any]], group_ids: torch.Tensor
) -> list[dict[str, Any]]:
    """The row each completion answers: `rows` are in the order of the sorted group ids."""
    row_of_group = {g: i for i, g in enumerate(group_ids.unique().tolist())}
    return [rows[row_of_group[g]] for g in group_ids.tolist()]


def is_eval_step(step: int, every: int, last: int) -> bool:
    """Multiples of `every`, powers of two below it, and the last step."""
    power_of_two = step & (step - 1) == 0
    return step % every == 0 or (step < every and power_of_two) or step == last


def _sample_records(
    step: int, rows: list[dict[str, Any]], batch: RolloutBatch, rewards: torch.Tensor,
    config: GRPOConfig,
) -> list[dict[str, Any]]:  # fmt: skip
    """The first `samples_per_step` completions of the step, as plain data."""
    out = []
    completion_rows = rows_per_completion(rows, batch.group_ids) if rows else []
    for i in range(min(config.samples_per_step, len(batch.completions))):
        row = completion_rows[i]
        out.append(
            {
                "step": step,
                "prompt": row.get("prompt"),
                "answer": row.get("answer"),
                "completion": batch.completions[i],
                "reward": rewards[i].item(),
                "truncated": bool(batch.truncated[i]),
            }
        )
    return out
