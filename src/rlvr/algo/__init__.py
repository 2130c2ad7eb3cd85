"""Pure tensor formulas of GRPO and its family: advantages, reductions, KL estimators, losses."""

from rlvr.algo.advantages import grpo_advantages, rloo_advantages, zero_std_group_fraction
from rlvr.algo.kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3
from rlvr.algo.losses import clipped_surrogate, policy_loss
from rlvr.algo.reductions import (
    AGGREGATIONS,
    aggregate_seq_mean_token_mean,
    aggregate_seq_mean_token_sum_norm,
    aggregate_token_mean,
    masked_mean,
    masked_sum,
)

__all__ = [
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "aggregate_seq_mean_token_mean",
    "aggregate_seq_mean_token_sum_norm",
    "aggregate_token_mean",
    "clipped_surrogate",
    "grpo_advantages",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "masked_mean",
    "masked_sum",
    "policy_loss",
    "rloo_advantages",
    "zero_std_group_fraction",
]
