"""The learner role: the policy, its optimizer and scheduler; the reference, the critic and the
teacher when the plan needs them. It turns a step's rollouts and advantages into updated
weights, and scores the rollouts with its models (the no-grad forwards).

How the work is laid out is the state's `Strategy` (`train/strategy.py`), asked, not tested:
in one process (`LocalStrategy`) the update shares its rows among worker threads and every
forward takes the whole batch; on N torch.distributed ranks (`FSDP2Strategy`: the policy,
reference and critic FSDP2-split, every rank holding the whole global batch, the same calls on
every rank):

- the update shares the carrying rows among the ranks, every micro-batch keeping the whole
  batch's divisors; the gradients are summed over the ranks by FSDP and the loss, the metrics
  and the gradient norm are global, the same on every rank and equal to one process's
  (`update.rank_gradients`);
- each no-grad forward (`reference_logprobs`, `values`, `teacher_logprobs`, `policy_logprobs`)
  runs every rank on its own block of rows and all-gathers the [N, T] result
  (`Strategy.no_grad_rows`), so the ranks do the batch's work once between them; the critic's
  step runs the whole batch on every rank (its gradients averaged: the same gradient);
- `state_dict()` gathers the full weights, on every rank, for that rank's rollout copy;
- the chunked head and the shared-prompt forward are off (`Strategy.chunk_tokens`,
  `Strategy.forwards`): they call the decoder outside the root module's FSDP hooks.

The loss's forward (padded, shared-prompt or packed) is chosen per step among `forwards`
(`update.plan_update`); the packed forward is dropped where the policy cannot pack (an
`eager` attention: refused in one line when it was asked for by name). The reference's and
pi_old's no-grad passes pack too where packing is allowed and the cost model prices the
whole batch packed lower (`update.no_grad_forward`).

A LoRA policy's reference is its own base with the adapters off (`lora_state.scoring_reference`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from rlvr.models.logprobs import completion_logprobs
from rlvr.models.packing import PackingError, can_pack, completion_logprobs_packed
from rlvr.report.timer import StepTimer
from rlvr.rollout.sampler import RolloutBatch
from rlvr.train.agreement import AgreementCheck, check_agreement
from rlvr.train.config import StepPlan
from rlvr.train.distributed import reshard
from rlvr.train.lora_state import check_reference_sync, scoring_reference
from rlvr.train.reference import sync_reference
from rlvr.train.state import TrainState
from rlvr.train.teacher import Teacher
from rlvr.train.update import (
    UpdateResult,
    UpdateWork,
    critic_step,
    no_grad_forward,
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
        self,
        state: TrainState,
        plan: StepPlan,
        agreement: AgreementCheck | None = None,
        teacher: Teacher | None = None,
    ) -> None:
        """Raises ValueError when `plan` syncs a reference that is a LoRA policy's base, or
        when the strategy wants another number of update workers than `plan` has (one per
        rank on N ranks). `agreement` checks each step's first pass against the sampler's
        log-probs (`train/agreement.py`; None: no check, for an update that does not start
        on-policy). `teacher`: on-policy distillation's frozen scorer (None: no teacher)."""
        check_reference_sync(state.reference_is_base, plan.ref_sync_every)
        self.strategy = state.strategy
        wanted = self.strategy.update_workers(plan.workers)
        if wanted != plan.workers:
            raise ValueError(
                f"a learner over {state.world_size} ranks plans one worker per rank: "
                f"build_plan(config, workers={wanted}), not workers={plan.workers}"
            )
        self.state, self.plan, self.agreement, self.teacher = state, plan, agreement, teacher
        self.chunk_tokens = self.strategy.chunk_tokens(plan.logprob_chunk_tokens)
        self.forwards = self.strategy.forwards(plan.forwards)
        if "packed" in self.forwards and not can_pack(state.policy):
            if self.forwards == ("packed",):
                raise PackingError(
                    "--grpo.forward packed needs a policy whose attention is sdpa or flash "
                    "attention; use --grpo.forward auto or padded"
                )
            self.forwards = tuple(f for f in self.forwards if f != "packed")
        self._warned = False
        self._agreement_metrics: dict[str, float] = {}

    @property
    def policy(self) -> torch.nn.Module:
        return self.state.policy

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights, for a rollout engine that holds its own copy. On N ranks: the
        full weights gathered once per call (a collective: every rank calls it), the same on
        every rank (`Strategy.full_state_dict`)."""
        return self.strategy.full_state_dict(self.state.policy)

    def _logprobs(self, model: torch.nn.Module, batch: RolloutBatch, what: str) -> torch.Tensor:
        """[N, T] `model`'s log-probs of the sampled tokens at the sampling temperature, each
        rank scoring its own rows (`Strategy.no_grad_rows`)."""
        temperature, chunk = self.plan.sampling.temperature, self.chunk_tokens
        packs = "packed" in self.forwards and can_pack(model)

        def forward(rows: RolloutBatch) -> torch.Tensor:
            inputs = rows.model_inputs()
            packed = packs and no_grad_forward(rows) == "packed"
            run = completion_logprobs_packed if packed else completion_logprobs
            return run(model, *inputs, temperature, chunk_tokens=chunk)

        return self.strategy.no_grad_rows(forward, batch, what)

    @torch.no_grad()
    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[N, T] log-probs under the reference model; None when there is none (beta == 0).

        A LoRA policy's reference is the policy itself with its adapters disabled, in eval mode
        (as a frozen copy would be; `lora_state.scoring_reference`)."""
        state = self.state
        with scoring_reference(state.reference, state.policy, state.reference_is_base) as ref:
            if ref is None:
                return None
            return self._logprobs(ref, batch, "the reference's forward")

    @torch.no_grad()
    def teacher_logprobs(self, batch: RolloutBatch, timer: StepTimer) -> torch.Tensor | None:
        """[N, T] the teacher's log-probs of the sampled tokens at the sampling temperature
        (padding positions hold meaningless values), timed as `teacher_logprobs`; None
        without a teacher."""
        if self.teacher is None:
            return None
        with timer("teacher_logprobs"):
            return self.strategy.no_grad_rows(self.teacher.logprobs, batch, "the teacher's forward")

    @torch.no_grad()
    def policy_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """[N, T] log-probs of the sampled tokens under the policy as the update starts
        (pi_old), in training mode as the loss's forward pass runs: the denominator of the
        rollout correction's importance ratio against the engine's behaviour log-probs."""
        self.state.policy.train()
        return self._logprobs(self.state.policy, batch, "the policy's forward")

    @torch.no_grad()
    def values(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[N, T] the critic's values of the sampled tokens, each rank valuing its own rows;
        None without a critic."""
        critic = self.state.critic
        if critic is None:
            return None

        def forward(rows: RolloutBatch) -> torch.Tensor:
            return critic(*rows.model_inputs())

        return self.strategy.no_grad_rows(forward, batch, "the critic's forward")

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
            forwards=self.forwards,
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
        with self.strategy.ranks("the policy update"):
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
            "update/shared_prompts": float(work.forward == "shared-prompt"),
            "update/packed": float(work.forward == "packed"),
            "update/padding_frac": work.padding_frac,
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
            [self.strategy.describe(self.plan.workers)]
            + [f"{len(work.parts)} micro-batch(es)"]
            + [f"{work.forward} forward"]
            + ([f"head chunked by {self.chunk_tokens} tokens"] if self.chunk_tokens else [])
        )
        warning = check_agreement(self.agreement, max_abs_log_ratio, path, self.state.step + 1)
        if warning is not None and not self._warned:
            self._warned = True
            print(f"[rlvr] warning: {warning}", file=sys.stderr)
        return {"agreement/max_abs_log_ratio": max_abs_log_ratio}

    def _accumulate(self, data: UpdateBatch, work: UpdateWork) -> UpdateResult:
        """The gradients of one pass over the batch: worker threads in one process, this
        rank's share of `work` on N ranks (`Strategy.accumulate`)."""
        plan = self.plan
        return self.strategy.accumulate(
            self.state.policy,
            data.rollout,
            work,
            (data.advantages, data.loss_mask, data.ref_logp),
            plan.loss_fn,
            plan.sampling.temperature,  # the loss scores the distribution sampled from
            plan.workers,
            self.chunk_tokens,
        )

    def critic_step(self, data: UpdateBatch, timer: StepTimer) -> dict[str, float]:
        """One step of PPO's value model on the batch (on N ranks: the whole batch on every
        rank, the gradients averaged over the ranks: the same gradient)."""
        assert self.state.critic is not None and self.state.critic_optimizer is not None
        assert data.values is not None and data.returns is not None
        with timer("critic"), self.strategy.ranks("the critic's update"):
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
            reshard(reference)  # FSDP2: shard by shard, none left gathered by a forward
            reshard(self.state.policy)
            sync_reference(reference, self.state.policy, self.plan.ref_sync_alpha)
