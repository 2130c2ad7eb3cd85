"""Packed sequences: the loss's forward pass over several rows laid end to end, no padding.

A micro-batch of N rows (left-padded prompts, right-padded completions) becomes one row of
sum_i L_i tokens, L_i = row i's prompt plus completion tokens:

- the ids are each row's real tokens (`pack_rows`); position ids restart at 0 for
  each row; the boundaries are `cu_seq_lens` = [0, L_0, L_0 + L_1, ...], computed from the
  masks' lengths, never inferred from the position ids;
- no attention mask and no KV cache: attention runs per segment, causal within it, so no
  token ever attends across a boundary. On the CPU (and wherever the model uses SDPA) it is
  `packed_sdpa`, registered with transformers' attention interface: causal
  `scaled_dot_product_attention` within each segment, costing sum_i L_i^2 instead of
  (sum_i L_i)^2; the rows are packed shortest first, so the segments of one length are side by
  side and run as one batched call on a view (no gather);
  Under flash-attention (`flash_attention_2/3` on CUDA) the same `cu_seq_lens` go to its
  varlen kernel, which transformers calls when they are given;
- the log-prob of completion token j of row i is read off the state at packed position
  start_i + P_i + j - 1 (P_i its prompt tokens): the state before it, in its own segment. The
  first token of a segment is never a label of the segment before it.

`completion_logprobs_packed` takes and returns what `completion_logprobs` does ([N, T]
log-probs, 0 on padding), so the loss, the divisors and every caller are unchanged. The same
values to float rounding (fp32: within 1e-5, `tests/test_packing.py`) and the same gradients.

Models: the tiny model, Llama, Qwen2/3, Mistral and every architecture whose attention goes
through transformers' attention interface with `sdpa` or flash attention. An `eager` model is
refused (`PackingError`): its attention function is its own modeling file's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from rlvr.config import UserError
from rlvr.models.logprobs import (
    decoder_and_head,
    position_ids_from_mask,
    selected_token_logprobs,
    token_logprobs,
)

PACKED = "rlvr_packed_sdpa"
"""The name `packed_sdpa` is registered under in transformers' attention interface."""

_NO_MASK = torch.ones((1, 1, 1, 1), dtype=torch.bool)
"""A 4D placeholder handed to the model as its attention mask on a packed pass: transformers
returns a 4D mask as it is instead of building one (it would otherwise detect the packing from
the position ids and build a dense [L, L] block mask), and `packed_sdpa` never reads it."""


class PackingError(UserError, ValueError):
    """A model or a batch the packed forward cannot run; the message says what to change."""


def packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, H, L, D]
    key: torch.Tensor,  # [1, H_kv, L, D]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal SDPA per packed segment (`cu_seq_lens_q` in `kwargs`), or, on any other call,
    transformers' own SDPA with the mask it was given (the sampler's and padded passes run
    exactly as before). Returns [1, L, H, D] as every attention function of the interface."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if attention_mask is None or tuple(attention_mask.shape) != (1, 1, 1, 1):
        raise PackingError(
            "a packed pass takes no attention mask (segments come from cu_seq_lens): one given "
            "beside them would be dropped or misread (transformers drops an all-ones mask); "
            "build the inputs with packed_forward_inputs"
        )
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    p = dropout if module.training else 0.0
    edges = bounds.tolist() if isinstance(bounds, torch.Tensor) else list(bounds)
    heads, _, dim = query.shape[1:]
    pieces = []
    for start, count, length in _runs(edges):  # `count` segments of one length, one call
        end = start + count * length
        run = [
            x[0, :, start:end].reshape(x.shape[1], count, length, dim).transpose(0, 1)
            for x in (query, key, value)
        ]  # [count, H, length, D]: a view, no copy
        out = F.scaled_dot_product_attention(*run, dropout_p=p, is_causal=True, scale=scaling)
        pieces.append(out.transpose(0, 1).reshape(heads, count * length, dim))
    out = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]  # [H, L, D]
    return out.transpose(0, 1)[None].contiguous(), None


def _runs(edges: list[int]) -> list[tuple[int, int, int]]:
    """(start, segments, length) of each run of consecutive segments of one length:
    `pack_rows` orders rows by length, so each distinct length is one run."""
    runs: list[tuple[int, int, int]] = []
    for s, e in zip(edges[:-1], edges[1:]):
        if runs and runs[-1][2] == e - s and runs[-1][0] + runs[-1][1] * (e - s) == s:
            start, count, length = runs[-1]
            runs[-1] = (start, count + 1, length)
        else:
            runs.append((s, 1, e - s))
    return runs


def _register() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if PACKED not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(PACKED, packed_sdpa)
        # its padded calls get SDPA's masks, exactly as an `sdpa` model does
        ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def attention_kind(model: torch.nn.Module) -> str:
    """ "sdpa", "flash" or what else the model's attention is (its config's implementation)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl in ("sdpa", PACKED):
        return "sdpa"
    return "flash" if impl.startswith("flash_attention") else impl


def can_pack(model: torch.nn.Module) -> bool:
    """Whether `model` can run packed: a transformers model with SDPA or flash attention."""
    return attention_kind(model) in ("sdpa", "flash")


def enable_packing(model: torch.nn.Module) -> None:
    """Route an SDPA model's attention through `packed_sdpa` (its other calls unchanged);
    nothing for flash attention (varlen is built in). Idempotent. `PackingError` otherwise."""
    kind = attention_kind(model)
    if kind == "flash":
        return
    if kind != "sdpa":
        raise PackingError(
            f"--grpo.forward packed needs a model whose attention is sdpa or flash attention; "
            f"this one's is {kind!r}: load it with attn_implementation='sdpa', or use "
            "--grpo.forward padded"
        )
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if base.config._attn_implementation == PACKED:  # switched already: every call after the first
        return
    _register()
    for module in base.modules():
        config = getattr(module, "config", None)
        if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = PACKED


def pack_rows(
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, T] right-padded
    completion_mask: torch.Tensor,  # [N, T]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [L], position ids [L], cu_seq_lens [N + 1], label positions [M]) of the rows laid
    end to end, L = all their real tokens, shortest row first (stable: rows of one length stay
    in their order and sit side by side, so attention runs them in one call). Label position k
    is the packed index of the state that predicts the k-th completion token in
    `completion_mask.nonzero()` order (row-major, the rows' own order): start_i + P_i + j - 1,
    inside row i's own segment."""
    mask = torch.cat([prompt_mask.long(), completion_mask.long()], dim=1)
    lengths = mask.sum(dim=1)
    order = torch.argsort(lengths, stable=True)
    real = mask[order].bool()
    ids = torch.cat([prompt_ids, completion_ids], dim=1)[order][real]
    positions = position_ids_from_mask(mask[order])[real]
    bounds = torch.zeros(len(lengths) + 1, dtype=torch.long, device=mask.device)
    bounds[1:] = lengths[order].cumsum(0)
    start = torch.empty_like(lengths)
    start[order] = bounds[:-1]  # where each row's segment begins
    rows, cols = (completion_mask != 0).nonzero(as_tuple=True)
    labels = start[rows] + prompt_mask.long().sum(dim=1)[rows] + cols - 1
    return ids, positions, bounds, labels


def packed_forward_inputs(
    ids: torch.Tensor, positions: torch.Tensor, bounds: torch.Tensor
) -> dict[str, Any]:
    """The model's keyword arguments of a packed pass: one row, restarting positions, the
    segment boundaries (for `packed_sdpa` and flash attention's varlen path), no cache."""
    longest = int((bounds[1:] - bounds[:-1]).max())
    return {
        "input_ids": ids[None],
        "position_ids": positions[None],
        "attention_mask": _NO_MASK.to(ids.device),
        "cu_seq_lens_q": bounds.to(torch.int32),
        "cu_seq_lens_k": bounds.to(torch.int32),
        "max_length_q": longest,
        "max_length_k": longest,
        "use_cache": False,
    }


def completion_logprobs_packed(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, T] right-padded
    completion_mask: torch.Tensor,  # [N, T]
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`completion_logprobs` on the rows packed end to end (module docstring): [N, T] log-probs
    (0 where `completion_mask` is 0), with `with_entropy` also entropies. `chunk_tokens > 0`
    runs the head that many completion tokens at a time, as `completion_logprobs` does."""
    _check_layout(prompt_mask, completion_mask)
    enable_packing(model)
    ids, positions, bounds, labels = pack_rows(
        prompt_ids, prompt_mask, completion_ids, completion_mask
    )
    rows, cols = (completion_mask != 0).nonzero(as_tuple=True)
    targets = completion_ids[rows, cols]
    inputs = packed_forward_inputs(ids, positions, bounds)
    split = decoder_and_head(model) if chunk_tokens > 0 else None
    if split is not None:
        decoder, head = split
        states = decoder(**inputs).last_hidden_state[0, labels]  # [M, H]
        values, entropy = selected_token_logprobs(
            states, head, targets, temperature, chunk_tokens, with_entropy
        )
    else:  # the head runs only at the label positions
        logits = model(**inputs, logits_to_keep=labels).logits  # [1, M, V]
        if with_entropy:
            values, entropy = (
                x[0] for x in token_logprobs(logits, targets[None], temperature, True)
            )
        else:
            values, entropy = token_logprobs(logits, targets[None], temperature)[0], None
    out = torch.zeros(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
    logp = out.index_put((rows, cols), values)
    if not with_entropy:
        return logp
    return logp, torch.zeros_like(out).index_put((rows, cols), entropy)


def _check_layout(prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> None:
    """Refuse masks that are not left-padded prompts and right-padded completions: the
    boundaries are computed from their lengths, and anything else would misplace them."""
    p, c = prompt_mask.long(), (completion_mask != 0).long()
    if bool((p[:, 1:] < p[:, :-1]).any()) or bool((c[:, 1:] > c[:, :-1]).any()):
        raise PackingError(
            "a packed pass needs left-padded prompts and right-padded completions (each row's "
            "tokens contiguous); got a mask with holes"
        )
