"""A thinking budget at inference (Qwen3's budget forcing), on top of `sample_completions`.

The think tags are the caller's (`think_open`, `think_close`, e.g. `rlvr.verifiers.format`'s
THINK_OPEN/THINK_CLOSE): the engine generates, and what a think block looks like belongs to
the task and its verifier.

Phase 1 samples the reasoning after `prompt + "<think>"`, at most `budget` tokens of it:

  * a row that writes `</think>` after at most `budget` reasoning tokens closed on its own;
  * a row that writes EOS before closing ended there (an unclosed think block: no answer);
  * a row that has written `budget` reasoning tokens and neither hit the budget: its thinking is
    cut there and `stop_phrase + "</think>"` is appended (Qwen3 appends "Considering the
    limited time by the user, I have to give the solution based on the thinking directly
    now.\\n</think>.\\n\\n"; here the phrase is one newline, which a character tokenizer can say).

Phase 2 samples the answer after `prompt + "<think>" + thinking + (stop phrase) + "</think>"`
for every row that closed, by itself or by force, at most `max_answer_tokens` tokens.

Choices and their reasons:
  * Phase 1 samples `budget + 1` tokens, so a reasoning of exactly `budget` tokens that the model
    closes itself is not forced (forcing happens exactly when the budget would be exceeded).
  * Tokens a closed row sampled after its `</think>` in phase 1 are dropped and the answer is
    sampled afresh in phase 2 from the same prefix: the same distribution (the sampler has no
    stop tokens), one code path for closed and forced rows.
  * `budget == 0` is the no-think mode: the completion is `<think></think>answer`, no stop
    phrase (nothing was cut off). `budget is None` is no budget: phase 1 may use the model's
    whole context, and a row that never closes is left unclosed, not forced.
  * The thinking is decoded to text and re-encoded for phase 2. Exact for the character
    tokenizer; a subword tokenizer may split the joined text differently.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.rollout.sampler import sample_completions

STOP_PHRASE = "\n"
_DEFAULT_CONTEXT = 512  # positions assumed when the model does not say


@dataclass
class ThinkingBatch:
    """`num_samples` completions for each prompt, flattened group-major to N rows."""

    completions: list[str]  # [N] "<think>" + thinking [+ stop phrase] + "</think>" + answer
    thinking_tokens: list[int]  # [N] tokens the model wrote inside the think block (<= budget)
    total_tokens: list[int]  # [N] all completion tokens: both tags, forced ones, EOS if any
    forced: list[bool]  # [N] the think block was closed by the budget, not by the model


def generate_with_thinking_budget(
    model: torch.nn.Module,
    tokenizer,
    prompts: list[str],
    budget: int | None,
    max_answer_tokens: int,
    temperature: float,
    generator: torch.Generator | None = None,
    num_samples: int = 1,
    stop_phrase: str = STOP_PHRASE,
    *,
    think_open: str,
    think_close: str,
) -> ThinkingBatch:
    """Completions whose reasoning is at most `budget` tokens (module docstring), the think
    block opened by `think_open` and closed by `think_close` (a single token of the tokenizer).
    """
    if budget is not None and budget < 0:
        raise ValueError(f"budget must be >= 0 or None, got {budget}")
    close_id = tokenizer.convert_tokens_to_ids(think_close)
    eos_id = tokenizer.eos_token_id
    rows = [p for p in prompts for _ in range(num_samples)]
    n = len(rows)

    # --- phase 1: the reasoning, at most budget tokens -------------------------------------
    thinking: list[list[int]] = [[] for _ in range(n)]
    forced = [budget == 0] * n
    ended: list[list[int] | None] = [None] * n  # ids of rows that stopped without closing
    if budget != 0:
        if budget is None:  # the context left after the prompt, "</think>" and the answer
            limit = max(1, _context_left(model, tokenizer, prompts) - 1 - max_answer_tokens)
        else:
            limit = budget + 1
        opened = [p + think_open for p in prompts]
        phase1 = sample_completions(
            model, tokenizer, opened, num_samples, limit, temperature, generator
        )
        lengths = phase1.lengths.long().tolist()
        for i, ids in enumerate(phase1.completion_ids.tolist()):
            ids = ids[: lengths[i]]
            stop = next((k for k, t in enumerate(ids) if t in (close_id, eos_id)), None)
            if stop is not None and ids[stop] == close_id:
                thinking[i] = ids[:stop]
            elif stop is not None or budget is None:
                ended[i] = ids  # EOS before any close, or no budget and no close in context
            else:
                thinking[i], forced[i] = ids[:budget], True

    # --- phase 2: the answer after the (possibly forced) close -----------------------------
    heads = [
        think_open
        + tokenizer.decode(thinking[i])
        + (stop_phrase if forced[i] and budget else "")
        + think_close
        for i in range(n)
    ]
    todo = [i for i in range(n) if ended[i] is None]
    answers: dict[int, tuple[str, int]] = {}
    if todo:
        continued = [rows[i] + heads[i] for i in todo]
        phase2 = sample_completions(
            model, tokenizer, continued, 1, max_answer_tokens, temperature, generator
        )
        for j, i in enumerate(todo):
            answers[i] = (phase2.completions[j], int(phase2.lengths[j]))

    # --- assemble --------------------------------------------------------------------------
    completions, totals = [], []
    for i in range(n):
        if ended[i] is not None:
            ids = ended[i]
            text_ids = ids[:-1] if ids and ids[-1] == eos_id else ids
            completions.append(think_open + tokenizer.decode(text_ids))
            totals.append(1 + len(ids))
            thinking[i] = text_ids
        else:
            answer, answer_tokens = answers[i]
            completions.append(heads[i] + answer)
            totals.append(_count_tokens(tokenizer, heads[i]) + answer_tokens)
    return ThinkingBatch(
        completions=completions,
        thinking_tokens=[len(t) for t in thinking],
        total_tokens=totals,
        forced=forced,
    )


def _count_tokens(tokenizer, text: str) -> int:
    """Tokens of `text` without the tokenizer's added special tokens."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _context_left(model: torch.nn.Module, tokenizer, prompts: list[str]) -> int:
    """Positions left after the longest prompt and its `<think>`."""
    config = getattr(model, "config", None)
    context = getattr(config, "max_position_embeddings", None) or _DEFAULT_CONTEXT
    return context - max(_count_tokens(tokenizer, p) for p in prompts) - 1
