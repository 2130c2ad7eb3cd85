"""The learner role: the policy, its optimizer and scheduler; the reference and critic when the
plan needs them. It turns a step's rollouts and advantages into updated weights.

In one process this is an object beside the rollout; past one process (a state built with a
`DistContext` of N ranks: the models FSDP2-sharded) the same calls run on every
torch.distributed rank, each holding the whole global batch:

- the update shares the carrying rows among the ranks (the plan's workers are the ranks, one
  thread each), every micro-batch keeping the whole batch's divisors; the gradients are summed
  over the ranks by FSDP and the loss, the metrics and the gradient norm are global, the same
  on every rank and equal to one process's (`update.accumulate_gradients`);
- the no-grad forwards (`policy_logprobs`, `reference_logprobs`, `values`) and the critic's
  step run the whole batch on every rank (a sharded forward is a collective: every rank must
  run the same calls), so their results are the same on every rank;
- `state_dict()` gathers the full weights, on every rank, for that rank's rollout copy.

Sharded forwards take whole logits and a prompt per row: the chunked head and the
shared-prompt forward call the decoder outside the root module's FSDP hooks, which leaves the
root's parameters sharded (`logprob_chunk_tokens` and `share_prompt_forward` are ignored there).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import torch

from rlvr.models.logprobs import completion_logprobs
from rlvr.models.lora import adapters_disabled
from rlvr.report.timer import StepTimer
from rlvr.rollout.sampler import RolloutBatch
from rlvr.train.agreement import AgreementCheck, check_agreement
from rlvr.train.config import StepPlan
from rlvr.train.distributed import full_state_dict, lost_rank_as_error, reshard
from rlvr.train.reference import check_reference_sync, sync_reference
from rlvr.train.state import TrainState
from rlvr.train.update import (
    UpdateResult,
    UpdateWork,
    accumulate_gradients,
    critic_step,
    optimizer_step,
    plan_update_work,
)


@dataclass
class UpdateBatch:
    """What one step trains on: the rollouts and what the step computed from them."""

    rollout: RolloutBatch
    advantages: torch.Tensor  # [N] per completion, or [N, T] per token (gae)
    loss_mask: torch.Tensor  # [N, T] float: tokens the loss counts
    ref_logp: torch.Tensor | None  # [N, T] reference log-probs (beta > 0)
    values: torch.Tensor | None  # [N, T] critic values at sampling time (gae)
    returns: torch.Tensor | None  # [N, T] the critic's regression targets (gae)


class Learner:
    """Owns `state`'s models and optimizers; every switch it obeys comes resolved in `plan`."""

    def __init__(
        self, state: TrainState, plan: StepPlan, agreement: AgreementCheck | None = None
    ) -> None:
        """Raises ValueError when `plan` syncs a reference that is a LoRA policy's base, or
        when a sharded state's plan has not one worker per rank. `agreement` checks each
        step's first pass against the sampler's log-probs (`train/agreement.py`; None: no
        check, for an update that does not start on-policy)."""
        check_reference_sync(state.reference_is_base, plan.ref_sync_every)
        if state.sharded and plan.workers != state.world_size:
            raise ValueError(
                f"a learner sharded over {state.world_size} ranks plans one worker per rank: "
                f"build_plan(config, workers={state.world_size}), not workers={plan.workers}"
            )
        self.state, self.plan, self.agreement = state, plan, agreement
        self.chunk_tokens = 0 if state.sharded else plan.logprob_chunk_tokens
        self._warned = False
        self._agreement_metrics: dict[str, float] = {}

    @property
    def policy(self) -> torch.nn.Module:
        return self.state.policy

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights, for a rollout engine that holds its own copy. Sharded: the
        full weights gathered once per call (a collective: every rank calls it), the same on
        every rank (`distributed.full_state_dict`)."""
        with self._ranks("gathering the weights"):
            return full_state_dict(self.state.policy)

    def _ranks(self, what: str) -> contextlib.AbstractContextManager:
        """Sharded: a rank lost during `what` raises `WorkerError` naming it; else nothing."""
        if self.state.dist_ctx is None or not self.state.sharded:
            return contextlib.nullcontext()
        return lost_rank_as_error(self.state.dist_ctx, what)

    @torch.no_grad()
    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[N, T] log-probs under the reference model; None when there is none (beta == 0).

        A LoRA policy's reference is the policy itself with its adapters disabled, in eval mode
        (as a frozen copy would be); its train/eval mode is restored after."""
        temperature, chunk = self.plan.sampling.temperature, self.chunk_tokens
        if self.state.reference is not None:
            with self._ranks("the reference's forward"):
                return completion_logprobs(
                    self.state.reference, *batch.model_inputs(), temperature, chunk_tokens=chunk
                )
        if not self.state.reference_is_base:
            return None
        policy = self.state.policy
        was_training = policy.training
        try:
            with adapters_disabled(policy):
                policy.eval()
                return completion_logprobs(
                    policy, *batch.model_inputs(), temperature, chunk_tokens=chunk
                )
        finally:
            policy.train(was_training)

    @torch.no_grad()
    def policy_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """[N, T] log-probs of the sampled tokens under the policy as the update starts
        (pi_old), in training mode as the loss's forward pass runs: the denominator of the
        rollout correction's importance ratio against the engine's behaviour log-probs."""
        self.state.policy.train()
        with self._ranks("the policy's forward"):
            return completion_logprobs(
                self.state.policy,
                *batch.model_inputs(),
                self.plan.sampling.temperature,
                chunk_tokens=self.chunk_tokens,
            )

    @torch.no_grad()
    def values(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[N, T] the critic's values of the sampled tokens; None without a critic."""
        if self.state.critic is None:
            return None
        with self._ranks("the critic's forward"):
            return self.state.critic(*batch.model_inputs())

    def plan_update(self, data: UpdateBatch) -> UpdateWork:
        """Which rows carry a gradient and how they split into micro-batches per worker."""
        self.state.policy.train()
        return plan_update_work(
            data.rollout,
            data.advantages,
            data.loss_mask,
            skip_zero_advantage=self.plan.skip_zero_advantage,
            workers=self.plan.workers,
            micro_batch_tokens=self.plan.micro_batch_tokens,
            share_prompts=self.plan.share_prompts and not self.state.sharded,
        )

    def policy_step(
        self, data: UpdateBatch, work: UpdateWork, timer: StepTimer, first_pass: bool = False
    ) -> dict:
        """One pass over the batch and one optimizer step; `update/nonfinite` when a NaN/Inf
        loss or gradient made it skip the step. The `first_pass` of a step is checked against
        the sampler (`agreement/max_abs_log_ratio`; a `LogprobMismatchError` before the
        optimizer steps when they disagree)."""
        state, plan = self.state, self.plan
        state.optimizer.zero_grad(set_to_none=True)
        if first_pass:  # the step's later passes report its first pass's value
            self._agreement_metrics = {}
        with self._ranks("the policy update"):
            result = self._accumulate(data, work)
            if first_pass and self.agreement is not None and work.parts:
                self._agreement_metrics = self._check_agreement(result.max_abs_log_ratio, work)
            timer.add("forward", result.forward_s)
            timer.add("backward", result.backward_s)
            with timer("optimizer"):
                grad_norm, stepped = optimizer_step(
                    state.policy, state.optimizer, plan.grad_clip, result.loss
                )
        metrics = {
            **result.metrics,
            "loss": result.loss,
            "lr": state.optimizer.param_groups[0]["lr"],
            "update/micro_batches": float(len(work.parts)),
            "update/shared_prompts": float(work.shared_prompts),
            "update/rows_skipped_frac": 1.0 - work.carried / work.rows,
            "grad_norm": grad_norm.item(),
            **self._agreement_metrics,
        }
        if not stepped:
            metrics["update/nonfinite"] = 1.0
        return metrics

    def _check_agreement(self, max_abs_log_ratio: float, work: UpdateWork) -> dict[str, float]:
        """`check_agreement` on this pass (raises on a disagreement past the tolerance; warns
        once per run without one); returns the metric."""
        assert self.agreement is not None
        path = ", ".join(
            ["FSDP ranks" if self.state.sharded else f"{self.plan.workers} worker thread(s)"]
            + [f"{len(work.parts)} micro-batch(es)"]
            + (["shared-prompt forward"] if work.shared_prompts else ["a prompt per row"])
            + ([f"head chunked by {self.chunk_tokens} tokens"] if self.chunk_tokens else [])
        )
        warning = check_agreement(self.agreement, max_abs_log_ratio, path, self.state.step + 1)
        if warning is not None and not self._warned:
            self._warned = True
            print(f"[rlvr] warning: {warning}", file=sys.stderr)
        return {"agreement/max_abs_log_ratio": max_abs_log_ratio}

    def _accumulate(self, data: UpdateBatch, work: UpdateWork) -> UpdateResult:
        """The gradients of one pass over the batch: worker threads in one process, this
        rank's share of `work` when sharded."""
        state, plan = self.state, self.plan
        return accumulate_gradients(
            state.policy,
            data.rollout,
            work,
            data.advantages,
            data.loss_mask,
            data.ref_logp,
            plan.loss_fn,
            plan.sampling.temperature,  # the loss scores the distribution sampled from
            plan.workers,
            logprob_chunk_tokens=self.chunk_tokens,
            dist_ctx=state.dist_ctx,
        )

    def critic_step(self, data: UpdateBatch, timer: StepTimer) -> dict[str, float]:
        """One step of PPO's value model on the batch (sharded: the whole batch on every rank,
        the gradients averaged over the ranks: the same gradient)."""
        assert self.state.critic is not None and self.state.critic_optimizer is not None
        assert data.values is not None and data.returns is not None
        with timer("critic"), self._ranks("the critic's update"):
            return critic_step(
                self.state.critic,
                self.state.critic_optimizer,
                data.rollout,
                data.values,
                data.returns,
                data.loss_mask,
                self.plan.value_clip,
                self.plan.grad_clip,
            )

    def sync_reference(self, step: int) -> None:
        """Every `ref_sync_every` steps, move the reference toward the policy (0: never)."""
        every, reference = self.plan.ref_sync_every, self.state.reference
        if reference is not None and every > 0 and step % every == 0:
            reshard(reference)  # sharded: shard by shard, none left gathered by a forward
            reshard(self.state.policy)
            sync_reference(reference, self.state.policy, self.plan.ref_sync_alpha)
