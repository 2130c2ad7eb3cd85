"""Per-token log-probs of given completions under a model: the loss's forward pass."""

from __future__ import annotations

import torch

from rlvr.rollout.sampler import position_ids_from_mask


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
    logits = (
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            logits_to_keep=num_completion + 1,
        )
        .logits[:, :-1, :]
        .float()
    )
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(2, completion_ids[..., None]).squeeze(2)
