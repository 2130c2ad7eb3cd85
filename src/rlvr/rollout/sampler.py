"""Batched sampling of G completions per prompt with a KV cache (Hugging Face models).

One prefill over the left-padded prompts, then one cached forward per new token. A completion
ends at its first EOS (the EOS is part of the completion and of its mask: the model must learn
to stop); one that reaches `max_new_tokens` without EOS is flagged `truncated`. The log-prob of
each sampled token under the sampling distribution (logits / temperature) is kept, so that an
on-policy update needs no second forward pass for the old log-probs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.devices import generator_on
from rlvr.models.logprobs import cache_argument, position_ids_from_mask
from rlvr.rollout.kv_cache import EpisodeKV, decode_cache, full_attention
from rlvr.workers import map_in_threads


@dataclass
class RolloutBatch:
    """G completions for each of B prompts, flattened to N = B*G rows (group-major)."""

    prompt_ids: torch.Tensor  # [N, P] long, left-padded with the pad id
    prompt_mask: torch.Tensor  # [N, P] long, 1 on prompt tokens
    completion_ids: torch.Tensor  # [N, T] long, right-padded with the pad id after EOS
    completion_mask: torch.Tensor  # [N, T] float, 1 up to and including EOS (attention)
    logprobs: torch.Tensor  # [N, T] float, sampling log-probs, 0 where the mask is 0
    # (NaN on an episode's env tokens, where `action_mask` is 0 and `completion_mask` 1)
    truncated: torch.Tensor  # [N] bool, True where no EOS came within max_new_tokens
    group_ids: torch.Tensor  # [N] long, index of the prompt each row answers
    completions: list[str]  # [N] decoded completion text, EOS and padding removed
    rows: list[dict[str, Any]] = field(default_factory=list)  # [R] task rows, when attached
    row_index: torch.Tensor | None = None  # [N] long, index into `rows` of each completion
    action_mask: torch.Tensor | None = None  # [N, T] float, 1 on sampled tokens (episodes)
    """Multi-turn episodes (`rlvr.rollout.episodes`): 1 on the tokens the policy sampled, 0 on
    the environment's, tools' and chat template's tokens between turns (which
    `completion_mask` covers, for attention) and on padding. None for one-turn rollouts, whose
    every completion token was sampled: `policy_mask` is then `completion_mask`."""

    def __post_init__(self) -> None:
        if self.row_index is None:  # an engine's batch: completion i answers prompt group i
            self.row_index = self.group_ids.clone()

    @property
    def lengths(self) -> torch.Tensor:  # [N] completion tokens, EOS (and env tokens) included
        return self.completion_mask.sum(dim=1)

    @property
    def policy_mask(self) -> torch.Tensor:
        """[N, T] 1 on the tokens the policy sampled: what the loss, KL, entropy, importance
        ratios and every divisor count (`action_mask`, or `completion_mask` for one turn)."""
        return self.completion_mask if self.action_mask is None else self.action_mask

    def model_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(prompt_ids, prompt_mask, completion_ids, completion_mask): a loss forward's input."""
        return self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask

    def row_of(self, i: int) -> dict[str, Any]:
        """The task row completion `i` answers (rows must be attached)."""
        return self.rows[int(self.row_index[i])]


@torch.no_grad()
def sample_completions(
    model: torch.nn.Module,
    tokenizer,
    prompts: list[str],
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None = None,
    drop_finished: bool = True,
    share_prompt_cache: bool = True,
    preallocate_cache: bool = True,
    workers: int = 1,
) -> RolloutBatch:
    """Sample `num_samples` completions for each prompt; `temperature == 0` means greedy.

    Rows are ordered group-major: rows `i*num_samples ... (i+1)*num_samples - 1` answer
    `prompts[i]`. Two savings, each switchable so that benchmarks and tests can compare:
    `share_prompt_cache` runs the prefill once per prompt and copies its KV cache to the
    prompt's G rows; `drop_finished` takes a row out of the decode batch at its EOS, so a
    finished row costs no further forward passes (otherwise it decodes padding until the
    longest row ends, as `generate` does); `preallocate_cache` writes each token's keys and
    values in place (`rollout.kv_cache`) instead of copying the cache every token.

    `workers` > 1 splits the prompts into that many consecutive shards, sampled side by side
    by Python threads with one torch thread each (`rlvr.workers`); each shard draws from its
    own generator, seeded from `generator`, so a run stays reproducible.
    """
    if num_samples < 1 or max_new_tokens < 1:
        raise ValueError("num_samples and max_new_tokens must be >= 1")
    if workers > 1 and len(prompts) > 1:

        def sample_shard(shard: list[str], shard_generator: torch.Generator) -> RolloutBatch:
            return sample_completions(
                model,
                tokenizer,
                shard,
                num_samples,
                max_new_tokens,
                temperature,
                shard_generator,
                drop_finished,
                share_prompt_cache,
                preallocate_cache,
            )

        return _sample_in_shards(
            sample_shard, model, tokenizer.pad_token_id, prompts, generator, workers
        )
    device = next(model.parameters()).device
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    unique_ids, unique_mask = encoded["input_ids"].to(device), encoded["attention_mask"].to(device)
    prompt_ids = unique_ids.repeat_interleave(num_samples, dim=0)
    prompt_mask = unique_mask.repeat_interleave(num_samples, dim=0)
    completion_ids, sampled_logprobs = _decode(
        model,
        unique_ids,
        unique_mask,
        num_samples,
        max_new_tokens,
        temperature,
        generator,
        (tokenizer.eos_token_id, tokenizer.pad_token_id),
        drop_finished,
        share_prompt_cache,
        preallocate_cache,
    )
    return rollout_batch(
        tokenizer,
        prompt_ids,
        prompt_mask,
        completion_ids,
        sampled_logprobs,
        num_samples,
    )


@torch.no_grad()
def sample_token_ids(
    model: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None,
    eos_id: int,
    pad_id: int,
    kept: EpisodeKV | None = None,
    keys: Sequence[Hashable] | None = None,
) -> list[tuple[list[int], list[float]]]:
    """One sample per prompt given as token ids (token in, token out): each row's sampled ids
    up to and including its first EOS (all `max_new_tokens` of them when none came) and their
    sampling log-probs. The multi-turn loop (`rlvr.rollout.episodes`) calls this once per turn
    with each running episode's ids so far.

    With `kept` and one key per prompt (an episode's, the same on each of its turns), each
    row's keys and values are kept after its turn and the next call prefills only the tokens
    after them: the conversation is not run again every turn. Models whose cache is not plain
    full attention (sliding windows, linear attention) run the whole prompt each turn."""
    if not full_attention(model):
        device = next(model.parameters()).device
        prompt_ids, prompt_mask = padded_rows(prompts, pad_id, torch.long, left=True)
        ids, logprobs = _decode(
            model,
            prompt_ids.to(device),
            prompt_mask.to(device),
            1,
            max_new_tokens,
            temperature,
            generator,
            (eos_id, pad_id),
        )
    else:  # keeping nothing (no keys) still prefills a shared prompt once
        ids, logprobs = _decode_kept(
            model,
            prompts,
            keys if keys is not None else list(range(len(prompts))),
            kept if keys is not None else None,
            max_new_tokens,
            temperature,
            generator,
            (eos_id, pad_id),
        )
    out = []
    for row_ids, row_logprobs in zip(ids.tolist(), logprobs.tolist()):
        k = row_ids.index(eos_id) + 1 if eos_id in row_ids else len(row_ids)
        out.append((row_ids[:k], row_logprobs[:k]))
    return out


def padded_rows(
    rows: list[list[int]] | list[list[float]], value: float, dtype: torch.dtype, left: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` as one [len(rows), max(1, longest row)] tensor padded with `value` (on the left
    when `left`), and its long mask, 1 on the rows' own entries."""
    width = max(1, max((len(r) for r in rows), default=0))
    out = torch.full((len(rows), width), value, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        out[i, span] = torch.tensor(row, dtype=dtype)
        mask[i, span] = 1
    return out, mask


def _decode_kept(
    model: torch.nn.Module,
    prompts: list[list[int]],
    keys: Sequence[Hashable],
    kept: EpisodeKV | None,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None,
    special: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_decode` for one row per prompt, starting from each row's kept keys and values: the
    cache holds the kept positions (left-padded), the prefill runs only the new tokens
    (left-padded too, so the mask may have holes between them: position ids count real
    tokens only), and each row's positions are kept again when it leaves the decode batch.
    A first turn's rows that share a prompt (a group's opening) are prefilled once."""
    device = next(model.parameters()).device
    if kept is not None:
        kept.retain(keys)
    lengths = [kept.cached_length(k, p) if kept else 0 for k, p in zip(keys, prompts)]
    # rows with nothing kept and the same prompt (a group's first turn) are prefilled once
    distinct: dict[tuple[int, ...], int] = {}
    source = [] if any(lengths) else [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    shared = bool(source) and len(distinct) < len(prompts)
    rows = [list(p) for p in distinct] if shared else [p[c:] for p, c in zip(prompts, lengths)]
    new_ids, new_mask = padded_rows(rows, special[1], torch.long, left=True)
    capacity = max(lengths) + new_ids.shape[1] + max_new_tokens
    if kept is not None and any(lengths):
        cache, past_mask = kept.cache(keys, lengths, capacity)
    else:
        cache = decode_cache(model, capacity)
        past_mask = torch.zeros((len(rows), 0), dtype=torch.long, device=device)
    new_ids, new_mask = new_ids.to(device), new_mask.to(device)
    mask = torch.cat([past_mask.to(device), new_mask], dim=1)
    generator = generator_on(generator, device)
    was_training = model.training
    model.eval()
    try:
        out = model(
            input_ids=new_ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask)[:, past_mask.shape[1] :],
            **cache_argument(model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :].float()
        if shared:  # each row takes its prompt's keys, values, mask and next-token logits
            index = torch.tensor(source, dtype=torch.long, device=device)
            for layer in cache.layers:
                layer.batch_gather(index)
            mask, logits = mask[index], logits[index]

        def leave(rows: torch.Tensor, cache_rows: torch.Tensor, at: torch.Tensor | None) -> None:
            length = cache.layers[0].get_seq_length()
            everything = torch.ones(length, dtype=torch.long, device=device)
            for row, cache_row in zip(rows.tolist(), cache_rows.tolist()):
                real = at[cache_row] if at is not None else everything
                kept.keep(keys[row], cache, cache_row, real)  # type: ignore[union-attr]

        # no padding and no holes (a first turn of equal openings): no mask, SDPA's causal path
        attention = None if bool(mask.all()) else mask

        ids, logprobs = _decode_steps(
            model,
            cache,
            logits,
            attention,
            mask.sum(dim=1, keepdim=True),
            max_new_tokens,
            temperature,
            generator,
            special,
            on_leave=leave if kept is not None else None,
        )
    finally:
        model.train(was_training)
    if kept is not None:  # the ids each kept row's keys and values were computed from
        for key, prompt, sampled in zip(keys, prompts, ids.tolist()):
            entry = kept.kept[key]
            entry.ids = (prompt + sampled)[: entry.length]
    return ids, logprobs


def _decode(
    model: torch.nn.Module,
    unique_ids: torch.Tensor,
    unique_mask: torch.Tensor,
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None,
    special: tuple[int, int],
    drop_finished: bool = True,
    share_prompt_cache: bool = True,
    preallocate_cache: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(completion ids [N, S], sampling log-probs [N, S]) of `num_samples` rows per prompt of
    the left-padded `unique_ids` [B, P] (N = B * num_samples, S <= `max_new_tokens` the steps
    run); `special` is (EOS id, pad id): a row's tokens after its EOS are the pad id, their
    log-probs 0."""
    device = unique_ids.device
    generator = generator_on(generator, device)  # the host generator seeds a device one
    prompt_ids = unique_ids.repeat_interleave(num_samples, dim=0)
    prompt_mask = unique_mask.repeat_interleave(num_samples, dim=0)

    was_training = model.training
    model.eval()
    # --- prefill: each prompt once; its cache and next-token logits serve its G rows --------
    cache = decode_cache(model, prompt_ids.shape[1] + max_new_tokens, preallocate_cache)
    shared = share_prompt_cache and num_samples > 1
    prefill_ids, prefill_mask = (unique_ids, unique_mask) if shared else (prompt_ids, prompt_mask)
    out = model(
        input_ids=prefill_ids,
        attention_mask=prefill_mask,
        position_ids=position_ids_from_mask(prefill_mask),
        **cache_argument(model, cache),
        use_cache=True,
        logits_to_keep=1,
    )
    logits = out.logits[:, -1, :].float()
    if shared:
        cache.batch_repeat_interleave(num_samples)
        logits = logits.repeat_interleave(num_samples, dim=0)

    # without left padding or kept finished rows, every cached position is visible: no mask
    needs_mask = not drop_finished or bool((prompt_mask == 0).any())
    try:
        return _decode_steps(
            model,
            cache,
            logits,
            prompt_mask if needs_mask else None,
            prompt_mask.sum(dim=1, keepdim=True),
            max_new_tokens,
            temperature,
            generator,
            special,
            drop_finished,
        )
    finally:
        model.train(was_training)


def _decode_steps(
    model: torch.nn.Module,
    cache: Any,
    logits: torch.Tensor,
    attention_mask: torch.Tensor | None,
    next_position: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None,
    special: tuple[int, int],
    drop_finished: bool = True,
    on_leave: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode loop after a prefill: one cached forward per token over the rows still
    running. `logits` [N, V] are the prefill's next-token logits, `attention_mask` [N, L] the
    cache's (None: every cached position visible), `next_position` [N, 1] each row's next
    position id. `on_leave(rows, cache_rows, mask)` is told, before finished rows leave the
    cache and for the rows left at the end, which rows (indices into N) sit at which cache
    rows, with the cache's mask [A, L] (the cache then holds every sampled token but the last
    one drawn). Returns (ids [N, S], log-probs [N, S]) as `_decode` does."""
    device = logits.device
    n = logits.shape[0]
    eos_id, pad_id = special
    active = torch.arange(n, device=device)  # the decode batch's rows, in cache order
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    completion_ids = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
    sampled_logprobs = torch.zeros((n, max_new_tokens), device=device)
    steps = 0
    for t in range(max_new_tokens):
        token, logp = draw_tokens(logits, temperature, generator)
        done = finished[active]
        token, logp = token.masked_fill(done, pad_id), logp.masked_fill(done, 0.0)
        completion_ids[active, t], sampled_logprobs[active, t] = token, logp
        steps = t + 1
        finished[active] = done | (token == eos_id)
        running = (~finished[active]).nonzero().squeeze(1)
        if len(running) == 0 or steps == max_new_tokens:
            break
        if drop_finished and len(running) < len(active):
            if on_leave is not None:
                leaving = finished[active].nonzero().squeeze(1)
                on_leave(active[leaving], leaving, attention_mask)
            cache.batch_select_indices(running)
            active, token, next_position = active[running], token[running], next_position[running]
            if attention_mask is not None:
                attention_mask = attention_mask[running]
        if attention_mask is not None:
            new_column = (~finished[active]).long()[:, None]
            attention_mask = torch.cat([attention_mask, new_column], dim=1)
        out = model(
            input_ids=token[:, None],
            attention_mask=attention_mask,
            position_ids=next_position,
            **cache_argument(model, cache),
            use_cache=True,
        )
        logits = out.logits[:, -1, :].float()
        next_position = next_position + 1
    if on_leave is not None:
        on_leave(active, torch.arange(len(active), device=device), attention_mask)
    return completion_ids[:, :steps], sampled_logprobs[:, :steps]


def _sample_in_shards(
    sample_shard: Callable[[list[str], torch.Generator], RolloutBatch],
    model: torch.nn.Module,
    pad_id: int,
    prompts: list[str],
    generator: torch.Generator | None,
    workers: int,
) -> RolloutBatch:
    """`sample_shard` over consecutive shards of `prompts`, one thread each, each with its own
    generator seeded from `generator`; stacked back in prompt order."""
    k = min(workers, len(prompts))
    bounds = [round(i * len(prompts) / k) for i in range(k + 1)]
    on = generator.device if generator is not None else "cpu"
    seeds = torch.randint(0, 2**62, (k,), generator=generator, device=on).tolist()
    device = next(model.parameters()).device

    def shard(i: int) -> RolloutBatch:
        shard_generator = torch.Generator(device).manual_seed(seeds[i])
        return sample_shard(prompts[bounds[i] : bounds[i + 1]], shard_generator)

    was_training = model.training
    model.eval()  # once, here: the shards must not toggle the mode under each other
    try:
        batches = map_in_threads(shard, list(range(k)), k)
    finally:
        model.train(was_training)
    return concat_batches(batches, pad_id)


def rollout_batch(
    tokenizer,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    sampled_logprobs: torch.Tensor,
    num_samples: int,
    num_generated: torch.Tensor | None = None,
) -> RolloutBatch:
    """A RolloutBatch from sampled tokens [N, T] (anything after a row's first EOS is ignored):
    masks end at the first EOS, rows without one are flagged truncated, text is decoded. Any
    engine (in process, vLLM, another machine) returns its samples through this.
    `num_generated` [N] says how many tokens each row really has (default: all T)."""
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    is_eos = completion_ids == eos_id
    # 1 up to and including the first EOS; everything after it is padding
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    if num_generated is not None:
        columns = torch.arange(completion_ids.shape[1], device=completion_ids.device)
        after_eos = after_eos | (columns[None, :] >= num_generated[:, None])
    completion_mask = (~after_eos).float()
    truncated = ~is_eos.any(dim=1)
    completion_ids = completion_ids.masked_fill(after_eos, pad_id)
    # decode up to (not including) EOS; other special tokens such as <think> stay in the text
    lengths = completion_mask.sum(dim=1).long() - (~truncated).long()
    texts = [tokenizer.decode(row[:k].tolist()) for row, k in zip(completion_ids, lengths)]
    n = completion_ids.shape[0]
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=torch.where(completion_mask != 0, sampled_logprobs, 0.0),  # 0 on padding
        truncated=truncated,
        group_ids=torch.arange(n // num_samples, device=completion_ids.device).repeat_interleave(
            num_samples
        ),
        completions=texts,
    )


def draw_tokens(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from `logits` [A, V] and its log-prob under the sampling distribution
    (logits / temperature; greedy argmax when `temperature == 0`)."""
    if temperature > 0:
        log_dist = torch.log_softmax(logits / temperature, dim=-1)
        token = torch.multinomial(log_dist.exp(), 1, generator=generator).squeeze(1)
    else:
        log_dist = torch.log_softmax(logits, dim=-1)
        token = log_dist.argmax(dim=-1)
    return token, log_dist.gather(1, token[:, None]).squeeze(1)


def select_rows(batch: RolloutBatch, rows: torch.Tensor) -> RolloutBatch:
    """The rollouts at indices `rows` (a long tensor), in that order."""
    idx = rows.tolist()
    return RolloutBatch(
        prompt_ids=batch.prompt_ids[rows],
        prompt_mask=batch.prompt_mask[rows],
        completion_ids=batch.completion_ids[rows],
        completion_mask=batch.completion_mask[rows],
        logprobs=batch.logprobs[rows],
        truncated=batch.truncated[rows],
        group_ids=batch.group_ids[rows],
        completions=[batch.completions[i] for i in idx],
        rows=batch.rows,
        row_index=batch.row_index[rows],
        action_mask=None if batch.action_mask is None else batch.action_mask[rows],
    )


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Stack rollouts of several sampling calls: prompts re-padded on the left, completions on
    the right; group ids are offset so that groups of different calls stay distinct, and the
    calls' task rows are concatenated with `row_index` offset to match (batches without rows
    offset it like the group ids)."""

    def pad(tensors: list[torch.Tensor], value: float, left: bool) -> torch.Tensor:
        width = max(t.shape[1] for t in tensors)
        out = []
        for t in tensors:
            extra = t.new_full((t.shape[0], width - t.shape[1]), value)
            out.append(torch.cat([extra, t] if left else [t, extra], dim=1))
        return torch.cat(out, dim=0)

    offsets, group_ids, row_offset, row_index = 0, [], 0, []
    for b in batches:
        group_ids.append(b.group_ids + offsets)
        row_index.append(b.row_index + row_offset)
        groups = int(b.group_ids.max()) + 1 if len(b.group_ids) else 0
        offsets += groups
        row_offset += len(b.rows) if b.rows else groups
    return RolloutBatch(
        prompt_ids=pad([b.prompt_ids for b in batches], pad_id, left=True),
        prompt_mask=pad([b.prompt_mask for b in batches], 0, left=True),
        completion_ids=pad([b.completion_ids for b in batches], pad_id, left=False),
        completion_mask=pad([b.completion_mask for b in batches], 0.0, left=False),
        logprobs=pad([b.logprobs for b in batches], 0.0, left=False),
        truncated=torch.cat([b.truncated for b in batches]),
        group_ids=torch.cat(group_ids),
        completions=[c for b in batches for c in b.completions],
        rows=[r for b in batches for r in b.rows],
        row_index=torch.cat(row_index),
        action_mask=None
        if all(b.action_mask is None for b in batches)
        else pad([b.policy_mask for b in batches], 0.0, left=False),
    )
