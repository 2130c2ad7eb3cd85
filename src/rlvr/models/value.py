"""A learned value model (critic) for PPO: the policy's transformer body plus a scalar head.

GRPO's point is that it needs none of this: the group mean of the verifier's rewards is the
baseline. PPO is here as the reference that claim is measured against.
"""

from __future__ import annotations

import copy

import torch

from rlvr.models.logprobs import position_ids_from_mask


class ValueModel(torch.nn.Module):
    """V(prefix) for every completion position: a copy of the policy's body and a linear head."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.body = copy.deepcopy(policy.get_decoder())
        hidden = policy.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(
        self,
        prompt_ids: torch.Tensor,  # [N, P] left-padded
        prompt_mask: torch.Tensor,  # [N, P]
        completion_ids: torch.Tensor,  # [N, T]
        completion_mask: torch.Tensor,  # [N, T]
    ) -> torch.Tensor:
        """Values [N, T]: entry t is the value of the state in which completion token t is
        chosen (the prompt and tokens < t), the same positions whose logits predict token t."""
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask.long()], dim=1)
        hidden = self.body(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
        ).last_hidden_state
        num_completion = completion_ids.shape[1]
        states = hidden[:, -num_completion - 1 : -1, :]
        return self.head(states).squeeze(-1).float()
