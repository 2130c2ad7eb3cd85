"""Per-token log-probs of given completions under a model: the loss's forward pass.

Two ways to the log-probs, the same values (to float rounding) and gradients:
- whole logits (`chunk_tokens=0`, and any model whose logits are not simply its output head
  applied to its decoder's hidden states): the model's forward returns [N, T, V] logits, and
  their log-softmax is held for the backward pass (2-3 tensors of N x T x V floats at once);
- chunked (`chunk_tokens > 0`, a Hugging Face causal LM that `decoder_and_head` can split): the
  decoder's hidden states [N, T, H] are computed once, and the output head, log-softmax and
  gather run over `chunk_tokens` completion tokens at a time (`chunked_token_logprobs`: a
  fused `LinearLogprobs` for a plain Linear head, `torch.utils.checkpoint` for any other), so
  the backward pass recomputes each chunk's logits instead of storing them. The largest
  tensor is then chunk_tokens x V, whatever N and T; the price is one more head matmul per
  token in the backward pass. Padding positions (`completion_mask == 0`) are skipped: their
  log-prob is 0.

`with_entropy=True` also returns each position's entropy of the (temperature-scaled) next-token
distribution, -sum_v p_v log p_v in nats, [N, T] fp32: computed without grad from the logits
the log-probs are taken from (inside `LinearLogprobs.forward` for the chunked path), so no
second forward pass runs and the gradients are the same, bit for bit.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedModel

SPLIT_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "phi3", "olmo2", "smollm3"}
)
"""Architectures whose logits are exactly `lm_head(decoder(...).last_hidden_state)` (no
soft-capping or logit scale after the head, as Gemma 2 or Cohere have): the ones chunking may
split. Any other model takes the whole-logits path."""


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token. [N, L] -> [N, L]."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, output head) of a Hugging Face causal LM whose logits are
    `head(decoder(...).last_hidden_state)`, or None when `model` cannot be split so (a wrapper
    with its own forward, an architecture outside `SPLIT_MODEL_TYPES`). A peft model (LoRA) is
    split through its base model, whose layers carry the adapters."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        config = getattr(model, "active_peft_config", None)
        if getattr(config, "is_prompt_learning", False):  # virtual tokens: its own forward
            return None
        model = model.get_base_model()
    if not isinstance(model, PreTrainedModel):
        return None
    if getattr(model.config, "model_type", None) not in SPLIT_MODEL_TYPES:
        return None
    head, decoder = model.get_output_embeddings(), model.get_decoder()
    if not isinstance(head, torch.nn.Module) or decoder is model:
        return None
    return decoder, head


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, T] right-padded
    completion_mask: torch.Tensor,  # [N, T]
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each completion token given everything before it: [N, T]; with
    `with_entropy`, (log-probs, entropies), both [N, T] (module docstring).

    Logits are divided by `temperature` (when > 0) so that the result matches the distribution
    the tokens were sampled from. Positions where `completion_mask` is 0 hold meaningless values
    (0 when chunked): every consumer reduces with the mask. `chunk_tokens > 0` computes the
    head's logits that many completion tokens at a time (module docstring), when the model can
    be split (`decoder_and_head`); otherwise the whole [N, T, V] logits at once.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.long()], dim=1)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
    }
    num_completion = completion_ids.shape[1]
    split = decoder_and_head(model) if chunk_tokens > 0 else None
    if split is not None:
        decoder, head = split
        hidden = decoder(**inputs, use_cache=False).last_hidden_state  # no KV cache to fill
        hidden = hidden[:, -num_completion - 1 : -1, :]
        return chunked_token_logprobs(
            hidden, head, completion_ids, completion_mask, temperature, chunk_tokens, with_entropy
        )
    # logits at position t predict token t+1: keep the T positions that predict the completion
    logits = model(**inputs, logits_to_keep=num_completion + 1).logits[:, :-1, :]
    return token_logprobs(logits, completion_ids, temperature, with_entropy)


def cache_argument(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """`{name: cache}` for `model`'s forward: `cache` (transformers >= 5.24) or
    `past_key_values` (earlier 5.x, e.g. the < 5.20 that vLLM's CPU build pins), whichever its
    forward (a PEFT model's base model's) names. A wrapper whose forward takes `**kwargs` and
    names neither gets the installed transformers' own name, which the model it wraps takes.
    A wrong name is swallowed by the forward's `**kwargs` without a word, and the pass then
    runs without its KV cache: the completions are scored without their prompt."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_keyword(type(base)): cache}


@functools.cache
def _cache_keyword(model_class: type) -> str:
    """The KV cache's keyword that `model_class.forward` names, else the installed
    transformers' (`_installed_cache_keyword`)."""
    parameters = inspect.signature(model_class.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    return _installed_cache_keyword()


@functools.cache
def _installed_cache_keyword() -> str:
    """`cache` where the installed transformers' decoders take it (>= 5.24), else
    `past_key_values`: read off its Llama decoder's forward, the name every built-in
    architecture shares in one release."""
    from transformers import LlamaModel

    parameters = inspect.signature(LlamaModel.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def completion_logprobs_shared_prompts(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, T] right-padded
    completion_mask: torch.Tensor,  # [N, T]
    group_ids: torch.Tensor,  # [N] rows of one group share one prompt
    temperature: float = 1.0,
    chunk_tokens: int = 0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`completion_logprobs`, with each group's prompt run through the model once.

    The G rows of a group repeat one prompt, whose keys and values are the same in every row.
    The prompts' forward pass runs over one row per group; its KV cache is then indexed out to
    the group's rows (a differentiable gather, so the backward pass sums the rows' gradients
    into the one prompt) and the completions run on top of it. Same values and gradients as
    `completion_logprobs`, with (G - 1) / G of the prompt tokens' forward and backward saved.
    `chunk_tokens` and `with_entropy` as in `completion_logprobs`.

    A model training under gradient checkpointing drops the KV cache (its recomputed layers
    cannot replay writes to it): such a call takes `completion_logprobs` instead.
    """
    if model.training and torch.is_grad_enabled() and _checkpointing(model):
        return completion_logprobs(
            model,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            temperature,
            chunk_tokens,
            with_entropy,
        )
    split = decoder_and_head(model) if chunk_tokens > 0 else None
    run = split[0] if split is not None else model
    n = len(group_ids)
    groups, row_group = torch.unique(group_ids, return_inverse=True)
    first = torch.full((len(groups),), n, dtype=torch.long, device=group_ids.device)
    first = first.scatter_reduce(0, row_group, torch.arange(n, device=group_ids.device), "amin")
    unique_mask = prompt_mask[first]
    cache = DynamicCache(config=getattr(model, "config", None))
    prompt_inputs = {
        "input_ids": prompt_ids[first],
        "attention_mask": unique_mask,
        "position_ids": position_ids_from_mask(unique_mask),
        **cache_argument(run, cache),
        "use_cache": True,
    }
    if split is None:
        prompt_inputs["logits_to_keep"] = 1
    out = _last_states(run(**prompt_inputs), split)
    states = out[:, -1:, :][row_group]  # [N, 1, V or H]: predicts completion token 0
    if completion_ids.shape[1] > 1:
        cache.batch_select_indices(row_group)  # each row gets its prompt's keys and values
        steps = completion_ids.shape[1] - 1  # the last completion token predicts nothing
        positions = prompt_mask.sum(dim=1, keepdim=True) + torch.arange(
            steps, device=completion_ids.device
        )
        rest = run(
            input_ids=completion_ids[:, :steps],
            attention_mask=torch.cat([prompt_mask, completion_mask[:, :steps].long()], dim=1),
            position_ids=positions,
            **cache_argument(run, cache),
            use_cache=True,
        )
        states = torch.cat([states, _last_states(rest, split)], dim=1)
    if split is not None:
        return chunked_token_logprobs(
            states,
            split[1],
            completion_ids,
            completion_mask,
            temperature,
            chunk_tokens,
            with_entropy,
        )
    return token_logprobs(states, completion_ids, temperature, with_entropy)


def token_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float, with_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / temperature) at `ids`: [N, T, V], [N, T] -> [N, T] (fp32); with
    `with_entropy`, also the entropy of each position's softmax(logits / temperature), [N, T]
    fp32, computed without grad from the same log-softmax."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logsm = torch.log_softmax(logits, dim=-1)
    picked = logsm.gather(2, ids[..., None]).squeeze(2)
    if not with_entropy:
        return picked
    return picked, entropy_of_log_softmax(logsm)


@torch.no_grad()
def entropy_of_log_softmax(logsm: torch.Tensor) -> torch.Tensor:
    """-sum_v p_v log p_v over the last dimension of log-probs `logsm` ([..., V] ->
    [...], fp32, nats, no grad). A -inf log-prob (p = 0) adds 0."""
    logsm = logsm.detach().float()
    terms = logsm.exp() * logsm
    return -torch.where(torch.isfinite(logsm), terms, terms.new_zeros(())).sum(dim=-1)


def chunked_token_logprobs(
    hidden: torch.Tensor,  # [N, T, H]: the states that predict `ids`
    head: torch.nn.Module,  # H -> V
    ids: torch.Tensor,  # [N, T]
    mask: torch.Tensor,  # [N, T]: 0 on padding
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs(head(hidden), ids, temperature)` at the tokens where `mask` is nonzero,
    `chunk_tokens` tokens (across rows) at a time: [N, T] fp32, 0 where `mask` is 0; with
    `with_entropy`, (log-probs, entropies): each chunk's entropy is taken, without grad, from
    the logits its log-probs come from (0 where `mask` is 0).

    A plain `nn.Linear` head (no hooks) runs `LinearLogprobs`: its backward recomputes each
    chunk's logits and turns them into the gradients in place, accumulating the weight's
    gradient in one buffer. Any other head (a LoRA layer, a hooked module) runs each chunk
    under a non-reentrant `torch.utils.checkpoint`, which recomputes the chunk through autograd
    (the same values, a few more chunk x V temporaries and a weight-sized gradient per chunk)."""
    rows, cols = (mask != 0).nonzero(as_tuple=True)
    states, targets = hidden[rows, cols], ids[rows, cols]  # [M, H], [M]
    out = torch.zeros(ids.shape, dtype=torch.float32, device=hidden.device)
    values, entropy = selected_token_logprobs(
        states, head, targets, temperature, chunk_tokens, with_entropy
    )
    logp = out.index_put((rows, cols), values)
    if not with_entropy:
        return logp
    return logp, torch.zeros_like(out).index_put((rows, cols), entropy)


def selected_token_logprobs(
    states: torch.Tensor,  # [M, H]: the states that predict `targets`
    head: torch.nn.Module,  # H -> V
    targets: torch.Tensor,  # [M]
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax(head(states) / temperature) at `targets` [M] fp32, entropies [M] fp32 (0
    without `with_entropy`)), `chunk_tokens` states at a time: the core of
    `chunked_token_logprobs`, which describes the two ways a head is run."""
    entropy = torch.zeros(len(targets), dtype=torch.float32, device=states.device)
    if len(targets) == 0:
        return torch.zeros(0, dtype=torch.float32, device=states.device), entropy
    # filled in place, without grad, by the chunks' forward passes
    fill = entropy if with_entropy else None
    if _plain_linear(head):
        values = LinearLogprobs.apply(
            states, head.weight, head.bias, targets, temperature, fill, chunk_tokens
        )
        return values, entropy
    track = torch.is_grad_enabled() and (
        states.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    pieces = []
    for start in range(0, len(targets), chunk_tokens):
        end = start + chunk_tokens
        # the buffer is bound, not an input: a checkpoint would save it and then refuse
        # the recomputation's write into it
        run = functools.partial(_head_logprobs, entropy=None if fill is None else fill[start:end])
        piece = (head, states[start:end], targets[start:end], temperature)
        if track:
            pieces.append(checkpoint(run, *piece, use_reentrant=False))
        else:
            pieces.append(run(*piece))
    return torch.cat(pieces), entropy


class LinearLogprobs(torch.autograd.Function):
    """log softmax((states @ weight.T + bias) / temperature) at `ids`, `chunk` rows at a time:
    [M, H], [V, H], [V] | None, [M] -> [M] fp32, holding no [M, V] tensor in either pass.

    The forward keeps only its inputs. The backward recomputes each chunk's logits z (fp32) and
    overwrites them with dlogp/dz = g * (onehot(ids) - softmax(z)) / temperature, from which
    the states' gradient (its rows of the output) and the weight's (`addmm_` into one fp32
    buffer) follow: one chunk x V buffer at a time, one more head matmul per token than a
    whole-logits backward.

    Arguments `(states, weight, bias, ids, temperature, chunk)`, or with an `entropy` before
    `chunk`: an [M] fp32 tensor (or None) filled in place with each row's entropy of
    softmax(logits / temperature), from the chunk's logits while they exist; it is not an
    output of the function, so the backward pass never sees it."""

    @staticmethod
    def forward(ctx, states, weight, bias, ids, temperature, *entropy_and_chunk):
        # (chunk,) or (entropy, chunk): the chunk size is always the last argument
        *given, chunk = entropy_and_chunk
        entropy = given[0] if given else None
        out = torch.empty(len(ids), dtype=torch.float32, device=states.device)
        for start in range(0, len(ids), chunk):
            end = start + chunk
            logits = _linear_logits(states[start:end], weight, bias, temperature)
            picked = logits.gather(1, ids[start:end, None]).squeeze(1)
            lse = torch.logsumexp(logits, dim=-1)
            out[start:end] = picked - lse
            if entropy is not None:
                entropy[start:end] = entropy_of_log_softmax(logits.sub_(lse[:, None]))
        ctx.save_for_backward(states, weight, bias, ids)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        states, weight, bias, ids = ctx.saved_tensors
        need_states, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_states = torch.empty_like(states) if need_states else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        for start in range(0, len(ids), ctx.chunk):
            end = start + ctx.chunk
            g = grad_out[start:end].float()
            grad = _linear_logits(states[start:end], weight, bias, ctx.temperature)
            grad = grad.sub_(torch.logsumexp(grad, dim=-1, keepdim=True)).exp_()  # softmax
            grad.mul_(-g[:, None])
            grad[torch.arange(len(g), device=grad.device), ids[start:end]] += g
            if ctx.temperature > 0:
                grad.div_(ctx.temperature)
            if need_states:
                grad_states[start:end] = (grad.to(weight.dtype) @ weight).to(states.dtype)
            if need_weight:
                grad_weight.addmm_(grad.T, states[start:end].float())
            if need_bias:
                grad_bias += grad.sum(dim=0)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_states, grad_weight, grad_bias, *[None] * (len(ctx.needs_input_grad) - 3)


def _linear_logits(
    states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """(states @ weight.T + bias) / temperature as a fresh fp32 [rows, V] tensor."""
    logits = torch.nn.functional.linear(states, weight, bias).float()
    return logits.div_(temperature) if temperature > 0 else logits


def _plain_linear(head: torch.nn.Module) -> bool:
    """An `nn.Linear` itself, no hooks: its forward is exactly `F.linear(x, weight, bias)`."""
    return (
        type(head) is torch.nn.Linear
        and not head._forward_hooks
        and not head._forward_pre_hooks
        and not head._backward_hooks
    )


def _head_logprobs(
    head: torch.nn.Module,
    states: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    entropy: torch.Tensor | None = None,
) -> torch.Tensor:
    """log softmax(head(states) / temperature) at `ids`: [M, H], [M] -> [M] (fp32). `entropy`
    ([M] fp32, or None) is filled in place, without grad, with each row's entropy (again, with
    the same values, when a checkpoint recomputes the chunk)."""
    logits = head(states).float()
    if temperature > 0:
        logits = logits / temperature
    logsm = torch.log_softmax(logits, dim=-1)
    if entropy is not None:
        entropy.copy_(entropy_of_log_softmax(logsm))
    return logsm.gather(1, ids[:, None]).squeeze(1)


def _last_states(out, split: tuple | None) -> torch.Tensor:
    """The logits of a whole-model output, or the hidden states of a decoder's."""
    return out.logits if split is None else out.last_hidden_state


def _checkpointing(model: torch.nn.Module) -> bool:
    """Whether any layer of `model` has gradient checkpointing on (Hugging Face's flag)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
