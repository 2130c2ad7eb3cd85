"""Per-token log-probs of given completions under a model: the loss's forward pass."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token. [N, L] -> [N, L]."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, T] right-padded
    completion_mask: torch.Tensor,  # [N, T]
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-prob of each completion token given everything before it: [N, T].

    Logits are divided by `temperature` (when > 0) so that the result matches the distribution
    the tokens were sampled from. Positions where `completion_mask` is 0 hold meaningless values:
    every consumer reduces with the mask.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.long()], dim=1)
    num_completion = completion_ids.shape[1]
    # logits at position t predict token t+1: keep the T positions that predict the completion
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        logits_to_keep=num_completion + 1,
    ).logits[:, :-1, :]
    return token_logprobs(logits, completion_ids, temperature)


def completion_logprobs_shared_prompts(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,  # [N, P] left-padded
    prompt_mask: torch.Tensor,  # [N, P]
    completion_ids: torch.Tensor,  # [N, T] right-padded
    completion_mask: torch.Tensor,  # [N, T]
    group_ids: torch.Tensor,  # [N] rows of one group share one prompt
    temperature: float = 1.0,
) -> torch.Tensor:
    """`completion_logprobs`, with each group's prompt run through the model once.

    The G rows of a group repeat one prompt, whose keys and values are the same in every row.
    The prompts' forward pass runs over one row per group; its KV cache is then indexed out to
    the group's rows (a differentiable gather, so the backward pass sums the rows' gradients
    into the one prompt) and the completions run on top of it. Same values and gradients as
    `completion_logprobs`, with (G - 1) / G of the prompt tokens' forward and backward saved.
    """
    n = len(group_ids)
    groups, row_group = torch.unique(group_ids, return_inverse=True)
    first = torch.full((len(groups),), n, dtype=torch.long, device=group_ids.device)
    first = first.scatter_reduce(0, row_group, torch.arange(n, device=group_ids.device), "amin")
    unique_mask = prompt_mask[first]
    cache = DynamicCache(config=getattr(model, "config", None))
    prompt_out = model(
        input_ids=prompt_ids[first],
        attention_mask=unique_mask,
        position_ids=position_ids_from_mask(unique_mask),
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = prompt_out.logits[:, -1:, :][row_group]  # [N, 1, V]: predicts completion token 0
    if completion_ids.shape[1] > 1:
        cache.batch_select_indices(row_group)  # each row gets its prompt's keys and values
        steps = completion_ids.shape[1] - 1  # the last completion token predicts nothing
        positions = prompt_mask.sum(dim=1, keepdim=True) + torch.arange(
            steps, device=completion_ids.device
        )
        rest = model(
            input_ids=completion_ids[:, :steps],
            attention_mask=torch.cat([prompt_mask, completion_mask[:, :steps].long()], dim=1),
            position_ids=positions,
            cache=cache,
            use_cache=True,
        ).logits
        logits = torch.cat([logits, rest], dim=1)
    return token_logprobs(logits, completion_ids, temperature)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) at `ids`: [N, T, V], [N, T] -> [N, T] (fp32)."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(2, ids[..., None]).squeeze(2)
