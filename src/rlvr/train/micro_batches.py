"""Split a step's rollouts into micro-batches by a padded-token budget.

A forward pass over a padded batch costs rows x (longest prompt + longest completion) tokens.
Sorting rows by length before splitting puts similar lengths together, so each micro-batch is
trimmed to its own longest row and little padding is computed; the budget bounds activation
memory. Gradients are accumulated across micro-batches and the loss keeps the whole step's
divisor (see `policy_loss`'s `num_tokens` / `num_seqs`), so the update is the same as one
pass over the whole batch.
"""

from __future__ import annotations

import torch

from rlvr.workers import balanced_shards


def token_budget_micro_batches(
    prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, max_tokens: int
) -> list[torch.Tensor]:
    """Row indices of each micro-batch; a micro-batch's padded size
    `rows x (max prompt length + max completion length)` stays within `max_tokens` unless one
    row alone exceeds it. `max_tokens <= 0`: one micro-batch of all rows, in their order."""
    units = [[i] for i in range(len(prompt_lengths))]
    return _pack(units, prompt_lengths, completion_lengths, max_tokens)


def _pack(
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
    return _pack(list(members.values()), prompt_lengths, completion_lengths, max_tokens)


def tokens_to_run(
    parts: list[torch.Tensor],
    group_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    completion_lengths: torch.Tensor,
    shared_prompts: bool,
) -> int:
    """Padded tokens a forward pass over `parts` runs: per micro-batch, its prompts (one per
    row, or one per group when `shared_prompts`) at its widest prompt, plus its rows at its
    widest completion."""
    total = 0
    for part in parts:
        prompts = len(torch.unique(group_ids[part])) if shared_prompts else len(part)
        total += prompts * int(prompt_lengths[part].max())
        total += len(part) * int(completion_lengths[part].max())
    return total


def plan_update(
    rows: torch.Tensor,
    group_ids: torch.Tensor,
    prompt_lengths: torch.Tensor,
    completion_lengths: torch.Tensor,
    workers: int,
    max_tokens: int,
    share_prompts: bool,
) -> tuple[list[list[torch.Tensor]], bool]:
    """The update's micro-batches, per worker, for the batch rows `rows` (indices into the
    per-row tensors): the rows are shared among `workers` by tokens (`balanced_shards`) and
    each share is cut into micro-batches of at most `max_tokens` padded tokens.

    With `share_prompts` two plans are made: by row (sorted by length: least padding) and by
    whole group (each group's prompt run once, but a group's completions pad to its longest);
    the one with fewer `tokens_to_run` is taken. Returns (micro-batches of each worker, whether
    the plan shares prompts); workers left without rows are dropped."""
    best: tuple[int, list[list[torch.Tensor]], bool] | None = None
    for shared in [False, True] if share_prompts else [False]:
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
            else:
                split = token_budget_micro_batches(*lengths)
            shards.append([mine[part] for part in split if len(part) > 0])
        shards = [shard for shard in shards if shard]
        parts = [part for shard in shards for part in shard]
        cost = tokens_to_run(parts, group_ids, prompt_lengths, completion_lengths, shared)
        if best is None or cost < best[0]:
            best = (cost, shards, shared)
    assert best is not None
    return best[1], best[2]
