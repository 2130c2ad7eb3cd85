"""`check_loss`: the loss identities of a GRPO config, run on the loss as the trainer resolves it.

A masked-mean bug makes a loss silently wrong on padded long chains of thought: dividing by the
padded width, or averaging per micro-batch instead of over the whole step, changes the weight of
every token with the amount of padding or the way the batch was cut (docs/masked_mean.md). The
checks here catch such bugs on the user's own configuration. Each one runs the functions
`build_plan` resolves from the config (the loss function with its aggregation, the advantage
function, the reward shaping and loss mask, the rollout correction) and, where gradients are
summed, the update's own planning and accumulation (`rlvr.train.update`: micro-batches, worker
threads, the ranks' shares, and the divisors they keep), on a synthetic padded batch: a few
prompts, each with a few long and many short completions, sampling and reference log-probs
near a tiny seeded Llama's own, padding filled with garbage where a check asks for it.

The identities, each with its tolerance in its detail line:

- **split: micro-batches** and **split: ranks**: the step's gradient (of a freshly initialised
  tiny model) and loss are the same for one micro-batch, two, many uneven ones, two worker
  threads, and two simulated torch.distributed ranks (each rank's share run by the learner's
  own rank code, `update.rank_gradients` through `FSDP2Strategy.accumulate`, in a one-process
  gloo group; the ranks' gradients summed as FSDP2 sums them). Float32 (the log-probs'
  log-softmax runs in float32): relative tolerance `GRAD_RTOL` of the largest gradient entry.
- **Dr. GRPO denominator** (`aggregation=seq-mean-token-sum-norm`): at ratio 1 every completion
  token's gradient is `-A_b / (max_len x sequences)`, and stays so when one completion is cut
  shorter (no other token's weight moves). Float64, `EXACT_RTOL`.
- **RLOO = n/(n-1) x centred** (`advantage_estimator=rloo`): the advantages equal
  `n / (n - 1) * (r - group mean)`. Float64, `EXACT_RTOL`.
- **zero-variance groups**: the members of a group whose rewards are all equal get advantage
  exactly 0 and the policy part of the loss gives their tokens exactly 0 gradient; rows the
  update skips for it leave the step's gradient unchanged. With a KL term in the loss
  (`beta > 0`, not in the reward) the detail says what the KL still gives them.
- **padding: garbage, width**: garbage token ids, large log-probs and values in the padding and
  twice the padded width change neither the step's loss nor its gradient (`GRAD_RTOL`).
- **padding: NaN/inf**: NaN, +-inf and +-1e30 in the padded log-probs, sampling and reference
  log-probs and per-token advantages change neither the loss nor the gradient (float64,
  `EXACT_RTOL`), and the padded positions get exactly 0 gradient: the loss selects padding away
  before any arithmetic (`rlvr.algo.reductions`).

A check that does not apply to the config (RLOO's identity under GRPO's estimator, say) is
reported "n/a" with the reason; that is neither a pass nor a failure.
`WRONG_AGGREGATIONS` are two deliberately wrong reductions (the bugs above) for tests and for
`benchmarks/masked_mean_figure.py`; the trainer never uses them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from rlvr import algo
from rlvr.config import ConfigError
from rlvr.models.logprobs import completion_logprobs
from rlvr.models.tiny import (
    SPECIAL_TOKENS,
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
)
from rlvr.rollout.sampler import RolloutBatch
from rlvr.train import update
from rlvr.train.config import AdvantageInputs, Distill, GRPOConfig, StepPlan, build_plan
from rlvr.train.distributed import DistContext
from rlvr.train.strategy import make_strategy, rank_forwards
from rlvr.workers import torch_threads

CHECK_MAX_NEW_TOKENS = 48
"""The completion budget checked when the config leaves `max_new_tokens` to the task (None):
the lab's 3-digit arithmetic budget."""
LONG_TOKENS = 40
"""The longest synthetic completion (or the budget, if smaller): long enough to be padded
against completions of 1-5 tokens, small enough for a check of about a second."""
PROMPTS = 4
"""Groups of the synthetic batch (each of the config's `group_size` completions)."""
GRAD_RTOL = 1e-5
"""Float32 paths: tolerated |difference| over the largest |entry| of the reference (the
trainer's micro-batches differ from one pass only by float rounding, about 1e-7 here)."""
EXACT_RTOL = 1e-12
"""Float64 paths (the loss on given log-probs): the same relative tolerance, at float64."""
GARBAGE = (float("nan"), float("inf"), float("-inf"), 1e30, -1e30)
"""What the NaN/inf check writes into the padding, in turn."""


@dataclass(frozen=True)
class CheckResult:
    """One identity checked: its name, whether it held, and the numbers (difference and
    tolerance). `applicable` False: the identity does not concern this config (the detail
    says why); such a result is neither passed nor failed."""

    name: str
    passed: bool
    detail: str
    applicable: bool = True

    @property
    def status(self) -> str:
        """ "pass", "FAIL" or "n/a"."""
        if not self.applicable:
            return "n/a"
        return "pass" if self.passed else "FAIL"

    @property
    def failed(self) -> bool:
        """The identity applies and did not hold (what makes `rlvr check-loss` exit 1)."""
        return self.applicable and not self.passed


def _not_applicable(name: str, reason: str) -> CheckResult:
    return CheckResult(name, passed=False, detail=reason, applicable=False)


def _nothing_compared(name: str) -> CheckResult:
    """A failure: the reference gradient is 0, so equal gradients would prove nothing."""
    return CheckResult(name, False, "the reference gradient is 0: nothing was compared")


# ----------------------------------------------------------------------------- wrong on purpose


def aggregate_padded_width_mean(per_token: Tensor, mask: Tensor, **ignored: float | None) -> Tensor:
    """WRONG on purpose (the bug this module's checks catch): the masked sum divided by the
    padded size ``mask.numel()`` = rows x padded width, whatever divisor was asked for.

    ``loss = sum_{b,t} mask[b,t] * per_token[b,t] / (B * T)``: the more padding, the smaller
    the loss and its gradient; micro-batches trimmed to different widths weigh differently.

    The keywords of `rlvr.algo.AGGREGATIONS`' call (``num_tokens``, ``num_seqs``, ``max_len``)
    are ignored: that is the bug.

    Returns:
        Tensor: 0-d loss.
    """
    return algo.masked_sum(per_token, mask) / mask.numel()


def aggregate_micro_batch_mean(
    per_token: Tensor, mask: Tensor, *, num_seqs: float | None = None, **ignored: float | None
) -> Tensor:
    """WRONG on purpose: each micro-batch's own token mean, weighted by its share of the rows.

    ``loss = masked_mean(per_token, mask) * B / num_seqs`` (``B`` this micro-batch's rows;
    ``num_seqs`` the step's, default ``B``): gradient accumulation with ``loss /
    accumulation_steps`` over micro-batches of equal rows. Right on one micro-batch; under
    accumulation a token of a micro-batch of long completions weighs less than one of short
    completions. ``num_tokens`` (and ``max_len``) are ignored: that is the bug.

    Returns:
        Tensor: 0-d loss.
    """
    rows = per_token.shape[0]
    return algo.masked_mean(per_token, mask) * rows / (num_seqs or rows)


WRONG_AGGREGATIONS: dict[str, Callable[..., Tensor]] = {
    "padded-width-mean": aggregate_padded_width_mean,
    "micro-batch-mean": aggregate_micro_batch_mean,
}
"""The two masked-mean bugs, with the signature of `rlvr.algo.AGGREGATIONS`' entries."""


# ----------------------------------------------------------------------------- expected values


def group_centred(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``[N]`` each reward minus the mean reward of its group (a plain loop over groups)."""
    out = torch.empty_like(rewards)
    for g in torch.unique(group_ids):
        rows = group_ids == g
        out[rows] = rewards[rows] - rewards[rows].mean()
    return out


def rloo_expected(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``[N]`` RLOO's advantages by the identity ``n / (n - 1) * (r_i - mean_g)``, ``n`` the
    size of ``i``'s group (a group of one gets 0)."""
    sizes = torch.stack([(group_ids == g).sum() for g in group_ids]).to(rewards.dtype)
    return torch.where(sizes > 1, sizes / (sizes - 1).clamp(min=1), 0.0) * group_centred(
        rewards, group_ids
    )


def dr_grpo_gradient(advantages: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """``[N, T]`` the gradient of Dr. GRPO's loss at ratio 1 with respect to each log-prob:
    ``-A_b / (max_len * N)`` on completion tokens, 0 on padding (``advantages`` ``[N]``)."""
    weight = 1.0 / (max_len * mask.shape[0])
    return torch.where(mask.bool(), -advantages[:, None] * weight, 0.0)


def relative_difference(actual: Tensor, reference: Tensor) -> float:
    """``max |actual - reference| / max |reference|`` (the plain max difference when the
    reference is all 0); ``inf`` if ``actual`` has a non-finite entry."""
    if not torch.isfinite(actual).all():
        return float("inf")
    diff = (actual - reference).abs().max().item() if actual.numel() else 0.0
    scale = reference.abs().max().item() if reference.numel() else 0.0
    return diff / scale if scale > 0 else diff


# ----------------------------------------------------------------------------- synthetic step


@dataclass(frozen=True)
class _Probe:
    """What a step starts from: rollouts, their rewards, and the other models' log-probs."""

    batch: RolloutBatch  # logprobs: the behaviour policy's, near the tiny model's
    rewards: Tensor  # [N] float64
    ref_logp: Tensor | None  # [N, T] reference log-probs (a reference exists)
    values: Tensor | None  # [N, T] critic values (gae)
    pi_old: Tensor  # [N, T] the learner's log-probs as the update starts (rollout correction)


@dataclass(frozen=True)
class _StepInputs:
    """What the update trains on, as `grpo_step` computes it from a `_Probe` with the plan."""

    batch: RolloutBatch
    advantages: Tensor  # [N] or [N, T]
    loss_mask: Tensor  # [N, T]
    ref_logp: Tensor | None


def _prepare(plan: StepPlan, probe: _Probe, rewards: Tensor | None = None) -> _StepInputs:
    """`grpo_step`'s phases 2-5 with `plan`'s functions: shaped rewards, loss mask, advantages,
    rollout correction (`rewards` replaces the probe's)."""
    batch = probe.batch
    shaped = plan.shape_rewards(probe.rewards if rewards is None else rewards, batch.lengths)
    loss_mask = plan.loss_mask(batch.policy_mask, batch.truncated)
    advantages, _ = plan.advantages(
        AdvantageInputs(shaped, batch, loss_mask, probe.ref_logp, probe.values)
    )
    if plan.correct is not None:
        batch, advantages, loss_mask, _ = plan.correct(batch, advantages, loss_mask, probe.pi_old)
    return _StepInputs(batch, advantages, loss_mask, probe.ref_logp)


def _probe(
    policy: torch.nn.Module, plan: StepPlan, group_size: int, max_len: int, seed: int
) -> _Probe:
    """A seeded batch of `PROMPTS` groups of `group_size`: in each, a quarter (at least one)
    of completions `LONG_TOKENS` long (or the budget) and the rest 1-5 tokens, rewards 0/1 with
    both in every group; prompts of 3-6 tokens, left-padded."""
    gen = torch.Generator().manual_seed(seed)
    vocab, pad, first = policy.config.vocab_size, policy.config.pad_token_id, len(SPECIAL_TOKENS)
    n, long_len = PROMPTS * group_size, min(max_len, LONG_TOKENS)
    lengths = []
    for _ in range(PROMPTS):
        for j in range(group_size):
            short = int(torch.randint(1, min(5, long_len) + 1, (1,), generator=gen))
            lengths.append(max(1, long_len - 3 * j) if j < max(1, group_size // 4) else short)
    lengths_t = torch.tensor(lengths)
    width = int(lengths_t.max())
    completion_mask = (torch.arange(width) < lengths_t[:, None]).float()
    completion_ids = torch.randint(first, vocab, (n, width), generator=gen)
    completion_ids = torch.where(completion_mask.bool(), completion_ids, pad)
    prompt_lengths = torch.randint(3, 7, (PROMPTS,), generator=gen).repeat_interleave(group_size)
    prompt_mask = (torch.arange(6).flip(0) < prompt_lengths[:, None]).long()  # left-padded
    prompts = torch.randint(first, vocab, (PROMPTS, 6), generator=gen).repeat_interleave(
        group_size, dim=0
    )
    rewards = torch.randint(0, 2, (PROMPTS, group_size), generator=gen).double()
    if group_size > 1:  # every group has reward variance
        rewards[:, 0], rewards[:, -1] = 1.0, 0.0
    else:  # groups of one (a batch baseline): variance across the batch
        rewards[:, 0] = (torch.arange(PROMPTS) % 2).double()
    batch = RolloutBatch(
        prompt_ids=torch.where(prompt_mask.bool(), prompts, pad),
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=torch.zeros(n, width),
        truncated=lengths_t >= max_len,
        group_ids=torch.arange(PROMPTS).repeat_interleave(group_size),
        completions=[""] * n,
    )
    with torch.no_grad():
        logp = completion_logprobs(policy, *batch.model_inputs(), plan.sampling.temperature)
    logp = torch.where(completion_mask.bool(), logp, 0.0)

    def near(scale: float) -> Tensor:  # the model's log-probs plus noise, 0 on padding
        noise = scale * torch.randn(logp.shape, generator=gen)
        return torch.where(completion_mask.bool(), logp + noise, 0.0)

    values = 0.5 * torch.randn(logp.shape, generator=gen) * completion_mask
    return _Probe(
        batch=dataclasses.replace(batch, logprobs=near(0.05)),
        rewards=rewards.flatten(),
        ref_logp=near(0.1) if plan.reference else None,
        values=values if plan.critic else None,
        pi_old=logp,
    )


@dataclass(frozen=True)
class _Gradient:
    """The step's loss and gradient (all trainable parameters, flattened) and its plan."""

    loss: float
    grad: Tensor
    parts: list[list[int]]  # rows per micro-batch, per worker or rank


def _step_gradient(
    policy: torch.nn.Module,
    plan: StepPlan,
    inputs: _StepInputs,
    *,
    micro_batch_tokens: int,
    workers: int = 1,
    skip_zero_advantage: bool | None = None,
    ranks: int = 0,
) -> _Gradient:
    """The update's gradient as the learner computes it: `update.plan_update_work` and
    `update.accumulate_gradients` with the plan's loss function. `ranks > 1`: one pass per
    simulated torch.distributed rank (`DistContext` of `ranks`, one worker each, in the
    one-process gloo group `_one_process_group` made), the ranks' gradients and losses summed."""
    skip = plan.skip_zero_advantage if skip_zero_advantage is None else skip_zero_advantage
    work = update.plan_update_work(
        inputs.batch,
        inputs.advantages,
        inputs.loss_mask,
        skip_zero_advantage=skip,
        workers=ranks or workers,
        micro_batch_tokens=micro_batch_tokens,
        forwards=rank_forwards(plan.forwards) if ranks else plan.forwards,  # as the Learner's
    )
    contexts = [DistContext(r, ranks, r, torch.device("cpu"), "gloo") for r in range(ranks)]
    params = [p for p in policy.parameters() if p.requires_grad]
    loss, grad = 0.0, torch.zeros(sum(p.numel() for p in params))
    for ctx in contexts or [None]:
        policy.zero_grad(set_to_none=True)
        strategy = make_strategy(ctx)  # a rank's: FSDP2Strategy's own rank code
        result = strategy.accumulate(
            policy,
            inputs.batch,
            work,
            (inputs.advantages, inputs.loss_mask, inputs.ref_logp),
            plan.loss_fn,
            plan.sampling.temperature,
            ranks or workers,
            strategy.chunk_tokens(plan.logprob_chunk_tokens),
        )
        loss += result.loss
        grad += torch.cat([p.grad.flatten() for p in params])
    policy.zero_grad(set_to_none=True)
    parts = [[len(part) for part in shard] for shard in work.shards]
    return _Gradient(loss, grad, parts)


@contextlib.contextmanager
def _one_process_group() -> Iterator[str | None]:
    """A gloo process group of this one process for the simulated ranks (their metrics
    all-reduce then sums one rank's values: the check sums the ranks itself), destroyed after.
    Yields None, or the reason there is none (one is running already, or gloo would not start)."""
    reason = None
    if dist.is_initialized():
        reason = "a torch.distributed process group is running already"
    else:
        try:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        except (RuntimeError, ValueError) as exc:
            reason = f"gloo would not start in this process ({exc})"
    try:
        yield reason
    finally:
        if reason is None:
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- the checks


def _teacher_not_checked(teacher: str) -> CheckResult:
    """The n/a line of a config with a teacher: its checks ran on the loss without it."""
    detail = (
        f"teacher={teacher}: the per-token reverse-KL advantages are not checked here "
        "(tests/test_algo_distill.py checks them); every check below ran with the verifier's "
        "advantages in their place"
    )
    return CheckResult("distillation advantages", False, detail, applicable=False)


def check_loss(config: GRPOConfig, seed: int = 0) -> list[CheckResult]:
    """The loss identities of `config` (module docstring), in the order: split: micro-batches,
    split: ranks, Dr. GRPO denominator, RLOO = n/(n-1) x centred, zero-variance groups,
    padding: garbage, width, padding: NaN/inf.

    `max_new_tokens` None is checked at `CHECK_MAX_NEW_TOKENS`. The synthetic batch and the
    tiny model are seeded by `seed`; torch's global random state is left as it was. An
    impossible config is a `ConfigError` naming every impossible setting."""
    if config.max_new_tokens is None:
        config = dataclasses.replace(config, max_new_tokens=CHECK_MAX_NEW_TOKENS)
    teacher = config.distill.teacher
    if teacher is not None:  # the loss is checked as it is; the teacher's advantages are not
        config = dataclasses.replace(config, distill=Distill())
    try:
        plan = build_plan(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    # one torch thread: the numbers do not depend on it, and a loaded CPU runs tiny operators
    # on several threads many times slower
    with torch.random.fork_rng(devices=[]), torch_threads(1):
        size = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
        policy = build_tiny_model(size, build_char_tokenizer(), seed).train()
        probe = _probe(policy, plan, config.group_size, config.max_new_tokens, seed)
        inputs = _prepare(plan, probe)
        reference = _step_gradient(policy, plan, inputs, micro_batch_tokens=0)
        skipped = [_teacher_not_checked(teacher)] if teacher is not None else []
        return skipped + [
            _check_split(policy, config, plan, inputs, reference),
            _check_split(policy, config, plan, inputs, reference, ranks=2),
            _check_dr_grpo(config, plan, probe, seed),
            _check_rloo(config, plan, probe),
            _check_zero_variance(policy, config, plan, probe),
            _check_padding(policy, plan, probe, seed),
            _check_padding_nan(plan, inputs, seed),
        ]


SPLIT_INVARIANT: dict[str, str] = {
    "token-mean": "each token's term over the step's token count",
    "seq-mean-token-mean": "each row's token mean over the step's row count",
    "seq-mean-token-sum-norm": "each row's token sum over max_len x the step's row count",
}
"""The aggregations invariant to how a step is cut into micro-batches and ranks (rows are never
cut), and why: each is a sum of per-row terms over a divisor of the whole step, which every
micro-batch keeps (`UpdateWork.divisors`)."""

NOT_SPLIT_INVARIANT: dict[str, str] = {}
"""Aggregations that by definition are not split-invariant, each with the reason: the split
checks say "n/a" with it instead of comparing. None of rlvr's is."""


def _split_names(parts: list[list[int]]) -> str:
    """ "3 [8+8+16]": micro-batches and their rows (ranks or workers separated by "|")."""
    count = sum(len(shard) for shard in parts)
    return f"{count} [{' | '.join('+'.join(map(str, shard)) for shard in parts)}]"


def _budgets(plan: StepPlan, inputs: _StepInputs) -> dict[str, int]:
    """Micro-batch token budgets: "2" cuts the batch in two micro-batches (the largest budget
    that does), "uneven" in micro-batches of 2 rows of the longest width and more of shorter."""
    batch = inputs.batch
    widest = int((batch.prompt_mask.sum(dim=1) + batch.lengths).max())

    def count(budget: int) -> int:
        work = update.plan_update_work(
            batch,
            inputs.advantages,
            inputs.loss_mask,
            skip_zero_advantage=plan.skip_zero_advantage,
            workers=1,
            micro_batch_tokens=budget,
            forwards=plan.forwards,
        )
        return len(work.parts)

    rows = len(batch.lengths)
    halves = (rows + 1) // 2 * widest
    two = next((k * widest for k in range(rows, 0, -1) if count(k * widest) == 2), halves)
    return {"2": two, "uneven": 2 * widest}


def _compare(reference: _Gradient, other: _Gradient) -> tuple[float, float]:
    """(relative gradient difference, |loss difference| over max(1, |loss|))."""
    loss_diff = abs(other.loss - reference.loss) / max(1.0, abs(reference.loss))
    return relative_difference(other.grad, reference.grad), loss_diff


def _split_verdict(
    name: str, config: GRPOConfig, reference: _Gradient, runs: dict[str, _Gradient]
) -> CheckResult:
    """Pass when every run's gradient and loss are within `GRAD_RTOL` of `reference`'s."""
    diffs = {label: _compare(reference, run) for label, run in runs.items()}
    worst = max(max(d) for d in diffs.values())
    splits = "; ".join(f"{label}: {_split_names(run.parts)}" for label, run in runs.items())
    detail = (
        f"max rel |dgrad|, |dloss| = {worst:.1e} (tol {GRAD_RTOL:.0e}) against one pass "
        f"{_split_names(reference.parts)}; {splits}"
    )
    if reference.grad.abs().max() == 0:
        return _nothing_compared(name)
    passed = worst <= GRAD_RTOL
    if not passed and config.aggregation not in SPLIT_INVARIANT:
        detail += (
            f" (aggregation {config.aggregation!r} is not in SPLIT_INVARIANT: if by definition "
            "it is not split-invariant, list it in NOT_SPLIT_INVARIANT with the reason)"
        )
    return CheckResult(name, passed, detail)


def _check_split(
    policy: torch.nn.Module,
    config: GRPOConfig,
    plan: StepPlan,
    inputs: _StepInputs,
    reference: _Gradient,
    *,
    ranks: int = 0,
) -> CheckResult:
    """One pass against other cuts of the step. `ranks` 0: two and uneven micro-batches, and
    two worker threads; `ranks` > 1: that many simulated ranks with the trainer's budget and
    with uneven micro-batches (the ranks then run different numbers of passes: the one with
    fewer runs zero-weight fillers)."""
    name = f"split: {ranks} ranks" if ranks else "split: micro-batches"
    if config.aggregation in NOT_SPLIT_INVARIANT:
        return _not_applicable(name, NOT_SPLIT_INVARIANT[config.aggregation])
    shared = build_plan(config, workers=ranks or 2)  # the budget the trainer gives them
    budgets = _budgets(plan, inputs)
    if not ranks:
        runs = {
            f"budget {b}": _step_gradient(policy, plan, inputs, micro_batch_tokens=b)
            for b in budgets.values()
        }
        runs["2 threads"] = _step_gradient(
            policy, shared, inputs, micro_batch_tokens=shared.micro_batch_tokens, workers=2
        )
        return _split_verdict(name, config, reference, runs)
    with _one_process_group() as reason:
        if reason is not None:
            return _not_applicable(name, f"no simulated ranks: {reason}")
        runs = {
            f"budget {b}": _step_gradient(policy, shared, inputs, micro_batch_tokens=b, ranks=ranks)
            for b in (shared.micro_batch_tokens, budgets["uneven"])
        }
    return _split_verdict(name, config, reference, runs)


def _ratio_one_gradient(plan: StepPlan, logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """d loss / d logp of `plan.loss_fn` at ratio 1 (old log-probs = `logp`) with the
    KL term off (`beta=0`) and the reference equal to `logp`: the policy part, float64."""
    leaf = logp.double().detach().requires_grad_(True)
    loss, _ = plan.loss_fn(leaf, leaf.detach(), advantages, mask, ref_logp=leaf.detach(), beta=0.0)
    return torch.autograd.grad(loss, leaf)[0]


def _check_dr_grpo(config: GRPOConfig, plan: StepPlan, probe: _Probe, seed: int) -> CheckResult:
    """Every token's gradient at ratio 1 is -A_b / (max_len x N), before and after the longest
    completion loses half its tokens; under `dr_grpo` the advantages are r - group mean."""
    name = "Dr. GRPO denominator"
    if config.aggregation != "seq-mean-token-sum-norm":
        divides = SPLIT_INVARIANT.get(config.aggregation, "its own divisor")
        return _not_applicable(
            name,
            f"aggregation={config.aggregation} takes {divides}, not Dr. GRPO's constant "
            "max_len x rows (seq-mean-token-sum-norm)",
        )
    assert config.max_new_tokens is not None
    gen = torch.Generator().manual_seed(seed + 1)
    batch = probe.batch
    advantages = torch.randn(len(batch.lengths), generator=gen, dtype=torch.float64)
    mask = batch.completion_mask.double()
    cut = mask.clone()
    row = int(batch.lengths.argmax())
    keep = int(batch.lengths[row]) // 2
    cut[row, keep:] = 0.0
    diffs = []
    for m in (mask, cut):
        grad = _ratio_one_gradient(plan, batch.logprobs, advantages, m)
        diffs.append(
            relative_difference(grad, dr_grpo_gradient(advantages, m, config.max_new_tokens))
        )
    detail = (
        f"every token's gradient = -A/(max_len {config.max_new_tokens} x {mask.shape[0]} seqs) "
        f"before and after row {row} lost {int(batch.lengths[row]) - keep} of its "
        f"{int(batch.lengths[row])} tokens: max rel |d| = {max(diffs):.1e} (tol {EXACT_RTOL:.0e})"
    )
    passed = max(diffs) <= EXACT_RTOL
    if config.advantage_estimator == "dr_grpo":
        rewards, wide = probe.rewards, _float64(probe)
        inputs = AdvantageInputs(rewards, wide.batch, mask, _zero_kl_reference(wide), wide.values)
        adv, _ = plan.advantages(inputs)
        no_std = relative_difference(adv, group_centred(rewards, batch.group_ids))
        passed = passed and no_std <= EXACT_RTOL
        detail += f"; A = r - group mean (no std): max rel |d| = {no_std:.1e}"
    return CheckResult(name, passed, detail)


def _float64(probe: _Probe) -> _Probe:
    """`probe` with its log-probs and values in float64 (the advantage functions compute in the
    log-probs' dtype when a KL is folded into the reward)."""

    def cast(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.double()

    batch = dataclasses.replace(probe.batch, logprobs=probe.batch.logprobs.double())
    return _Probe(
        batch, probe.rewards, cast(probe.ref_logp), cast(probe.values), probe.pi_old.double()
    )


def _zero_kl_reference(probe: _Probe) -> Tensor | None:
    """Reference log-probs equal to the sampling ones (the KL folded into a reward is then
    exactly 0 for k1, k2 and k3), where the plan has a reference."""
    return probe.batch.logprobs if probe.ref_logp is not None else None


def _check_rloo(config: GRPOConfig, plan: StepPlan, probe: _Probe) -> CheckResult:
    """RLOO's advantages against n/(n-1) x the group-centred rewards, one group constant."""
    name = "RLOO = n/(n-1) x centred"
    if config.advantage_estimator != "rloo":
        return _not_applicable(
            name,
            f"advantage_estimator={config.advantage_estimator} (check rloo with --recipe rloo)",
        )
    probe = _float64(probe)
    batch = probe.batch
    rewards = _with_constant_group(probe.rewards, batch.group_ids)
    mask = batch.completion_mask.double()
    adv, _ = plan.advantages(
        AdvantageInputs(rewards, batch, mask, _zero_kl_reference(probe), probe.values)
    )
    diff = relative_difference(adv, rloo_expected(rewards, batch.group_ids))
    n = config.group_size
    detail = (
        f"n = {n}: A = {n}/{n - 1} x (r - group mean) over {PROMPTS} groups (one constant): "
        f"max rel |d| = {diff:.1e} (tol {EXACT_RTOL:.0e})"
    )
    if config.kl_in_reward and config.beta > 0:
        detail += "; the KL folded into the reward set to 0 (reference = sampling log-probs)"
    return CheckResult(name, diff <= EXACT_RTOL, detail)


def _with_constant_group(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """`rewards` with every member of group 0 given reward 1."""
    return torch.where(group_ids == 0, 1.0, rewards)


def _check_zero_variance(
    policy: torch.nn.Module, config: GRPOConfig, plan: StepPlan, probe: _Probe
) -> CheckResult:
    """Group 0's rewards all 1: its advantages are exactly 0, the policy part of the loss gives
    its tokens exactly 0 gradient, and skipping its rows leaves the step's gradient as it is."""
    name = "zero-variance groups"
    if config.advantage_estimator not in algo.GROUP_BASELINE_ESTIMATORS:
        why = "the critic's values" if config.advantage_estimator == "gae" else "the batch mean"
        return _not_applicable(
            name,
            f"advantage_estimator={config.advantage_estimator}: the baseline is {why}, not the "
            "group's, so a group of equal rewards may get nonzero advantages by definition",
        )
    batch = probe.batch
    rewards = _with_constant_group(probe.rewards, batch.group_ids)
    zero_kl = dataclasses.replace(probe, ref_logp=_zero_kl_reference(probe))
    inputs = _prepare(plan, zero_kl, rewards)
    rows = batch.group_ids == 0
    adv = inputs.advantages[rows].abs().max().item()
    divisors = {"num_tokens": inputs.loss_mask.sum().item(), "num_seqs": float(len(rows))}
    old = inputs.batch.logprobs[rows].double()
    gen = torch.Generator().manual_seed(1)
    logp = old + 0.05 * torch.randn(old.shape, generator=gen, dtype=torch.float64)
    leaf = logp.requires_grad_(True)
    ref = probe.ref_logp[rows].double() if probe.ref_logp is not None else None
    args = (leaf, old, inputs.advantages[rows], inputs.loss_mask[rows])
    loss, _ = plan.loss_fn(*args, ref_logp=ref, beta=0.0, **divisors)
    policy_grad = torch.autograd.grad(loss, leaf)[0].abs().max().item()
    passed = adv == 0.0 and policy_grad == 0.0
    detail = (
        f"group 0 (rewards all 1): max |A| = {adv:.1e}, max |grad| of the policy part on its "
        f"tokens = {policy_grad:.1e} (both must be exactly 0)"
    )
    if config.kl_in_reward and config.beta > 0:
        detail += "; the KL folded into the reward set to 0 (reference = sampling log-probs)"
    if plan.skip_zero_advantage:  # the update skips the group's rows: same gradient
        skipped = _step_gradient(policy, plan, inputs, micro_batch_tokens=0)
        run = _step_gradient(policy, plan, inputs, micro_batch_tokens=0, skip_zero_advantage=False)
        diff = relative_difference(skipped.grad, run.grad)
        passed = passed and diff <= GRAD_RTOL
        detail += (
            f"; the update skips its {int(rows.sum())} rows: max rel |dgrad| against running "
            f"them = {diff:.1e} (tol {GRAD_RTOL:.0e})"
        )
    elif ref is not None:  # a KL term in the loss still pulls these rows toward the reference
        kl_loss, _ = plan.loss_fn(*args, ref_logp=ref, **divisors)
        kl_grad = torch.autograd.grad(kl_loss, leaf)[0].abs().max().item()
        detail += (
            f"; with beta = {config.beta} in the loss the KL term still gives them max |grad| = "
            f"{kl_grad:.1e} (by design: only the policy part is checked)"
        )
    return CheckResult(name, passed, detail)


def _garbage_padding(probe: _Probe, extra: int, seed: int) -> _Probe:
    """`probe` with `extra` more padding columns, and in every padding position a random token
    id and large random log-probs, reference log-probs and critic values (finite)."""
    batch, gen = probe.batch, torch.Generator().manual_seed(seed + 2)
    n, width = batch.completion_ids.shape
    mask = torch.cat([batch.completion_mask, torch.zeros(n, extra)], dim=1)
    pad = ~mask.bool()

    def widen(t: Tensor | None, scale: float) -> Tensor | None:
        if t is None:
            return None
        wide = torch.cat([t, torch.zeros(n, extra, dtype=t.dtype)], dim=1)
        junk = scale * torch.randn(wide.shape, generator=gen).to(t.dtype)
        return torch.where(pad, junk, wide)

    ids = torch.cat([batch.completion_ids, torch.zeros(n, extra, dtype=torch.long)], dim=1)
    junk_ids = torch.randint(0, int(batch.completion_ids.max()) + 1, ids.shape, generator=gen)
    wide = dataclasses.replace(
        batch,
        completion_ids=torch.where(pad, junk_ids, ids),
        completion_mask=mask,
        logprobs=widen(batch.logprobs, 1e4),
    )
    return _Probe(
        wide,
        probe.rewards,
        widen(probe.ref_logp, 1e4),
        widen(probe.values, 1e4),
        widen(probe.pi_old, 1e4),
    )


def _check_padding(
    policy: torch.nn.Module, plan: StepPlan, probe: _Probe, seed: int
) -> CheckResult:
    """The step with garbage padding twice as wide against the clean step, as planned."""
    name = "padding: garbage, width"
    width = probe.batch.completion_ids.shape[1]
    clean = _step_gradient(
        policy, plan, _prepare(plan, probe), micro_batch_tokens=plan.micro_batch_tokens
    )
    inputs = _prepare(plan, _garbage_padding(probe, width, seed))
    if inputs.advantages.dim() == 2:  # per-token advantages: garbage in their padding too
        pad = ~inputs.loss_mask.bool()
        inputs = dataclasses.replace(inputs, advantages=torch.where(pad, 1e4, inputs.advantages))
    dirty = _step_gradient(policy, plan, inputs, micro_batch_tokens=plan.micro_batch_tokens)
    if clean.grad.abs().max() == 0:
        return _nothing_compared(name)
    diff = max(_compare(clean, dirty))
    detail = (
        f"padded width {width} -> {2 * width}, padding holds random token ids and log-probs, "
        f"values of size 1e4: max rel |dgrad|, |dloss| = {diff:.1e} (tol {GRAD_RTOL:.0e})"
    )
    return CheckResult(name, diff <= GRAD_RTOL, detail)


def _check_padding_nan(plan: StepPlan, inputs: _StepInputs, seed: int) -> CheckResult:
    """The loss on float64 log-probs with NaN, +-inf and +-1e30 in every padded position of
    the log-probs, sampling and reference log-probs and per-token advantages."""
    name = "padding: NaN/inf"
    mask = inputs.loss_mask.double()
    pad = ~mask.bool()
    gen = torch.Generator().manual_seed(seed + 3)
    old = inputs.batch.logprobs.double()
    logp = old + 0.05 * torch.randn(old.shape, generator=gen, dtype=torch.float64)
    ref = old + 0.1 * torch.randn(old.shape, generator=gen, dtype=torch.float64)
    adv = inputs.advantages.double()
    adv = adv if adv.dim() == 2 else adv[:, None].expand_as(old)
    junk = torch.tensor(GARBAGE, dtype=torch.float64).repeat(pad.numel() // len(GARBAGE) + 1)
    junk = junk[: pad.numel()].view(pad.shape)

    def run(dirty: bool) -> tuple[float, Tensor]:
        def fill(t: Tensor) -> Tensor:
            return torch.where(pad, junk, t) if dirty else torch.where(pad, 0.0, t)

        leaf = fill(logp).requires_grad_(True)
        loss, _ = plan.loss_fn(leaf, fill(old), fill(adv), mask, ref_logp=fill(ref))
        return loss.item(), torch.autograd.grad(loss, leaf)[0]

    (clean_loss, clean_grad), (loss, grad) = run(False), run(True)
    if clean_grad.abs().max() == 0:
        return _nothing_compared(name)
    diff = max(
        relative_difference(grad, clean_grad),
        abs(loss - clean_loss) / max(1.0, abs(clean_loss)) if loss == loss else float("inf"),
    )
    padded = grad[pad].abs().max().item() if pad.any() else 0.0
    passed = diff <= EXACT_RTOL and padded == 0.0
    detail = (
        f"{int(pad.sum())} padded positions hold NaN, +-inf, +-1e30: max rel |dgrad|, |dloss| "
        f"= {diff:.1e} (tol {EXACT_RTOL:.0e}), max |grad| at padding = {padded:.1e} (must be 0)"
    )
    return CheckResult(name, passed, detail)


def format_check_results(results: list[CheckResult]) -> str:
    """A table: check, pass / FAIL / n/a, detail; then a line counting each."""
    width = max([len("check")] + [len(r.name) for r in results])
    lines = [f"{'check':{width}s}  {'result':6s}  detail"]
    lines += [f"{r.name:{width}s}  {r.status:6s}  {r.detail}" for r in results]
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "FAIL", "n/a")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)
