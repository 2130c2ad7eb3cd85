"""The switches of a GRPO run (`GRPOConfig`) and the one place they are checked.

Named recipes (`rlvr.train.recipes`) are nothing but sets of these switches.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlvr import algo


@dataclass(frozen=True)
class GRPOConfig:
    """Switches of the update and its sampling (the lab's defaults; recipes change them)."""

    steps: int = 100
    """Number of steps (one batch of prompts each)."""
    prompts_per_step: int = 16
    """Prompts per step (B)."""
    group_size: int = 8
    """Completions sampled per prompt (G); the advantage baseline is their mean."""
    max_new_tokens: int | None = None
    """Completion budget in tokens (None: the task's own budget, 48 for 3-digit arithmetic);
    a completion that reaches it is flagged truncated."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (the loss uses the same scaled distribution)."""
    lr: float = 1e-4
    """AdamW learning rate of the policy (constant after warm-up)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up: Adam's first steps are sign-like and move every weight."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    advantage_estimator: str = "grpo"
    """grpo, dr_grpo, rloo, reinforce++, reinforce++-baseline, or gae (PPO with a critic)."""
    scale_rewards: str = "group"
    """Divide centred rewards by the std of the group, of the batch, or none."""
    epsilon_low: float = 0.2
    """Clip: the ratio is floored at 1 - epsilon_low."""
    epsilon_high: float = 0.2
    """Clip: the ratio is capped at 1 + epsilon_high (> epsilon_low is DAPO's clip-higher)."""
    clip_ratio_c: float | None = None
    """Dual clip for negative advantages: the loss is capped at -A * c (e.g. 3.0)."""
    ratio_level: str = "token"
    """Importance ratio per token, per sequence (GSPO) or gspo-token."""
    aggregation: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-mean or seq-mean-token-sum-norm."""
    beta: float = 0.0
    """KL coefficient to the reference model; 0 loads no reference model."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2 or k3."""
    kl_in_reward: bool = False
    """Fold the KL penalty into the per-token reward (PPO style) instead of the loss."""
    ref_sync_every: int = 0
    """Update the reference model every N steps (0: never; it stays the initial model)."""
    ref_sync_alpha: float = 1.0
    """Reference update: ref = alpha * policy + (1 - alpha) * ref (1.0 copies)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts to fill B."""
    max_sampling_tries: int = 3
    """Most sampling rounds per step with dynamic sampling (then train on what was kept)."""
    overlong_buffer: int = 0
    """DAPO overlong shaping: a linear penalty in the last N tokens before max_new_tokens."""
    overlong_penalty: float = 1.0
    """The penalty at max_new_tokens (and for truncated completions)."""
    mask_truncated: bool = False
    """Leave completions that hit max_new_tokens out of the loss."""
    mu: int = 1
    """Optimisation passes over each batch (PPO epochs)."""
    critic_lr: float = 3e-4
    """AdamW learning rate of the value model (advantage_estimator=gae)."""
    gamma: float = 1.0
    """GAE discount (gae only)."""
    lam: float = 1.0
    """GAE lambda (gae only)."""
    value_clip: float = 0.2
    """Value-loss clip range (gae only)."""
    monitor_every: int = 5
    """Hacking monitor: every N steps re-score a sample of completions with the strict
    verifier and log the gap to the training reward (0 turns it off)."""
    monitor_samples: int = 32
    """Completions the monitor re-scores."""
    monitor_gap: float = 0.2
    """Warn when the training reward exceeds strict accuracy by more than this."""
    checkpoint_every: int = 25
    """Write a checkpoint every N steps and at the end (0: only at the end)."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept (older ones are deleted once a newer one is complete)."""
    max_nonfinite_steps: int = 3
    """Stop after this many consecutive updates skipped for a NaN/Inf loss or gradient."""
    eval_every: int = 20
    """Evaluate held-out accuracy every N steps, at steps 1, 2, 4, 8, ... below N (where
    the curve moves fastest), before the first step and after the last."""
    samples_per_step: int = 4
    """Completions written to samples.jsonl per step."""
    cpu_workers: int = 0
    """Python threads that sample and run the update's micro-batches side by side, one torch
    thread each (`rlvr.workers`); 0: one per torch thread on a CPU, one on a GPU. Faster than
    splitting each operator across cores for small models: 1.1-1.4x for sampling, 1.2-1.4x
    for the update on 2 cores (`benchmarks/bench_workers.py`)."""
    generation_threads: int = 0
    """torch threads while sampling with a single worker (`cpu_workers=1`); 0 picks by
    completion budget: one thread up to 64 tokens (11,600 against 9,700 tokens/s on the lab
    task), the update's threads beyond (7,400 against 6,600 at a 138-token budget)."""
    max_seconds: float = 0.0
    """Stop (and checkpoint) after the first step that ends past this many seconds of training
    (0: no limit); for equal-compute comparisons."""
    share_prompt_forward: bool = True
    """The update runs each group's prompt once and its G rows' completions on its KV cache
    (same log-probs and gradient; (G - 1) / G of the prompt tokens' work saved: 1.16x / 1.23x
    one pass on the lab / long task). Micro-batches then hold whole groups, so a group's
    completions pad to its longest: each step takes this plan only when it runs fewer tokens
    than rows sorted by length (`micro_batches.plan_update`). False: a prompt per row."""
    micro_batch_tokens: int = 0
    """Split the update into micro-batches of at most this many padded tokens (rows sorted by
    length, each trimmed to its longest row; gradients accumulated, the step's divisors kept).
    0: one pass over the whole batch with one worker; with several CPU workers,
    `WORKER_MICRO_BATCH_TOKENS` (small enough that a worker's activations stay in cache)."""


WORKER_MICRO_BATCH_TOKENS = 2048
"""Micro-batch budget when several CPU workers share the update (`bench_workers.py`, 2 cores,
prompts shared: 1.45x / 1.64x one pass on the lab / long task, 1.46x / 1.60x at 1024 and
1.15x / 1.61x at 4096)."""

ROW_ESTIMATORS = set(algo.ADVANTAGE_ESTIMATORS)  # per-completion estimators (not gae)


def check_grpo_config(config: GRPOConfig) -> None:
    """Refuse impossible settings before any model is loaded."""
    problems = []
    known = sorted(ROW_ESTIMATORS | {"gae"})
    if config.advantage_estimator not in known:
        problems.append(f"advantage_estimator must be one of {known}")
    registries = (
        ("aggregation", algo.AGGREGATIONS),
        ("kl_estimator", algo.KL_ESTIMATORS),
        ("ratio_level", algo.RATIO_LEVELS),
    )
    for name, registry in registries:
        if getattr(config, name) not in registry:
            problems.append(f"{name} must be one of {sorted(registry)}")
    if config.scale_rewards not in algo.REWARD_SCALES:
        problems.append("scale_rewards must be group, batch or none")
    group_based = config.advantage_estimator in ("grpo", "dr_grpo", "rloo")
    if config.group_size < 2 and group_based:
        problems.append("group_size must be >= 2: a group of one has no baseline")
    if config.prompts_per_step < 1 or config.steps < 1 or config.mu < 1:
        problems.append("prompts_per_step, steps and mu must be >= 1")
    if config.temperature <= 0:
        problems.append("temperature must be > 0: GRPO needs diverse samples")
    if config.beta < 0 or config.epsilon_low < 0 or config.epsilon_high < 0:
        problems.append("beta, epsilon_low and epsilon_high must be >= 0")
    if config.max_new_tokens is None or config.max_new_tokens < 1:
        problems.append("max_new_tokens must be set (>= 1) before training")
    elif not 0 <= config.overlong_buffer < config.max_new_tokens:
        problems.append("overlong_buffer must be in [0, max_new_tokens)")
    if problems:
        raise ValueError("invalid config: " + "; ".join(problems))
