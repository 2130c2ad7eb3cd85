"""The policy update of one step: micro-batches, worker threads, gradient sums, the divisors.

`plan_update_work` decides once per step which rows carry a gradient, how they are shared among
the CPU workers and cut into micro-batches, and the divisors every micro-batch's loss keeps;
`accumulate_gradients` runs that plan in one process and leaves in each parameter's `.grad` the
gradient of one pass over the whole batch; `rank_gradients` is the same on torch.distributed
ranks (rank r runs worker r's share under FSDP2; `train/strategy.py` picks one of the two);
`optimizer_step` clips and steps (or refuses a NaN/Inf); `critic_step` is PPO's value update.

Micro-batches by a token budget: a forward pass over a padded batch costs rows x (longest
prompt + longest completion) tokens. Sorting rows by length before splitting puts similar
lengths together, so each micro-batch is trimmed to its own longest row and little padding is
computed; the budget bounds activation memory. The packed forward (rows end to end,
`rlvr.models.packing`) computes no padding at all; each step takes the forward its cost model
prices lowest (`plan_update`). Gradients are accumulated across
micro-batches and the loss keeps the whole step's divisor (see `policy_loss`'s `num_tokens` /
`num_seqs`), so the update is the same as one pass over the whole batch.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr import algo
from rlvr.models.logprobs import completion_logprobs, completion_logprobs_shared_prompts
from rlvr.models.packing import completion_logprobs_packed
from rlvr.models.value import ValueModel
from rlvr.rollout.sampler import RolloutBatch
from rlvr.train.distributed import (
    DistContext,
    all_reduce_max,
    all_reduce_sum,
    full_tensor,
    lost_rank_as_error,
)
from rlvr.workers import balanced_shards, map_in_threads

NOTHING_TO_RUN = {"policy/clip_frac": 0.0, "policy/approx_kl": 0.0}
"""The policy/* metrics of a step in which no row carries a gradient."""


def token_budget_micro_batches(
    prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, max_tokens: int
) -> list[torch.Tensor]:
    """Row indices of each micro-batch; a micro-batch's padded size
    `rows x (max prompt length + max completion length)` stays within `max_tokens` unless one
    row alone exceeds it. `max_tokens <= 0`: one micro-batch of all rows, in their order."""
    units = [[i] for i in range(len(prompt_lengths))]
    return _sorted_units(units, prompt_lengths, completion_lengths, max_tokens)


def _sorted_units(
    units: list[list[int]],
    prompt_lengths: torch.Tensor,
    completion_lengths: torch.Tensor,
    max_tokens: int,
) -> list[torch.Tensor]:
    """Micro-batches of whole `units` (lists of row indices): units sorted by their longest row
    (stable), each added to the current micro-batch while its padded size
    `rows x (max prompt + max completion)` stays within `max_tokens`. `max_tokens <= 0`: one
    micro-batch of all rows, in their order."""
    prompt, completion = [int(x) for x in prompt_lengths], [int(x) for x in completion_lengths]
    if max_tokens <= 0:
        return [torch.arange(len(prompt))]
    units = sorted(units, key=lambda rows: -max(prompt[i] + completion[i] for i in rows))
    batches: list[list[int]] = []
    current: list[int] = []
    widest_prompt = widest_completion = 0
    for rows in units:
        p = max(widest_prompt, *(prompt[i] for i in rows))
        c = max(widest_completion, *(completion[i] for i in rows))
        if current and (len(current) + len(rows)) * (p + c) > max_tokens:
            batches.append(current)
            current = []
            p, c = max(prompt[i] for i in rows), max(completion[i] for i in rows)
        current.extend(rows)
        widest_prompt, widest_completion = p, c
    batches.append(current)
    return [torch.tensor(b, dtype=torch.long) for b in batches]


def trimmed_rows(
    rows: torch.Tensor,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    *per_token: torch.Tensor | None,
) -> tuple[torch.Tensor | None, ...]:
    """The rows `rows` of left-padded prompt tensors and right-padded [N, T] completion tensors,
    with the columns no selected row uses cut off. Returns (prompt_ids, prompt_mask,
    completion_mask, *per_token); `per_token` tensors may be None, or [N] (kept whole)."""
    p = int(prompt_mask[rows].sum(dim=1).max())
    c = int(completion_mask[rows].sum(dim=1).max())
    width = prompt_ids.shape[1]
    out: list[torch.Tensor | None] = [
        prompt_ids[rows][:, width - p :],
        prompt_mask[rows][:, width - p :],
        completion_mask[rows][:, :c],
    ]
    for t in per_token:
        if t is None:
            out.append(None)
        elif t.dim() == 1:
            out.append(t[rows])
        else:
            out.append(t[rows][:, :c])
    return tuple(out)


def group_micro_batches(
    group_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    completion_lengths: torch.Tensor,
    max_tokens: int,
) -> list[torch.Tensor]:
    """Like `token_budget_micro_batches`, but a group's rows are never split: micro-batches of
    whole groups (so that a group's prompt can be run once for all its rows). Groups are sorted
    by their longest row; a micro-batch's padded size `rows x (max prompt + max completion)`
    stays within `max_tokens` unless one group alone exceeds it. `max_tokens <= 0`: one
    micro-batch of all rows, in their order."""
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        members.setdefault(g, []).append(i)
    return _sorted_units(list(members.values()), prompt_lengths, completion_lengths, max_tokens)


def packed_micro_batches(lengths: torch.Tensor, max_tokens: int) -> list[torch.Tensor]:
    """Row indices of each micro-batch of the packed forward, whose cost is its real tokens:
    rows longest first, each into the first micro-batch it fits within `max_tokens`
    (first-fit decreasing); a row longer than the budget gets one of its own, never dropped.
    `max_tokens <= 0`: one micro-batch of all rows, in their order."""
    sizes = [int(x) for x in lengths]
    if max_tokens <= 0:
        return [torch.arange(len(sizes))]
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        k = next((b for b, left in enumerate(room) if sizes[i] <= left), None)
        if k is None:
            bins.append([i])
            room.append(max_tokens - sizes[i])
        else:
            bins[k].append(i)
            room[k] -= sizes[i]
    return [torch.tensor(b, dtype=torch.long) for b in bins]


FORWARDS = ("padded", "shared-prompt", "packed")
"""The loss's forward passes (`--grpo.forward`): rows padded to their micro-batch's widest,
each group's prompt once (`completion_logprobs_shared_prompts`), or rows end to end without
padding (`rlvr.models.packing`)."""

PACKED_TOKEN_COST = 1.1
"""A packed token's cost in padded tokens: gathers in and out of the per-length attention
batches (`benchmarks/bench_pack.py`: the packed forward and backward of a batch without
padding took 1.1x the padded one's, tiny model, this CPU)."""
BUCKET_COST_TOKENS = 40
"""The cost of each distinct segment length in a packed micro-batch (one more batched
attention call per layer, forward and backward), in padded tokens of the tiny model
(`benchmarks/bench_pack.py`); larger models spend more per token, so for them it overstates."""


def tokens_computed(
    forward: str,
    parts: list[torch.Tensor],
    group_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    completion_lengths: torch.Tensor,
) -> int:
    """Tokens a forward pass over `parts` runs, padding included: per micro-batch, padded:
    its rows at its widest prompt plus widest completion; shared-prompt: one prompt per
    group at its widest prompt plus its rows at its widest completion; packed: its rows' own
    tokens."""
    total = 0
    for part in parts:
        if forward == "packed":
            total += int((prompt_lengths[part] + completion_lengths[part]).sum())
            continue
        prompts = len(torch.unique(group_ids[part])) if forward == "shared-prompt" else len(part)
        total += prompts * int(prompt_lengths[part].max())
        total += len(part) * int(completion_lengths[part].max())
    return total


def tokens_needed(
    forward: str,
    parts: list[torch.Tensor],
    group_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    completion_lengths: torch.Tensor,
) -> int:
    """The tokens of `tokens_computed` that are not padding: the rows' own tokens, with one
    prompt per group of a micro-batch for the shared-prompt forward."""
    if forward != "shared-prompt":
        return sum(int((prompt_lengths[p] + completion_lengths[p]).sum()) for p in parts)
    total = 0
    for part in parts:  # a group's rows share one prompt, so one prompt length per group
        prompts = dict(zip(group_ids[part].tolist(), prompt_lengths[part].tolist()))
        total += sum(prompts.values()) + int(completion_lengths[part].sum())
    return total


def forward_cost(
    forward: str,
    parts: list[torch.Tensor],
    group_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    completion_lengths: torch.Tensor,
) -> float:
    """The cost model `plan_update` chooses by, in padded tokens: `tokens_computed`, with a
    packed token at `PACKED_TOKEN_COST` and each distinct row length of a packed micro-batch
    at `BUCKET_COST_TOKENS` more."""
    tokens = tokens_computed(forward, parts, group_ids, prompt_lengths, completion_lengths)
    if forward != "packed":
        return float(tokens)
    buckets = sum(len(torch.unique((prompt_lengths + completion_lengths)[p])) for p in parts)
    return PACKED_TOKEN_COST * tokens + BUCKET_COST_TOKENS * buckets


def plan_update(
    rows: torch.Tensor,
    group_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    completion_lengths: torch.Tensor,
    workers: int,
    max_tokens: int,
    forwards: tuple[str, ...] = ("padded",),
) -> tuple[list[list[torch.Tensor]], str]:
    """The update's micro-batches, per worker, for the batch rows `rows` (indices into the
    per-row tensors), and the forward they run: the rows (or, for the shared-prompt forward,
    whole groups) are shared among `workers` by tokens (`balanced_shards`) and each share is
    cut into micro-batches of at most `max_tokens` tokens (padded tokens; for the packed
    forward its real tokens).

    One plan is made for each forward in `forwards` (padded: rows sorted by length, least
    padding; shared-prompt: whole groups, each group's prompt run once, its completions
    padded to its longest; packed: no padding, first-fit decreasing) and the one the cost
    model (`forward_cost`) prices lowest is taken, the first of `forwards` on a tie.
    Returns (micro-batches of each worker, the forward); workers left without rows are
    dropped."""
    best: tuple[float, list[list[torch.Tensor]], str] | None = None
    for forward in forwards:
        shared = forward == "shared-prompt"
        if shared:
            unit_of_row = torch.unique(group_ids[rows], return_inverse=True)[1]
        else:
            unit_of_row = torch.arange(len(rows))
        num_units = int(unit_of_row.max()) + 1 if len(rows) else 0
        row_tokens = (prompt_lengths + completion_lengths)[rows].float()
        unit_tokens = torch.zeros(num_units).index_add_(0, unit_of_row, row_tokens)
        shards = []
        for units in balanced_shards(unit_tokens.tolist(), workers):
            mine = rows[torch.isin(unit_of_row, torch.tensor(units, dtype=torch.long))]
            lengths = (prompt_lengths[mine], completion_lengths[mine], max_tokens)
            if shared:
                split = group_micro_batches(group_ids[mine], *lengths)
            elif forward == "packed":
                split = packed_micro_batches(lengths[0] + lengths[1], max_tokens)
            else:
                split = token_budget_micro_batches(*lengths)
            shards.append([mine[part] for part in split if len(part) > 0])
        shards = [shard for shard in shards if shard]
        parts = [part for shard in shards for part in shard]
        cost = forward_cost(forward, parts, group_ids, prompt_lengths, completion_lengths)
        if best is None or cost < best[0]:
            best = (cost, shards, forward)
    assert best is not None
    return best[1], best[2]


def no_grad_forward(batch: RolloutBatch) -> str:
    """ "packed" or "padded", whichever the cost model prices lower for one pass over the
    whole batch (the reference's and pi_old's no-grad forwards, where packing is allowed)."""
    lengths = (batch.group_ids, batch.prompt_mask.sum(dim=1), batch.lengths)
    everything = [torch.arange(len(batch.group_ids))]
    packed = forward_cost("packed", everything, *lengths)
    return "packed" if packed < forward_cost("padded", everything, *lengths) else "padded"


LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
"""`algo.policy_loss` with the run's switches bound: `(logp, old_logp, advantages, mask, *,
ref_logp, num_tokens=None, num_seqs=None) -> (loss, metrics)`."""


@dataclass(frozen=True)
class UpdateWork:
    """One step's update, planned: each worker's micro-batches (row indices) and the divisors.

    `whole` means one micro-batch holding every row: the loss then divides by its own counts.
    Otherwise every micro-batch divides by the whole step's (`divisors`: the step's loss-mask
    tokens and rows), so that the summed gradient is that of one pass over the whole batch."""

    shards: list[list[torch.Tensor]]  # per worker, per micro-batch: [rows] long
    forward: str  # padded, shared-prompt (whole groups per micro-batch) or packed (FORWARDS)
    whole: bool
    divisors: dict[str, float]
    carried: int  # rows that carry a gradient
    carried_tokens: float  # their loss-mask tokens: the weight of the policy/* metrics
    rows: int  # rows of the step
    padding_frac: float = 0.0  # of the tokens the forward computes, the share that is padding

    @property
    def parts(self) -> list[torch.Tensor]:
        return [part for shard in self.shards for part in shard]

    @property
    def shared_prompts(self) -> bool:
        return self.forward == "shared-prompt"


def plan_update_work(
    batch: RolloutBatch,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    skip_zero_advantage: bool,
    workers: int,
    micro_batch_tokens: int,
    forwards: tuple[str, ...] = ("padded",),
) -> UpdateWork:
    """Plan the update of `batch`. With `skip_zero_advantage` (no KL term in the loss), rows
    whose advantages are all exactly 0 (every row of a zero-variance group; per-token
    advantages of a rollout correction or GAE: every token's) get no forward pass: they add
    nothing to the loss or its gradient. The rest are shared
    among `workers` by tokens and cut into micro-batches of at most `micro_batch_tokens`
    tokens (0: one per worker), for the forward of `forwards` the cost model prices lowest
    (`plan_update`)."""
    n = len(advantages)
    carrying = torch.arange(n)
    if skip_zero_advantage:  # per row, or per token ([N, T]: GAE, a rollout correction)
        carrying = (advantages != 0).reshape(n, -1).any(dim=1).nonzero().squeeze(1).cpu()
    # planning is host work: the per-row lengths on the CPU, the plan's row indices too
    lengths = (batch.group_ids.cpu(), batch.prompt_mask.sum(dim=1).cpu(), batch.lengths.cpu())
    shards, forward = plan_update(
        carrying, lengths[0], lengths[1], lengths[2], workers, micro_batch_tokens, forwards
    )
    parts = [part for shard in shards for part in shard]
    computed = tokens_computed(forward, parts, *lengths)
    needed = tokens_needed(forward, parts, *lengths)
    whole = sum(len(shard) for shard in shards) == 1 and len(carrying) == n
    divisors = (
        {} if whole else {"num_tokens": max(1.0, loss_mask.sum().item()), "num_seqs": float(n)}
    )
    return UpdateWork(
        shards=shards,
        forward=forward,
        whole=whole,
        divisors=divisors,
        carried=len(carrying),
        carried_tokens=max(1.0, loss_mask[carrying].sum().item()),
        rows=n,
        padding_frac=1.0 - needed / computed if computed else 0.0,
    )


@dataclass
class UpdateResult:
    """What `accumulate_gradients` measured: the summed loss, the token-weighted policy/*
    metrics, the wall seconds split into forward and backward, and the largest
    `|logp - old_logp|` over the pass's loss-mask tokens (the same on every rank: the
    sampler/learner agreement check's input, `train/agreement.py`)."""

    loss: float
    metrics: dict[str, float]
    forward_s: float = 0.0
    backward_s: float = 0.0
    max_abs_log_ratio: float = 0.0


def accumulate_gradients(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    work: UpdateWork,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
    loss_fn: LossFn,
    temperature: float,
    workers: int,
    logprob_chunk_tokens: int = 0,
) -> UpdateResult:
    """Set every trainable parameter's `.grad` to the gradient of the step's loss, run as
    `work` plans it: each worker's micro-batches in its own thread, gradients summed per worker
    and then across workers in worker order (deterministic). With nothing to run, the gradients
    are zeros (the optimizer still steps: Adam's moments decay). The log-probs' head runs
    `logprob_chunk_tokens` completion tokens at a time (0: whole logits; `completion_logprobs`).
    On torch.distributed ranks `rank_gradients` runs this rank's share instead."""
    params = [p for p in policy.parameters() if p.requires_grad]
    if not work.parts:
        for p in params:
            p.grad = torch.zeros_like(p)
        return UpdateResult(0.0, dict(NOTHING_TO_RUN))

    def shard_gradients(shard: list[torch.Tensor]) -> tuple[list, UpdateResult]:
        grads, result = None, UpdateResult(0.0, {})
        for part in shard:
            t_fwd = time.perf_counter()
            loss, metrics, mask, deviation = _part_loss(
                policy,
                batch,
                part,
                not work.whole,
                (advantages, loss_mask, ref_logp),
                loss_fn,
                temperature,
                work.divisors,
                work.forward,
                logprob_chunk_tokens,
            )
            t_bwd = time.perf_counter()
            part_grads = torch.autograd.grad(loss, params, allow_unused=True)
            result.forward_s += t_bwd - t_fwd
            result.backward_s += time.perf_counter() - t_bwd
            grads = part_grads if grads is None else [_add(a, b) for a, b in zip(grads, part_grads)]
            _record(result, loss.item(), metrics, mask.sum().item() / work.carried_tokens)
            result.max_abs_log_ratio = max(result.max_abs_log_ratio, deviation)
        return grads, result

    t0 = time.perf_counter()
    results = map_in_threads(shard_gradients, work.shards, workers)
    wall = time.perf_counter() - t0
    for p, *shard_grads in zip(params, *[grads for grads, _ in results]):
        p.grad = _sum_grads(p, shard_grads)
    total = UpdateResult(sum(r.loss for _, r in results), {})
    total.max_abs_log_ratio = max(r.max_abs_log_ratio for _, r in results)
    for _, r in results:
        for key, value in r.metrics.items():
            total.metrics[key] = total.metrics.get(key, 0.0) + value
    # the workers overlap: the wall time is split in the ratio of their summed parts
    fwd_s, bwd_s = sum(r.forward_s for _, r in results), sum(r.backward_s for _, r in results)
    total.forward_s = wall * fwd_s / max(fwd_s + bwd_s, 1e-12)
    total.backward_s = wall * bwd_s / max(fwd_s + bwd_s, 1e-12)
    return total


def rank_gradients(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    work: UpdateWork,
    per_token: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    loss_fn: LossFn,
    temperature: float,
    ctx: DistContext,
) -> UpdateResult:
    """`accumulate_gradients` on torch.distributed ranks: the same `.grad` (now each rank's
    shard of it) and the same loss and metrics, identical on every rank. `per_token` is
    (advantages, loss mask, reference log-probs).

    Every rank holds the whole batch and the same `work`, planned with one worker per rank:
    rank r runs `work.shards[r]`, a micro-batch at a time, through `loss.backward()` (FSDP2's
    hooks reduce-scatter the gradient into each rank's shard, summed over the ranks: the policy
    is FSDP2-wrapped with `sum_gradients`). Each micro-batch's loss keeps the whole batch's divisors
    (`work.divisors`, computed from the whole batch's loss mask: global, not the rank's), so
    the sum over micro-batches and ranks is the gradient of one pass over the batch.

    FSDP's collectives must match across ranks, so every rank runs as many passes as the rank
    with the most micro-batches (at least one); a rank with fewer (or no rows) runs zero-weight
    passes: a real one-row micro-batch whose loss is multiplied by 0.0. The loss and the
    token-weighted policy/* metrics are summed over the ranks (`all_reduce_sum`); their weights
    divide by `work.carried_tokens`, the whole batch's carrying tokens. The forward passes take
    whole logits with a prompt per row: the chunked head and the shared-prompt forward call the
    decoder outside the root module's FSDP hooks (`FSDP2Strategy.forwards` plans so)."""
    assert not work.shared_prompts, "plan an FSDP2 update without the shared-prompt forward"
    mine = work.shards[ctx.rank] if ctx.rank < len(work.shards) else []
    passes = max([1] + [len(shard) for shard in work.shards])
    filler = per_token[1].sum(dim=1).argmax().view(1)  # a row with loss tokens: a finite loss
    result = UpdateResult(0.0, {})
    with lost_rank_as_error(ctx, "the policy update"):
        for i in range(passes):
            real = i < len(mine)
            t_fwd = time.perf_counter()
            loss, metrics, mask, deviation = _part_loss(
                policy,
                batch,
                mine[i] if real else filler,
                not (real and work.whole),
                per_token,
                loss_fn,
                temperature,
                work.divisors or {"num_tokens": 1.0, "num_seqs": 1.0},  # finite on one row
                work.forward,
            )
            t_bwd = time.perf_counter()
            (loss if real else loss * 0.0).backward()
            result.forward_s += t_bwd - t_fwd
            result.backward_s += time.perf_counter() - t_bwd
            if real:
                _record(result, loss.item(), metrics, mask.sum().item() / work.carried_tokens)
                result.max_abs_log_ratio = max(result.max_abs_log_ratio, deviation)
            else:  # the same keys on every rank for the all-reduce, adding nothing
                _record(result, 0.0, dict.fromkeys(metrics, 0.0), 0.0)
    for p in policy.parameters():
        if p.requires_grad and p.grad is None:  # as accumulate_gradients: zeros, not None
            p.grad = torch.zeros_like(p)
    if not work.parts:
        return UpdateResult(0.0, dict(NOTHING_TO_RUN), result.forward_s, result.backward_s)
    summed = all_reduce_sum({"loss": result.loss, **result.metrics}, ctx)
    loss = summed.pop("loss")
    deviation = all_reduce_max(result.max_abs_log_ratio, ctx)
    return UpdateResult(loss, summed, result.forward_s, result.backward_s, deviation)


def optimizer_step(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float, loss: float
) -> tuple[torch.Tensor, bool]:
    """Clip the gradient's global norm to `grad_clip` and step; returns (the norm before
    clipping, whether the optimizer stepped). A NaN/Inf loss or norm would poison the weights
    and Adam's moments: the step is skipped and the gradients cleared (the loop counts such
    steps and stops after `max_nonfinite_steps` in a row). On FSDP2's gradient shards the norm
    is the global one, the same on every rank, and so with the global `loss` is the decision to
    skip."""
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
    grad_norm = full_tensor(grad_norm)  # FSDP2: the norm over every rank's shards
    if not (math.isfinite(loss) and torch.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, False
    optimizer.step()
    return grad_norm, True


def critic_step(
    critic: ValueModel,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    loss_mask: torch.Tensor,
    value_clip: float,
    grad_clip: float,
) -> dict[str, float]:
    """One clipped value-loss step of PPO's critic on the whole batch; returns its metrics."""
    loss, metrics = algo.value_loss(
        critic(*batch.model_inputs()), old_values, returns, loss_mask, value_clip
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(critic.parameters(), grad_clip)
    optimizer.step()
    return metrics


def _part_loss(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    part: torch.Tensor,
    trim: bool,
    per_token: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    loss_fn: LossFn,
    temperature: float,
    divisors: dict[str, float],
    forward: str = "padded",
    logprob_chunk_tokens: int = 0,
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor, float]:
    """(loss, metrics, loss mask, largest |logp - old_logp| on its loss-mask tokens) of
    micro-batch `part`; `per_token` is (advantages, loss mask,
    reference log-probs), cut to the micro-batch's rows and columns with the sampling
    log-probs (`_micro_batch`). The loss divides by `divisors` (empty: its own counts).

    The metrics add `policy/entropy`: the policy's token entropy (nats, of the distribution
    the loss scores, at `temperature`) from the loss's own forward pass, averaged over the
    micro-batch's loss-mask tokens (divided by their count); `_record` then weights it by
    those tokens, so a step's value is the mean over the loss-mask tokens of the rows that
    carry a gradient (rows the plan skips have no forward pass)."""
    cols, (old, adv, mask, ref) = _micro_batch(batch, part, trim, batch.logprobs, *per_token)
    if forward == "shared-prompt":  # each group's prompt runs once; same values and gradients
        logp, entropy = completion_logprobs_shared_prompts(
            policy, *cols, batch.group_ids[part], temperature, logprob_chunk_tokens, True
        )
    else:  # padded, or the rows end to end (packed): same values and gradients
        run = completion_logprobs_packed if forward == "packed" else completion_logprobs
        logp, entropy = run(policy, *cols, temperature, logprob_chunk_tokens, True)
    loss, metrics = loss_fn(logp, old, adv, mask, ref_logp=ref, **divisors)
    metrics["policy/entropy"] = algo.masked_mean(entropy, mask).item()
    return loss, metrics, mask, _max_abs_deviation(logp, old, mask)


@torch.no_grad()
def _max_abs_deviation(logp: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> float:
    """max |logp - old| over the tokens where `mask` is nonzero (0 with none; NaN stays NaN:
    padding's values are never read)."""
    gap = torch.where(mask != 0, (logp.detach() - old).abs(), torch.zeros((), device=old.device))
    return gap.max().item() if gap.numel() else 0.0


def _record(result: UpdateResult, loss: float, metrics: dict[str, float], weight: float) -> None:
    """Add one micro-batch's loss, and its metrics times `weight` (its share of the carrying
    tokens: the metrics are token-weighted over the rows that carry), into `result`."""
    result.loss += loss
    for key, value in metrics.items():
        result.metrics[key] = result.metrics.get(key, 0.0) + weight * value


def _add(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else a + b


def _sum_grads(param: torch.Tensor, grads: list[torch.Tensor | None]) -> torch.Tensor:
    """The workers' gradients of `param` summed in worker order (zeros if none reached it)."""
    total = functools.reduce(_add, grads, None)
    return total if total is not None else torch.zeros_like(param)


def _micro_batch(
    batch: RolloutBatch, rows: torch.Tensor, trim: bool, *per_token: torch.Tensor | None
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
    """(loss-forward columns, per-token tensors) of micro-batch `rows`; untrimmed (the whole
    batch as it is) when there is a single micro-batch."""
    if not trim:
        return batch.model_inputs(), per_token
    prompt_ids, prompt_mask, completion_mask, completion_ids, *rest = trimmed_rows(
        rows,
        batch.prompt_ids,
        batch.prompt_mask,
        batch.completion_mask,
        batch.completion_ids,
        *per_token,
    )
    return (prompt_ids, prompt_mask, completion_ids, completion_mask), tuple(rest)
