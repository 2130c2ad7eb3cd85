"""GRPO: sample G completions per prompt, verify them, push toward the above-average ones.

One step, top to bottom: sample -> verify -> advantages -> loss (mu passes) -> metrics.
Formulas live in `rlvr.algo`; this file only composes them.

Deviations from DeepSeekMath's GRPO (arXiv:2402.03300), all switchable:
- the loss is averaged over all completion tokens of the step ("token-mean", as DAPO and TRL
  do) rather than per sequence first; `aggregation="seq-mean-token-mean"` restores the paper;
- `beta` defaults to 0 (no KL penalty, no reference model loaded), as in DAPO, Dr. GRPO and
  TRL's default: with verifiable rewards the clip alone keeps updates small;
- the old log-probs are those recorded while sampling (no second forward pass).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from rlvr.algo import grpo_advantages, policy_loss, zero_std_group_fraction
from rlvr.models.logprobs import completion_logprobs
from rlvr.report.run_dir import RunDirectory
from rlvr.rollout.sampler import RolloutBatch, sample_completions
from rlvr.train.rewards import RewardFn, total_rewards


@dataclass(frozen=True)
class GRPOConfig:
    """Switches of the GRPO update and its sampling."""

    steps: int = 100
    """Number of GRPO steps (one batch of prompts each)."""
    prompts_per_step: int = 16
    """Prompts per step (B)."""
    group_size: int = 8
    """Completions sampled per prompt (G); the advantage baseline is their mean."""
    max_new_tokens: int = 48
    """Completion budget in tokens; a completion that reaches it is flagged truncated."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (the loss uses the same scaled distribution)."""
    lr: float = 1e-4
    """AdamW learning rate (constant after warm-up)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up: Adam's first steps are sign-like and move every weight."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    epsilon_low: float = 0.2
    """PPO clip: the ratio is floored at 1 - epsilon_low."""
    epsilon_high: float = 0.2
    """PPO clip: the ratio is capped at 1 + epsilon_high (> epsilon_low is DAPO's clip-higher)."""
    beta: float = 0.0
    """Weight of the KL penalty to the frozen initial model; 0 loads no reference model."""
    kl_estimator: str = "k3"
    """KL estimator of the penalty: k1, k2 or k3."""
    mu: int = 1
    """Optimisation passes over each batch (PPO epochs)."""
    aggregation: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-mean or seq-mean-token-sum-norm."""
    scale_rewards: bool = True
    """Divide advantages by the group's std (GRPO); False is Dr. GRPO's r - mean."""
    eval_every: int = 20
    """Evaluate held-out accuracy every N steps, at steps 1, 2, 4, 8, ... below N (where
    the curve moves fastest), before the first step and after the last."""
    samples_per_step: int = 4
    """Completions written to samples.jsonl per step."""
    generation_threads: int = 1
    """CPU threads while sampling: small-batch decoding is faster on one thread."""


Evaluator = Callable[[torch.nn.Module], dict[str, float]]


def check_grpo_config(config: GRPOConfig) -> None:
    """Refuse impossible settings before any model is loaded."""
    problems = []
    if config.group_size < 2 and config.scale_rewards:
        problems.append("group_size must be >= 2: a group of one has no baseline")
    if config.prompts_per_step < 1 or config.steps < 1 or config.mu < 1:
        problems.append("prompts_per_step, steps and mu must be >= 1")
    if config.temperature <= 0:
        problems.append("temperature must be > 0: GRPO needs diverse samples")
    if config.beta < 0 or config.epsilon_low < 0 or config.epsilon_high < 0:
        problems.append("beta, epsilon_low and epsilon_high must be >= 0")
    if problems:
        raise ValueError("invalid GRPO config: " + "; ".join(problems))


def grpo_step(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    tokenizer,
    optimizer: torch.optim.Optimizer,
    rows: list[dict[str, Any]],
    reward_fns: Sequence[RewardFn],
    reward_weights: Sequence[float],
    config: GRPOConfig,
    generator: torch.Generator,
    num_threads: int,
) -> tuple[dict[str, float], RolloutBatch, torch.Tensor]:
    """One GRPO step on `rows`; returns (metrics, rollouts, rewards)."""
    metrics: dict[str, float] = {}
    t0 = time.perf_counter()

    # --- sample: G completions per prompt -------------------------------------------------
    torch.set_num_threads(config.generation_threads)
    batch = sample_completions(
        model,
        tokenizer,
        [r["prompt"] for r in rows],
        num_samples=config.group_size,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        generator=generator,
    )
    torch.set_num_threads(num_threads)
    t1 = time.perf_counter()

    # --- verify: one reward per completion ------------------------------------------------
    prompts = [r["prompt"] for r in rows for _ in range(config.group_size)]
    columns = {k: [r[k] for r in rows for _ in range(config.group_size)] for k in rows[0]}
    columns.pop("prompt")
    rewards, reward_metrics = total_rewards(
        reward_fns, reward_weights, prompts, batch.completions, columns
    )
    t2 = time.perf_counter()

    # --- advantages: relative to the group ----------------------------------------------
    advantages = grpo_advantages(rewards, batch.group_ids, scale=config.scale_rewards)

    # --- loss and update: mu passes against the sampling log-probs -------------------------
    ref_logp = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logp = completion_logprobs(
                ref_model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                batch.completion_mask, config.temperature,
            )  # fmt: skip
    model.train()
    for _ in range(config.mu):
        logp = completion_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
            batch.completion_mask, config.temperature,
        )  # fmt: skip
        loss, loss_metrics = policy_loss(
            logp,
            batch.logprobs,
            advantages,
            batch.completion_mask,
            epsilon_low=config.epsilon_low,
            epsilon_high=config.epsilon_high,
            beta=config.beta,
            ref_logp=ref_logp,
            kl_estimator=config.kl_estimator,
            aggregation=config.aggregation,
            max_len=config.max_new_tokens,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
    t3 = time.perf_counter()

    # --- metrics ------------------------------------------------------------------------
    lengths = batch.lengths
    metrics.update(reward_metrics)
    metrics.update(loss_metrics)
    metrics.update(
        {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item(),
            "frac_zero_std_groups": zero_std_group_fraction(rewards, batch.group_ids),
            "completion/len_mean": lengths.mean().item(),
            "completion/len_max": lengths.max().item(),
            "completion/truncated_frac": batch.truncated.float().mean().item(),
            "loss": loss.item(),
            "grad_norm": grad_norm.item(),
            "lr": optimizer.param_groups[0]["lr"],
            "time/generate_s": t1 - t0,
            "time/verify_s": t2 - t1,
            "time/update_s": t3 - t2,
            "time/step_s": t3 - t0,
            "throughput/completion_tokens_per_s": lengths.sum().item() / (t3 - t0),
        }
    )
    return metrics, batch, rewards


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
) -> list[dict[str, Any]]:
    """Run `config.steps` GRPO steps, logging to `run`; returns the metric records.

    `evaluate(model)` returns held-out metrics (logged under `eval/`), called before the first
    step, every `eval_every` steps and after the last.
    """
    check_grpo_config(config)
    weights = list(reward_weights) if reward_weights is not None else [1.0] * len(reward_fns)
    num_threads = torch.get_num_threads()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    ref_model = None
    if config.beta > 0:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    warmup = max(1, config.warmup_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))

    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    initial = {f"eval/{k}": v for k, v in evaluate(model).items()}
    records.append({"step": 0, **initial})
    run.log_metrics(records[-1])
    bar = tqdm(range(1, config.steps + 1), desc="GRPO", disable=not progress)
    last_eval = initial
    for step in bar:
        rows = [next(train_rows) for _ in range(config.prompts_per_step)]
        metrics, batch, rewards = grpo_step(
            model, ref_model, tokenizer, optimizer, rows, reward_fns, weights, config,
            generator, num_threads,
        )  # fmt: skip
        schedule.step()
        record: dict[str, Any] = {"step": step, **metrics}
        if is_eval_step(step, config.eval_every, config.steps):
            last_eval = {f"eval/{k}": v for k, v in evaluate(model).items()}
            record.update(last_eval)
        record["time/elapsed_s"] = time.perf_counter() - start
        records.append(record)
        run.log_metrics(record)
        run.log_samples(_sample_records(step, rows, batch, rewards, config))
        bar.set_postfix(
            reward=f"{metrics['reward/mean']:.2f}",
            acc=f"{last_eval.get('eval/greedy_acc', float('nan')):.2f}",
            s_per_step=f"{metrics['time/step_s']:.2f}",
        )
    return records


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
    for i in range(min(config.samples_per_step, len(batch.completions))):
        row = rows[i // config.group_size]
        out.append(
            {
                "step": step,
                "prompt": row["prompt"],
                "answer": row.get("answer"),
                "completion": batch.completions[i],
                "reward": rewards[i].item(),
                "truncated": bool(batch.truncated[i]),
            }
        )
    return out
