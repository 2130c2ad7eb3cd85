"""Pure tensor formulas of GRPO and its family: advantages, reductions, KL estimators, losses."""

from rlvr.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    GROUP_BASELINE_ESTIMATORS,
    REWARD_SCALES,
    advantages_dr_grpo,
    advantages_grpo,
    advantages_reinforce_pp,
    advantages_reinforce_pp_baseline,
    advantages_rloo,
    scale_by_batch_std,
    scale_by_group_std,
    scale_none,
    zero_std_group_fraction,
)
from rlvr.algo.dapo import dynamic_sampling_keep, overlong_penalty, truncation_mask
from rlvr.algo.distill import mixed_advantages, reverse_kl_advantages
from rlvr.algo.dpo import DPO_LOSSES, dpo_loss, sequence_logps
from rlvr.algo.gae import (
    discounted_returns,
    gae_advantages,
    outcome_to_token_rewards,
    reinforce_pp_token_advantages,
)
from rlvr.algo.kl import KL_ESTIMATORS, kl_in_reward, kl_k1, kl_k2, kl_k3
from rlvr.algo.losses import (
    RATIO_LEVELS,
    SURROGATES,
    policy_loss,
    ratio_gspo_token,
    ratio_sequence,
    ratio_surrogate,
    ratio_token,
    surrogate_cispo,
    surrogate_conflicts,
    surrogate_gmpo,
    surrogate_ppo_clip,
    value_loss,
)
from rlvr.algo.reductions import (
    AGGREGATIONS,
    aggregate_seq_mean_token_mean,
    aggregate_seq_mean_token_sum_norm,
    aggregate_token_mean,
    masked_mean,
    masked_sum,
    masked_whiten,
)
from rlvr.algo.rollout_correction import (
    ROLLOUT_CORRECTIONS,
    corrected_advantages,
    importance_ratios,
    mismatch_metrics,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "GROUP_BASELINE_ESTIMATORS",
    "KL_ESTIMATORS",
    "RATIO_LEVELS",
    "REWARD_SCALES",
    "ROLLOUT_CORRECTIONS",
    "advantages_dr_grpo",
    "advantages_grpo",
    "advantages_reinforce_pp",
    "advantages_reinforce_pp_baseline",
    "advantages_rloo",
    "aggregate_seq_mean_token_mean",
    "aggregate_seq_mean_token_sum_norm",
    "aggregate_token_mean",
    "discounted_returns",
    "dynamic_sampling_keep",
    "gae_advantages",
    "corrected_advantages",
    "importance_ratios",
    "kl_in_reward",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "mismatch_metrics",
    "outcome_to_token_rewards",
    "overlong_penalty",
    "policy_loss",
    "ratio_gspo_token",
    "ratio_sequence",
    "ratio_surrogate",
    "ratio_token",
    "reinforce_pp_token_advantages",
    "scale_by_batch_std",
    "scale_by_group_std",
    "scale_none",
    "truncation_mask",
    "value_loss",
    "zero_std_group_fraction",
]
__all__ += ["DPO_LOSSES", "dpo_loss", "sequence_logps"]
__all__ += [
    "SURROGATES",
    "surrogate_cispo",
    "surrogate_conflicts",
    "surrogate_gmpo",
    "surrogate_ppo_clip",
]
__all__ += ["mixed_advantages", "reverse_kl_advantages"]
