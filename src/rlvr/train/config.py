"""The switches of a GRPO run (`GRPOConfig`), and `build_plan`: the one place they are checked
and resolved into the functions and numbers a step runs (`StepPlan`); `build_loop_plan` gives
the loop around the steps its settings (`LoopPlan`).

Each component owns its settings: the surrogate is one of `PPOClip`, `CISPO` and `GMPO` (a
union, each with its own clips: no clip of another surrogate can be set), and DAPO's dynamic
sampling and overlong shaping, the critic, the hacking monitor, the rollout correction and
on-policy distillation are nested frozen configs. The advantage functions take one
`AdvantageInputs`. Named recipes (`rlvr.train.recipes`) are nothing but sets of these
switches. No code after `build_plan` dispatches on a switch's string or reads a `GRPOConfig`
field in the step; `train_grpo`'s loop reads only its `LoopPlan`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import torch
import tyro

from rlvr import algo
from rlvr.algo.losses import SURROGATES, surrogate_conflicts
from rlvr.rollout.sampler import RolloutBatch
from rlvr.train.update import LossFn

LOGPROB_CHUNK_TOKENS = 1024
"""The `logprob_chunk_tokens` to set for a real vocabulary: 1024 x 49,152 tokens is 200 MB of
fp32 logits per chunk, and the head's forward + backward costs about a quarter more than with
whole logits (its matmul recomputed); smaller chunks cost more per token on a CPU (each chunk
rewrites the head's whole weight gradient). `benchmarks/bench_memory.py` measures it."""


@dataclass(frozen=True)
class PPOClip:
    """Surrogate ppo-clip: PPO's clipped ratio (the default)."""

    name: Annotated[Literal["ppo-clip"], tyro.conf.Suppress] = "ppo-clip"
    """The tag that picks this surrogate in YAML (`surrogate: {name: ppo-clip, ...}`)."""
    epsilon_low: float = 0.2
    """The ratio is floored at 1 - epsilon_low."""
    epsilon_high: float = 0.2
    """The ratio is capped at 1 + epsilon_high (> epsilon_low is DAPO's clip-higher)."""
    clip_ratio_c: float | None = None
    """Dual clip for negative advantages: the loss is capped at -A * c (e.g. 3.0)."""


@dataclass(frozen=True)
class CISPO:
    """Surrogate cispo (MiniMax-M1): the importance weight clipped to [1 - epsilon_low,
    1 + epsilon_high] and its gradient stopped, so every token keeps a gradient."""

    name: Annotated[Literal["cispo"], tyro.conf.Suppress] = "cispo"
    """The tag that picks this surrogate in YAML (`surrogate: {name: cispo, ...}`)."""
    epsilon_low: float = 1.0
    """The weight's floor is 1 - this (1.0: floor 0, no lower clip, as MiniMax-M1)."""
    epsilon_high: float = 4.0
    """The weight's cap is 1 + this (4.0: cap 5, ScaleRL's epsilon_max (arXiv:2510.13786)
    and TRL's recommended value; it only bounds the variance of a weight that grew, since a
    clipped token keeps its gradient; verl's example caps at 1.2, SkyRL's default at 6)."""


@dataclass(frozen=True)
class GMPO:
    """Surrogate gmpo: the geometric mean of a sequence's token ratios, each log-ratio clipped
    to [-epsilon_low, epsilon_high]; needs ratio_level token."""

    name: Annotated[Literal["gmpo"], tyro.conf.Suppress] = "gmpo"
    """The tag that picks this surrogate in YAML (`surrogate: {name: gmpo, ...}`)."""
    epsilon_low: float = 0.4
    """A negative-advantage token's log-ratio is floored at -this (the paper's e^-0.4)."""
    epsilon_high: float = 0.4
    """A non-negative-advantage token's log-ratio is capped at this (the paper's e^0.4)."""


Surrogate = (
    Annotated[PPOClip, tyro.conf.subcommand("ppo-clip")]
    | Annotated[CISPO, tyro.conf.subcommand("cispo")]
    | Annotated[GMPO, tyro.conf.subcommand("gmpo")]
)
"""The policy surrogate, each with its own clips: on the command line a subcommand
(`grpo.surrogate:cispo --grpo.surrogate.epsilon-high 4.0`), in YAML a mapping tagged by `name`
(`surrogate: {name: cispo, epsilon_high: 4.0}`), in `--set` `surrogate=cispo` then
`surrogate.epsilon_high=4.0`."""

SURROGATE_CONFIGS: dict[str, type] = {"ppo-clip": PPOClip, "cispo": CISPO, "gmpo": GMPO}


@dataclass(frozen=True)
class DynamicSampling:
    """DAPO's dynamic sampling: drop groups whose rewards are all equal, sample more prompts."""

    enabled: bool = False
    """Drop groups whose rewards are all equal and sample more prompts to fill B."""
    max_tries: int = 3
    """Most sampling rounds per step (then train on what was kept)."""


@dataclass(frozen=True)
class Overlong:
    """DAPO's overlong shaping: a linear penalty in the last `buffer` tokens of the budget."""

    buffer: int = 0
    """The penalty ramps over the last N tokens before max_new_tokens (0: off)."""
    penalty: float = 1.0
    """The penalty at max_new_tokens (and for truncated completions)."""


@dataclass(frozen=True)
class Critic:
    """The value model and GAE (advantage_estimator=gae only)."""

    lr: float = 3e-4
    """AdamW learning rate of the value model."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 1.0
    """GAE lambda."""
    value_clip: float = 0.2
    """Value-loss clip range."""


@dataclass(frozen=True)
class Monitor:
    """The hacking monitor: the strict verifier against the training reward."""

    every: int = 5
    """Every N steps re-score a sample of completions with the strict verifier and log the gap
    to the training reward (0 turns it off)."""
    samples: int = 32
    """Completions the monitor re-scores."""
    gap: float = 0.2
    """Warn when the training reward exceeds strict accuracy by more than this."""


@dataclass(frozen=True)
class RolloutCorrection:
    """Correct for rollouts sampled by another policy than the one the update starts from (a
    stale one with `async_steps` > 0; vLLM's or bf16's numerics)."""

    mode: str | None = None
    """tis (truncated importance weights), mis (masked IS: tokens above the cap dropped),
    icepop (tokens outside [low, cap] dropped) or none. With a correction the learner scores
    the batch before updating (pi_old: one more forward pass), the PPO ratio is taken against
    pi_old and each token's term is weighted by pi_old / behaviour (`rlvr.algo.
    rollout_correction`); the mismatch is logged (`mismatch/*`). None (unset, off): none for a
    synchronous run; an asynchronous run refuses to start."""
    level: str = "token"
    """The correction's ratio per token, or per sequence (one product for all its tokens)."""
    cap: float | None = None
    """The ratio's cap: tis truncates at it, mis and icepop drop above it (None: 2.0 for tis and
    mis, 5.0 for icepop, its paper's band)."""
    low: float = 0.5
    """icepop: tokens whose ratio is below this are dropped too."""


@dataclass(frozen=True)
class Distill:
    """On-policy distillation (off while `teacher` is None)."""

    teacher: str | None = None
    """A local model directory whose per-token log-probs of the student's own samples give
    each token the advantage log q - log pi (the sampled reverse KL, negated; `rlvr.algo.
    distill`). Its tokenizer must equal the student's (refused otherwise); it is loaded once,
    frozen, on the run's device. None: no teacher, no distillation."""
    kl_coef: float = 1.0
    """The weight of the per-token reverse-KL advantage."""
    reward_coef: float = 0.0
    """The weight of the verifier's advantages (the advantage estimator's, one per completion)
    added to every token's; 0 is pure distillation (no reward needed)."""


RENAMED_FIELDS: dict[str, str] = {
    "epsilon_low": "surrogate.epsilon_low (surrogate: {name: ppo-clip, epsilon_low: ...})",
    "epsilon_high": "surrogate.epsilon_high (surrogate: {name: ppo-clip, epsilon_high: ...})",
    "clip_ratio_c": "surrogate.clip_ratio_c (surrogate: {name: ppo-clip, clip_ratio_c: ...})",
    "cispo_epsilon_low": "surrogate.epsilon_low (surrogate: {name: cispo, epsilon_low: ...})",
    "cispo_epsilon_high": "surrogate.epsilon_high (surrogate: {name: cispo, epsilon_high: ...})",
    "gmpo_epsilon_low": "surrogate.epsilon_low (surrogate: {name: gmpo, epsilon_low: ...})",
    "gmpo_epsilon_high": "surrogate.epsilon_high (surrogate: {name: gmpo, epsilon_high: ...})",
    "dynamic_sampling": "dynamic_sampling.enabled",
    "max_sampling_tries": "dynamic_sampling.max_tries",
    "overlong_buffer": "overlong.buffer",
    "overlong_penalty": "overlong.penalty",
    "critic_lr": "critic.lr",
    "gamma": "critic.gamma",
    "lam": "critic.lam",
    "value_clip": "critic.value_clip",
    "share_prompt_forward": "forward (auto, padded, shared-prompt or packed)",
    "monitor_every": "monitor.every",
    "monitor_samples": "monitor.samples",
    "monitor_gap": "monitor.gap",
    "rollout_correction_level": "rollout_correction.level",
    "rollout_correction_cap": "rollout_correction.cap",
    "rollout_correction_low": "rollout_correction.low",
    "teacher": "distill.teacher",
    "distill_kl_coef": "distill.kl_coef",
    "distill_reward_coef": "distill.reward_coef",
}
"""The flat `GRPOConfig` fields of rlvr before the settings were grouped, and where each lives
now: a saved config.yaml of that layout is upgraded as it loads (`upgrade_flat_layout`, so
old runs resume), and `rlvr.config` names the new place when a `--set` or a YAML file mixing
the layouts uses an old name. A surrogate given by its name alone (`surrogate: cispo`) is that
surrogate with its default clips."""


_SURROGATE_CLIPS_BEFORE: dict[str, dict[str, str]] = {
    "ppo-clip": {k: k for k in ("epsilon_low", "epsilon_high", "clip_ratio_c")},
    "cispo": {"cispo_epsilon_low": "epsilon_low", "cispo_epsilon_high": "epsilon_high"},
    "gmpo": {"gmpo_epsilon_low": "epsilon_low", "gmpo_epsilon_high": "epsilon_high"},
}
"""Each surrogate's flat clip fields before the grouping -> the field of its config now."""


_FAMILY_MOVES: dict[str, str] = {
    "rollout_correction": "rollout_correction.mode",
    **{old: new for old, new in RENAMED_FIELDS.items() if " " not in new},
}
"""The flat family fields -> their dotted place (the surrogates' clips apart)."""


def upgrade_flat_layout(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A saved GRPO config of the flat layout (`RENAMED_FIELDS`; a run's config.yaml written
    before the grouping) in today's nested one, values unchanged, so old runs load and resume:
    the clips of the surrogate named by `surrogate` go into its config (another surrogate's
    flat clips at their defaults, as that layout saved them, are dropped; set to anything else
    they stay, to be refused naming their new place) and each flat family field
    into its part (`dynamic_sampling: true` -> `dynamic_sampling: {enabled: true}`);
    `share_prompt_forward` becomes `forward` (true: auto, false: padded). A mapping already in
    the nested layout comes back as it is."""
    flat = [k for k in data if k in _FAMILY_MOVES and not isinstance(data[k], Mapping)]
    flat += [k for k in data if k in RENAMED_FIELDS]
    if not flat and not isinstance(data.get("surrogate"), str):
        return data
    out = dict(data)
    name = out.get("surrogate", "ppo-clip")
    if isinstance(name, str):
        surrogate: dict[str, Any] = {"name": name}
        for member, clips in _SURROGATE_CLIPS_BEFORE.items():
            default = SURROGATE_CONFIGS[member]()
            for old, new in clips.items():
                if old in out and member == name:
                    surrogate[new] = out.pop(old)
                elif old in out and out[old] == getattr(default, new):
                    del out[old]  # the default the flat layout kept there: no setting
        out["surrogate"] = surrogate
    for old, place in _FAMILY_MOVES.items():
        if old in out and not isinstance(out[old], Mapping):
            part, leaf = place.split(".")
            value = out.pop(old)
            out[part] = {**(out[part] if isinstance(out.get(part), Mapping) else {}), leaf: value}
    if "share_prompt_forward" in out:  # true: let each step choose; false: a prompt per row
        shared = out.pop("share_prompt_forward")
        out.setdefault("forward", "auto" if shared else "padded")
    return out


@dataclass(frozen=True)
class GRPOConfig:
    """Switches of the update and its sampling (the lab's defaults; recipes change them).

    Each component owns its settings in a nested frozen config: the surrogate (`PPOClip`,
    `CISPO`, `GMPO`), DAPO's `dynamic_sampling` and `overlong` shaping, the `critic` (GAE),
    the hacking `monitor`, the `rollout_correction` and on-policy distillation (`distill`)."""

    RENAMED: ClassVar[dict[str, str]] = RENAMED_FIELDS
    UPGRADE: ClassVar[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = staticmethod(
        upgrade_flat_layout
    )

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
    ratio_level: str = "token"
    """Importance ratio per token, per sequence (GSPO) or gspo-token."""
    surrogate: Surrogate = field(default_factory=PPOClip)
    """The policy surrogate and its clips: ppo-clip (`PPOClip`), cispo (`CISPO`) or gmpo
    (`GMPO`); each holds only the clips it reads."""
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
    dynamic_sampling: DynamicSampling = field(default_factory=DynamicSampling)
    """DAPO's dynamic sampling (off by default)."""
    overlong: Overlong = field(default_factory=Overlong)
    """DAPO's overlong shaping (off by default: buffer 0)."""
    mask_truncated: bool = False
    """Leave completions that hit max_new_tokens out of the loss."""
    mu: int = 1
    """Optimisation passes over each batch (PPO epochs)."""
    critic: Critic = field(default_factory=Critic)
    """The value model's learning rate and GAE's settings (advantage_estimator=gae)."""
    monitor: Monitor = field(default_factory=Monitor)
    """The hacking monitor's schedule, sample and warning gap."""
    checkpoint_every: int = 25
    """Write a checkpoint every N steps and at the end (0: only at the end)."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept (older ones are deleted once a newer one is complete)."""
    max_nonfinite_steps: int = 3
    """Stop after this many consecutive updates skipped for a NaN/Inf loss or gradient."""
    abort_zero_reward_steps: int = 20
    """Stop after this many steps in a row whose training reward is exactly 0 while the
    verifier finds no answer in most completions (a format the verifier cannot read: a run
    that would learn nothing); 0 turns the check off."""
    eval_every: int = 20
    """Evaluate held-out accuracy every N steps, at steps 1, 2, 4, 8, ... below N (where
    the curve moves fastest), before the first step and after the last; 0: only before the
    first step and after the last (for models whose evaluation is costly)."""
    samples_per_step: int = 4
    """Completions written to samples.jsonl per step."""
    cpu_workers: int = 0
    """Python threads that sample and run the update's micro-batches side by side, one torch
    thread each (`rlvr.workers`); 0: one per torch thread on a CPU, one on a GPU. Faster than
    splitting each operator across cores for small models (`benchmarks/bench_workers.py`)."""
    generation_threads: int = 0
    """torch threads while sampling with a single worker (`cpu_workers=1`); 0 picks by
    completion budget: one thread up to 64 tokens, the update's threads beyond (measured by
    `benchmarks/bench_rollout.py`)."""
    max_seconds: float = 0.0
    """Stop (and checkpoint) after the first step that ends past this many seconds of training
    (0: no limit); for equal-compute comparisons."""
    forward: Literal["auto", "padded", "shared-prompt", "packed"] = "auto"
    """The loss's forward pass. padded: a prompt per row, rows sorted by length and padded to
    their micro-batch's widest. shared-prompt: each group's prompt once, its G completions on
    its KV cache ((G - 1) / G of the prompt tokens saved; micro-batches of whole groups, so a
    group's completions pad to its longest). packed: rows end to end, no padding, attention
    per row (`rlvr.models.packing`; models with sdpa or flash attention). All three give the
    same log-probs and gradients to float rounding. auto: each step takes the one the cost
    model prices lowest (`update.forward_cost`; the reference and pi_old passes pack too when
    packing is allowed and cheaper), and logs it (`update/packed`, `update/shared_prompts`,
    `update/padding_frac`)."""
    micro_batch_tokens: int = 0
    """Split the update into micro-batches of at most this many padded tokens (rows sorted by
    length, each trimmed to its longest row; gradients accumulated, the step's divisors kept).
    0: one pass over the whole batch with one worker; with several CPU workers,
    `WORKER_MICRO_BATCH_TOKENS` (small enough that a worker's activations stay in cache)."""
    logprob_chunk_tokens: int = 0
    """The loss's log-probs run the output head, log-softmax and gather over this many
    completion tokens at a time, each chunk's logits recomputed in the backward pass instead of
    stored (`rlvr.models.logprobs`): the [rows, tokens, vocab] logits are never held whole,
    only chunk x vocab floats, for one more head matmul per token; padding tokens are skipped.
    0 (the default): whole logits, which a vocabulary of ~100 characters makes cheap; the
    lab's results are pinned bit for bit, and chunking moves them at float rounding (its seeded
    sampled accuracy 0.939 -> 0.932). For a real vocabulary set `LOGPROB_CHUNK_TOKENS` (1024;
    `benchmarks/bench_memory.py`). Models that cannot be split into a decoder and a head
    (`decoder_and_head`) always take whole logits."""
    gradient_checkpointing: bool = False
    """Recompute each transformer layer's activations in the backward pass instead of storing
    them (Hugging Face's activation checkpointing, non-reentrant): activation memory falls
    from layers x tokens x (several x hidden) to about layers x tokens x hidden, for about
    one more forward pass of time. The update then runs a prompt per row (a KV cache cannot be
    checkpointed, so the shared-prompt forward is not taken); sampling (eval mode) keeps its
    cache."""
    async_steps: int = 0
    """Asynchronous (off-policy) training: the rollouts of the next K steps are sampled while
    this step updates (in a background thread beside the learner, or on Ray rollout workers),
    from weights at most K updates old. 0: synchronous (sample, update, sync, sample...).
    Needs `rollout_correction.mode` (or `none` given explicitly: no correction)."""
    rollout_correction: RolloutCorrection = field(default_factory=RolloutCorrection)
    """The rollout correction (`mode` None: unset, off)."""
    worker_timeout_s: float = 1800.0
    """Most seconds to wait on rollouts from another thread or process (async sampling, Ray
    rollout workers) before the run ends with an error naming the worker and the last
    checkpoint; while waiting a heartbeat line is printed every minute. Never a silent hang."""
    verify_timeout_s: float = 60.0
    """Most seconds one reward function may take on one step's completions (one call, the
    whole batch); past it they score 0 for it, `verifier/<fn>/timeout` counts them, the run
    warns once and the call's thread is abandoned (`rlvr.tasks.rewards`). 0: unbounded. The
    lab's batch takes milliseconds, a code batch of 128 a few seconds; a code batch whose
    programs mostly run to the sandbox's 3 s per test can take longer."""
    distill: Distill = field(default_factory=Distill)
    """On-policy distillation: the teacher and its coefficients (`teacher` None: off)."""


WORKER_MICRO_BATCH_TOKENS = 2048
"""Micro-batch budget when several CPU workers share the update: small enough that a worker's
activations stay in its core's cache (`benchmarks/bench_workers.py` measures 1024-4096)."""


@dataclass(frozen=True)
class AdvantageInputs:
    """What a step has when it computes advantages; each advantage function reads the fields
    it uses (N rows, T completion tokens)."""

    shaped: torch.Tensor
    """The verifier's rewards after shaping (DAPO's overlong penalty), [N]."""
    batch: RolloutBatch
    """The rollouts: group ids, completion mask and the sampler's log-probs."""
    loss_mask: torch.Tensor
    """The tokens the loss counts, [N, T] (truncated rows masked out if asked)."""
    ref_logp: torch.Tensor | None = None
    """The reference model's log-probs, [N, T] (None without a reference: beta == 0)."""
    values: torch.Tensor | None = None
    """The critic's values, [N, T] (gae only)."""
    teacher_logp: torch.Tensor | None = None
    """The teacher's log-probs, [N, T] (on-policy distillation only)."""


Advantages = Callable[[AdvantageInputs], "tuple[torch.Tensor, torch.Tensor | None]"]
"""(inputs) -> (advantages [N] or [N, T], returns [N, T] | None)."""

Correction = Callable[
    [RolloutBatch, torch.Tensor, torch.Tensor, torch.Tensor],
    "tuple[RolloutBatch, torch.Tensor, torch.Tensor, dict[str, float]]",
]
"""(batch, advantages [N] | [N, T], loss mask [N, T], pi_old log-probs [N, T]) -> (the batch
with pi_old as its log-probs, advantages [N, T], loss mask [N, T], mismatch metrics)."""

DEFAULT_CORRECTION_CAPS = {"tis": 2.0, "mis": 2.0, "icepop": 5.0}


@dataclass(frozen=True)
class SamplingPlan:
    """What the rollout side needs: how many prompts and completions, and how to sample."""

    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    temperature: float
    max_rounds: int  # sampling rounds per step: > 1 only with DAPO's dynamic sampling
    dynamic_sampling: bool
    threads: int  # torch threads while sampling
    verify_timeout_s: float = 0.0  # each reward function's call bounded (0: unbounded)


@dataclass(frozen=True)
class StepPlan:
    """Every switch of `GRPOConfig` resolved once: the functions a step calls and its numbers."""

    sampling: SamplingPlan
    shape_rewards: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (r [N], len [N])
    loss_mask: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (mask [N,T], trunc [N])
    advantages: Advantages
    loss_fn: LossFn
    mu: int
    grad_clip: float
    value_clip: float
    skip_zero_advantage: bool  # rows with advantage 0 carry no gradient (no KL in the loss)
    forwards: tuple[str, ...]  # the loss's forwards a step may take (`update.FORWARDS`)
    micro_batch_tokens: int
    logprob_chunk_tokens: int  # the loss's log-probs, this many tokens at a time (0: whole)
    gradient_checkpointing: bool  # the policy recomputes its layers' activations in backward
    workers: int
    reference: bool  # a frozen reference model is needed (beta > 0)
    critic: bool  # a value model is trained (gae)
    ref_sync_every: int
    ref_sync_alpha: float
    # (batch, advantages, loss mask, pi_old log-probs) -> the corrected three and mismatch
    # metrics; None: no correction, no pi_old forward pass (the sampling log-probs are pi_old)
    correct: Correction | None = None
    async_steps: int = 0  # rollouts sampled ahead of the update, from weights this many old
    teacher: bool = False  # a frozen teacher scores the samples (on-policy distillation)


def build_plan(config: GRPOConfig, workers: int = 1, threads: int | None = None) -> StepPlan:
    """Check `config` (a `ValueError` naming every impossible setting) and resolve it for a
    learner with `workers` CPU workers and `threads` torch threads (default: torch's count)."""
    _check(config)
    assert config.max_new_tokens is not None  # checked
    threads = threads if threads is not None else torch.get_num_threads()
    with_kl = config.beta > 0
    beta_in_loss = 0.0 if config.kl_in_reward else config.beta
    kl_reward = _identity_kl
    if config.kl_in_reward and with_kl:
        kl_reward = functools.partial(
            _kl_into_reward, beta=config.beta, estimator=config.kl_estimator
        )
    if config.advantage_estimator == "gae":
        advantages = functools.partial(
            _gae_advantages,
            kl_reward=kl_reward,
            gamma=config.critic.gamma,
            lam=config.critic.lam,
        )
    else:
        advantages = functools.partial(
            _group_advantages,
            kl_reward=kl_reward,
            estimator=algo.ADVANTAGE_ESTIMATORS[config.advantage_estimator],
            scale_rewards=config.scale_rewards,
        )
    distill = config.distill
    if distill.teacher is not None:  # the teacher's reverse KL, plus the verifier's if mixed
        advantages = functools.partial(
            _distill_advantages,
            reward_advantages=advantages,
            kl_coef=distill.kl_coef,
            reward_coef=distill.reward_coef,
        )
    shape_rewards = _no_shaping
    if config.overlong.buffer > 0:
        shape_rewards = functools.partial(
            _overlong_shaping,
            max_len=config.max_new_tokens,
            buffer=config.overlong.buffer,
            penalty=config.overlong.penalty,
        )
    surrogate = config.surrogate
    loss_fn = functools.partial(
        algo.policy_loss,
        surrogate=surrogate.name,
        epsilon_low=surrogate.epsilon_low,
        epsilon_high=surrogate.epsilon_high,
        clip_ratio_c=getattr(surrogate, "clip_ratio_c", None),  # PPOClip's alone
        ratio_level=config.ratio_level,
        beta=beta_in_loss,
        kl_estimator=config.kl_estimator,
        aggregation=config.aggregation,
        max_len=config.max_new_tokens,
    )
    sampling = SamplingPlan(
        prompts_per_step=config.prompts_per_step,
        group_size=config.group_size,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        max_rounds=config.dynamic_sampling.max_tries if config.dynamic_sampling.enabled else 1,
        dynamic_sampling=config.dynamic_sampling.enabled,
        threads=generation_threads(config, threads),
        verify_timeout_s=config.verify_timeout_s,
    )
    return StepPlan(
        sampling=sampling,
        shape_rewards=shape_rewards,
        loss_mask=algo.truncation_mask if config.mask_truncated else _whole_mask,
        advantages=advantages,
        loss_fn=loss_fn,
        mu=config.mu,
        grad_clip=config.grad_clip,
        value_clip=config.critic.value_clip,
        skip_zero_advantage=beta_in_loss == 0,
        forwards=_forwards(config),
        micro_batch_tokens=config.micro_batch_tokens
        or (WORKER_MICRO_BATCH_TOKENS if workers > 1 else 0),
        logprob_chunk_tokens=config.logprob_chunk_tokens,
        gradient_checkpointing=config.gradient_checkpointing,
        workers=workers,
        reference=with_kl,
        critic=config.advantage_estimator == "gae",
        ref_sync_every=config.ref_sync_every,
        ref_sync_alpha=config.ref_sync_alpha,
        correct=_correction(config),
        async_steps=config.async_steps,
        teacher=distill.teacher is not None,
    )


@dataclass(frozen=True)
class LoopPlan:
    """What `train_grpo`'s loop reads, around the steps: how many, when to evaluate, checkpoint
    and monitor, and when to stop early."""

    steps: int
    eval_every: int  # `is_eval_step`'s schedule (0: before the first step and after the last)
    checkpoint_every: int  # and at the end (0: only at the end)
    keep_checkpoints: int
    max_seconds: float  # stop after the first step past this (0: no limit)
    monitor: Monitor  # the hacking monitor's every / samples / gap
    samples_per_step: int  # completions written to samples.jsonl per step
    max_nonfinite_steps: int  # stop after this many skipped updates in a row
    abort_zero_reward_steps: int  # stop after this many unreadable zero-reward steps (0: off)
    label: str  # the progress bar's: the advantage estimator


def build_loop_plan(config: GRPOConfig) -> LoopPlan:
    """The loop's settings of `config` (checked by `build_plan`, which the trainer runs)."""
    return LoopPlan(
        steps=config.steps,
        eval_every=config.eval_every,
        checkpoint_every=config.checkpoint_every,
        keep_checkpoints=config.keep_checkpoints,
        max_seconds=config.max_seconds,
        monitor=config.monitor,
        samples_per_step=config.samples_per_step,
        max_nonfinite_steps=config.max_nonfinite_steps,
        abort_zero_reward_steps=config.abort_zero_reward_steps,
        label=config.advantage_estimator,
    )


def _correction(config: GRPOConfig) -> Correction | None:
    """The run's rollout correction as one function, or None for none (or unset)."""
    correction = config.rollout_correction
    mode = correction.mode
    if mode in (None, "none"):
        return None
    cap = correction.cap or DEFAULT_CORRECTION_CAPS[mode]
    weigh = functools.partial(
        algo.ROLLOUT_CORRECTIONS[mode], cap=cap, low=correction.low, level=correction.level
    )
    return functools.partial(_rollout_correction, weigh=weigh, level=correction.level)


def check_grpo_config(config: GRPOConfig) -> None:
    """`build_plan`'s check alone: refuse impossible settings before any model is loaded."""
    build_plan(config)


def generation_threads(config: GRPOConfig, update_threads: int) -> int:
    """The sampling thread count (`GRPOConfig.generation_threads`; 0 is by budget); several
    workers sample on one torch thread each whatever this says."""
    if config.generation_threads > 0:
        return config.generation_threads
    return 1 if (config.max_new_tokens or 0) <= 64 else update_threads


def _check(config: GRPOConfig) -> None:
    """Raise one `ValueError` listing every impossible setting of `config`."""
    problems = _switch_problems(config) + _surrogate_problems(config) + _range_problems(config)
    problems += _distill_problems(config) + _forward_problems(config)
    if problems:
        raise ValueError("invalid config: " + "; ".join(problems))


def _forward_problems(config: GRPOConfig) -> list[str]:
    """A forward the other switches rule out."""
    if config.forward == "shared-prompt" and config.gradient_checkpointing:
        return [
            "forward shared-prompt runs the prompts' KV cache, which gradient_checkpointing "
            "cannot replay: use forward auto, padded or packed"
        ]
    return []


def _switch_problems(config: GRPOConfig) -> list[str]:
    """Switches whose value names no registered function."""
    problems = []
    registries = (
        ("advantage_estimator", {*algo.ADVANTAGE_ESTIMATORS, "gae"}),
        ("aggregation", algo.AGGREGATIONS),
        ("kl_estimator", algo.KL_ESTIMATORS),
        ("ratio_level", algo.RATIO_LEVELS),
    )
    for name, registry in registries:
        if getattr(config, name) not in registry:
            problems.append(f"{name} must be one of {sorted(registry)}")
    if config.scale_rewards not in algo.REWARD_SCALES:
        problems.append("scale_rewards must be group, batch or none")
    if config.rollout_correction.mode not in (None, *algo.ROLLOUT_CORRECTIONS):
        problems.append(
            f"rollout_correction.mode must be one of {sorted(algo.ROLLOUT_CORRECTIONS)}"
        )
    if config.rollout_correction.level not in ("token", "sequence"):
        problems.append("rollout_correction.level must be token or sequence")
    return problems


def _surrogate_problems(config: GRPOConfig) -> list[str]:
    """A setting the surrogate cannot run with, or a clip width out of range (each surrogate
    config holds only its own clips, so none can be set for another)."""
    surrogate = config.surrogate
    if not isinstance(surrogate, tuple(SURROGATE_CONFIGS.values())):
        return [f"surrogate must be one of {', '.join(SURROGATE_CONFIGS)}"]
    assert surrogate.name in SURROGATES
    problems = surrogate_conflicts(
        surrogate.name,
        ratio_level=config.ratio_level,
        clip_ratio_c=getattr(surrogate, "clip_ratio_c", None),
    )
    for name in ("epsilon_low", "epsilon_high"):
        if getattr(surrogate, name) < 0:
            problems.append(f"surrogate.{name} must be >= 0")
    if surrogate.name != "gmpo" and surrogate.epsilon_low > 1:  # gmpo's clips a log-ratio
        what = "ratio" if surrogate.name == "ppo-clip" else "weight"
        problems.append(f"surrogate.epsilon_low must be <= 1 (the {what}'s floor is 1 - it)")
    return problems


def _range_problems(config: GRPOConfig) -> list[str]:
    """Numbers outside the range where the step means anything."""
    problems = []
    rewards_used = config.distill.teacher is None or config.distill.reward_coef > 0
    group_baseline = config.advantage_estimator in algo.GROUP_BASELINE_ESTIMATORS
    if config.group_size < 2 and group_baseline and rewards_used:
        problems.append(
            f"group_size must be >= 2 for {config.advantage_estimator}: a group of one has no "
            "baseline (every advantage would be 0)"
        )
    if config.prompts_per_step < 1 or config.steps < 1 or config.mu < 1:
        problems.append("prompts_per_step, steps and mu must be >= 1")
    if config.temperature <= 0:
        problems.append("temperature must be > 0: GRPO needs diverse samples")
    if config.beta < 0:  # the clip widths: `_surrogate_problems`
        problems.append("beta must be >= 0")
    if config.max_new_tokens is None or config.max_new_tokens < 1:
        problems.append("max_new_tokens must be set (>= 1) before training")
    elif not 0 <= config.overlong.buffer < config.max_new_tokens:
        problems.append("overlong.buffer must be in [0, max_new_tokens)")
    if config.logprob_chunk_tokens < 0:
        problems.append("logprob_chunk_tokens must be >= 0 (0: whole logits)")

    if config.worker_timeout_s <= 0:
        problems.append("worker_timeout_s must be > 0")
    if config.async_steps < 0:
        problems.append("async_steps must be >= 0 (0: synchronous)")
    elif config.async_steps > 0 and config.rollout_correction.mode is None:
        problems.append(
            f"async_steps={config.async_steps} trains on rollouts from weights up to "
            f"{config.async_steps} updates old: set rollout_correction.mode to tis, mis or "
            "icepop (or to none explicitly, for no correction)"
        )
    cap, low = config.rollout_correction.cap, config.rollout_correction.low
    if (cap is not None and cap <= 0) or not 0 <= low < (cap or 5.0):
        problems.append("rollout_correction.cap must be > 0 and rollout_correction.low in [0, cap)")
    return problems + [f"{name} must be {bound}" for name, ok, bound in _bounds(config) if not ok]


def _forwards(config: GRPOConfig) -> tuple[str, ...]:
    """The forwards a step may take: the one named, or for auto all three, the shared-prompt
    forward only with groups (G > 1) and without gradient checkpointing. The learner drops
    packed where the model cannot pack (`Learner`)."""
    if config.forward != "auto":
        return (config.forward,)
    shared = config.group_size > 1 and not config.gradient_checkpointing
    return ("padded", *(["shared-prompt"] if shared else []), "packed")


def _bounds(config: GRPOConfig) -> list[tuple[str, bool, str]]:
    """(field, whether its value is in range, the range) of the plain numeric fields."""
    c = config
    return [
        ("group_size", c.group_size >= 1, ">= 1"),
        ("lr", c.lr >= 0, ">= 0"),
        ("critic.lr", c.critic.lr >= 0, ">= 0"),
        ("warmup_steps", c.warmup_steps >= 0, ">= 0"),
        ("weight_decay", c.weight_decay >= 0, ">= 0"),
        ("grad_clip", c.grad_clip > 0, "> 0"),
        ("critic.gamma", 0 <= c.critic.gamma <= 1, "in [0, 1]"),
        ("critic.lam", 0 <= c.critic.lam <= 1, "in [0, 1]"),
        ("critic.value_clip", c.critic.value_clip > 0, "> 0"),
        ("ref_sync_every", c.ref_sync_every >= 0, ">= 0 (0: never)"),
        ("ref_sync_alpha", 0 < c.ref_sync_alpha <= 1, "in (0, 1]"),
        ("dynamic_sampling.max_tries", c.dynamic_sampling.max_tries >= 1, ">= 1"),
        ("overlong.penalty", c.overlong.penalty >= 0, ">= 0"),
        ("monitor.every", c.monitor.every >= 0, ">= 0 (0: off)"),
        ("monitor.samples", c.monitor.samples >= 1, ">= 1"),
        ("checkpoint_every", c.checkpoint_every >= 0, ">= 0 (0: only at the end)"),
        ("keep_checkpoints", c.keep_checkpoints >= 1, ">= 1"),
        ("max_nonfinite_steps", c.max_nonfinite_steps >= 1, ">= 1"),
        ("abort_zero_reward_steps", c.abort_zero_reward_steps >= 0, ">= 0 (0: off)"),
        ("eval_every", c.eval_every >= 0, ">= 0"),
        ("samples_per_step", c.samples_per_step >= 0, ">= 0"),
        ("cpu_workers", c.cpu_workers >= 0, ">= 0 (0: one per torch thread)"),
        ("generation_threads", c.generation_threads >= 0, ">= 0 (0: by budget)"),
        ("max_seconds", c.max_seconds >= 0, ">= 0 (0: no limit)"),
        ("micro_batch_tokens", c.micro_batch_tokens >= 0, ">= 0"),
        ("verify_timeout_s", c.verify_timeout_s >= 0, ">= 0 (0: unbounded)"),
    ]


def _distill_problems(config: GRPOConfig) -> list[str]:
    """On-policy distillation's settings: coefficients, a teacher with a critic, or a
    coefficient set without a teacher (it would be ignored)."""
    problems = []
    distill = config.distill
    if distill.kl_coef < 0 or distill.reward_coef < 0:
        problems.append("distill.kl_coef and distill.reward_coef must be >= 0")
    if distill.teacher is None:
        for name in ("kl_coef", "reward_coef"):
            if getattr(distill, name) != getattr(Distill(), name):
                problems.append(
                    f"distill.{name} has no effect without a teacher: set distill.teacher too"
                )
        return problems
    if not distill.teacher.strip():
        problems.append("distill.teacher must be a model directory (or unset)")
    if config.advantage_estimator == "gae":
        problems.append(
            "distill.teacher gives per-token advantages of its own: advantage_estimator=gae "
            "(a critic) cannot be mixed in; choose a group estimator"
        )
    if distill.kl_coef == 0 and distill.reward_coef == 0:
        problems.append("with a teacher, distill.kl_coef and distill.reward_coef cannot both be 0")
    return problems


# --- the pieces build_plan chooses between (compositions of rlvr.algo formulas) --------------


def _no_shaping(rewards: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return rewards


def _overlong_shaping(
    rewards: torch.Tensor, lengths: torch.Tensor, *, max_len: int, buffer: int, penalty: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment added to the verifier's rewards."""
    return rewards + algo.overlong_penalty(lengths, max_len, buffer, penalty)


def _whole_mask(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    return mask


def _identity_kl(
    rewards: torch.Tensor, batch: RolloutBatch, ref_logp: torch.Tensor | None
) -> torch.Tensor:
    return rewards


def _kl_into_reward(
    rewards: torch.Tensor,
    batch: RolloutBatch,
    ref_logp: torch.Tensor | None,
    *,
    beta: float,
    estimator: str,
) -> torch.Tensor:
    """The KL penalty to the reference folded into the reward (PPO style): same shape out."""
    assert ref_logp is not None, "kl_in_reward needs reference log-probs (beta > 0)"
    return algo.kl_in_reward(rewards, batch.logprobs, ref_logp, batch.policy_mask, beta, estimator)


def _group_advantages(
    inputs: AdvantageInputs, *, kl_reward: Callable, estimator: Callable, scale_rewards: str
) -> tuple[torch.Tensor, None]:
    """One advantage per completion from its group's rewards (grpo, rloo, reinforce++, ...);
    reads the shaped rewards, the batch (its group ids) and the reference log-probs."""
    rewards = kl_reward(inputs.shaped, inputs.batch, inputs.ref_logp)
    return estimator(rewards, inputs.batch.group_ids, scale_rewards=scale_rewards), None


def _gae_advantages(
    inputs: AdvantageInputs, *, kl_reward: Callable, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO: the outcome reward on the last completion token, GAE against the critic's values,
    advantages whitened over the loss mask; also the returns the critic regresses on."""
    assert inputs.values is not None, "gae needs the critic's values"
    batch = inputs.batch
    per_token = algo.outcome_to_token_rewards(inputs.shaped, batch.policy_mask)
    per_token = kl_reward(per_token, batch, inputs.ref_logp)
    advantages, returns = algo.gae_advantages(
        per_token, inputs.values, batch.policy_mask, gamma, lam
    )
    return algo.masked_whiten(advantages, inputs.loss_mask), returns


def _distill_advantages(
    inputs: AdvantageInputs,
    *,
    reward_advantages: Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor | None]],
    kl_coef: float,
    reward_coef: float,
) -> tuple[torch.Tensor, None]:
    """On-policy distillation: per token, kl_coef x (teacher - student log-prob) on the loss
    mask's tokens, plus reward_coef x the verifier's group advantage of the completion
    (computed only when reward_coef > 0). The student's log-probs are the batch's: those it
    sampled with."""
    assert inputs.teacher_logp is not None, "on-policy distillation needs the teacher's log-probs"
    loss_mask = inputs.loss_mask
    kl_adv = algo.reverse_kl_advantages(inputs.batch.logprobs, inputs.teacher_logp, loss_mask)
    reward_adv = torch.zeros(len(inputs.shaped))
    if reward_coef > 0:
        reward_adv, _ = reward_advantages(inputs)
    return algo.mixed_advantages(kl_adv, reward_adv, loss_mask, kl_coef, reward_coef), None


def _rollout_correction(
    batch: RolloutBatch,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    old_logp: torch.Tensor,
    *,
    weigh: Callable,
    level: str,
) -> tuple[RolloutBatch, torch.Tensor, torch.Tensor, dict[str, float]]:
    """Weights pi_old / behaviour (the engine's log-probs) per token, folded into the
    advantages and the loss mask (`algo.corrected_advantages`); the batch's log-probs become
    pi_old, the PPO ratio's denominator."""
    weights, keep = weigh(old_logp, batch.logprobs, loss_mask)
    metrics = algo.mismatch_metrics(old_logp, batch.logprobs, loss_mask, weights, keep, level)
    advantages, loss_mask = algo.corrected_advantages(advantages, loss_mask, weights, keep)
    return dataclasses.replace(batch, logprobs=old_logp), advantages, loss_mask, metrics
