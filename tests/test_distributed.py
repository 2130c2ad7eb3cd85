"""Learners on torch.distributed (FSDP2, gloo on the CPU) against one process.

One spawn of two ranks (a module fixture, shared by the tests) runs every distributed case;
each rank writes its results to a file that the tests compare with the same cases run here in
one process. The ranks meet on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from rlvr.models.logprobs import completion_logprobs
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.run_dir import RunDirectory
from rlvr.report.timer import StepTimer
from rlvr.rollout.sampler import RolloutBatch, rollout_batch, select_rows
from rlvr.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from rlvr.train.config import GRPOConfig, build_plan
from rlvr.train.distributed import (
    DistContext,
    all_reduce_sum,
    barrier,
    destroy,
    full_state_dict,
    full_tensor,
    init_distributed,
    single_process,
)
from rlvr.train.grpo import _resume_or_evaluate
from rlvr.train.learner import Learner, UpdateBatch
from rlvr.train.state import TrainState, build_state
from rlvr.train.teacher import Teacher
from rlvr.workers import WorkerError
from tests.helpers import close

WORLD = 2
CPU = torch.device("cpu")
LR = 1e-4
"""Adam's first step is lr * g / (|g| + 1e-8): where a gradient is near 0 it turns the ranks'
float rounding (gradients within 1e-7) into weight differences of up to about lr / 100 here,
so the weights after one step are compared at a small lr."""

UPDATE_CASES = {
    # 5 rows carry, one micro-batch each: the ranks run 3 and 2 (+1 zero-weight pass)
    "uneven": {"advantages": [1.0, -0.5, 0.0, 0.7, 0.0, -1.2, 0.3, 0.0], "micro": 1},
    # one row carries: rank 1 has no rows and runs a zero-weight pass only
    "one_row": {"advantages": [0.0, 0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0], "micro": 1},
    # every row, no budget: one process takes the whole batch with its own counts
    "whole_seq_mean": {
        "advantages": [0.5, -0.5, 1.0, -1.0, 0.2, -0.2, 0.8, -0.8],
        "micro": 0,
        "aggregation": "seq-mean-token-mean",
    },
    # nothing carries: zero gradients, Adam still steps
    "nothing": {"advantages": [0.0] * 8, "micro": 1},
}


def _model(seed: int = 0) -> torch.nn.Module:
    size = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return build_tiny_model(size, build_char_tokenizer(), seed)


def _batch() -> RolloutBatch:
    """8 rows (4 prompts x 2) with left-padded prompts of 3-6 tokens, completions ending at
    different EOS positions (one truncated), and sampling log-probs near the model's."""
    tokenizer = build_char_tokenizer()
    g = torch.Generator().manual_seed(0)
    encoded = tokenizer(["1+2=", "34+5=", "6=", "78+90="], padding=True, padding_side="left")
    prompt_ids = torch.tensor(encoded["input_ids"]).repeat_interleave(2, dim=0)
    prompt_mask = torch.tensor(encoded["attention_mask"]).repeat_interleave(2, dim=0)
    completion_ids = torch.randint(5, 15, (8, 7), generator=g)  # digits
    for row, eos_at in enumerate([1, 3, 6, 2, 4, 7, 0, 5]):
        if eos_at < 7:  # eos_at 7: no EOS, truncated
            completion_ids[row, eos_at] = tokenizer.eos_token_id
    batch = rollout_batch(
        tokenizer, prompt_ids, prompt_mask, completion_ids, torch.zeros(8, 7), num_samples=2
    )
    with torch.no_grad():
        logp = completion_logprobs(_model(), *batch.model_inputs())
    batch.logprobs = (logp + 0.3 * torch.randn(logp.shape, generator=g)) * batch.completion_mask
    return batch


def _update_case(name: str, ctx: DistContext) -> dict:
    """One policy step of `UPDATE_CASES[name]`: metrics, full gradients and weights after."""
    case = UPDATE_CASES[name]
    config = GRPOConfig(
        max_new_tokens=7,
        group_size=2,
        micro_batch_tokens=case["micro"],
        aggregation=case.get("aggregation", "token-mean"),
    )
    state = build_state(_model(), seed=0, lr=LR, dist_ctx=ctx)
    learner = Learner(state, build_plan(config, ctx.world_size))
    batch = _batch()
    data = UpdateBatch(
        batch, torch.tensor(case["advantages"]), batch.completion_mask, None, None, None
    )
    work = learner.plan_update(data)
    metrics = learner.policy_step(data, work, StepTimer())
    grads = {n: full_tensor(p.grad).clone() for n, p in state.policy.named_parameters()}
    return {
        "metrics": metrics,
        "grads": grads,
        "weights": learner.state_dict(),
        "passes": [len(shard) for shard in work.shards],
    }


def _critic_case(ctx: DistContext) -> dict:
    """A KL-regularised step with a reference and a critic: the no-grad forwards, the policy
    and critic steps, a reference sync, the weights after."""
    config = GRPOConfig(
        max_new_tokens=7,
        group_size=2,
        beta=0.1,
        micro_batch_tokens=40,
        ref_sync_every=1,
        ref_sync_alpha=0.5,
    )
    state = build_state(_model(), seed=0, lr=LR, reference=True, critic_lr=LR, dist_ctx=ctx)
    learner = Learner(state, build_plan(config, ctx.world_size))
    batch = _batch()
    out = {
        "pi_old": learner.policy_logprobs(batch),
        "ref": learner.reference_logprobs(batch),
        "values": learner.values(batch),
    }
    returns = torch.linspace(-1, 1, 56).view(8, 7)
    advantages = torch.tensor(UPDATE_CASES["uneven"]["advantages"])
    data = UpdateBatch(batch, advantages, batch.completion_mask, out["ref"], out["values"], returns)
    out["metrics"] = learner.policy_step(data, learner.plan_update(data), StepTimer())
    out["metrics"] |= learner.critic_step(data, StepTimer())
    learner.sync_reference(step=1)  # halfway to the policy
    out["weights"] = learner.state_dict()
    out["critic"] = full_state_dict(state.critic)
    out["reference"] = full_state_dict(state.reference)
    return out


SPLIT_ROWS = (5, 1)
"""Batch sizes of the split no-grad forwards: 5 rows on 2 ranks are blocks of 3 and 2 (+1 copy);
1 row leaves rank 1 a block of copies only."""


def _split_forwards_case(ctx: DistContext) -> dict:
    """The four no-grad forwards (reference, critic values, teacher, pi_old) of batches of
    `SPLIT_ROWS` rows, and the rows each forward call of the teacher got on this rank."""
    config = GRPOConfig(max_new_tokens=7, group_size=2, beta=0.1)
    state = build_state(_model(), seed=0, lr=LR, reference=True, critic_lr=LR, dist_ctx=ctx)
    teacher_model = _model(seed=5).eval().requires_grad_(False)
    seen: list[int] = []

    def count_rows(module, args, kwargs) -> None:
        seen.append(len(args[0] if args else kwargs["input_ids"]))

    teacher_model.register_forward_pre_hook(count_rows, with_kwargs=True)
    teacher = Teacher(teacher_model, temperature=1.0)
    learner = Learner(state, build_plan(config, ctx.world_size), teacher=teacher)
    out: dict = {}
    for n in SPLIT_ROWS:
        batch = select_rows(_batch(), torch.arange(n))
        out[n] = {
            "ref": learner.reference_logprobs(batch),
            "values": learner.values(batch),
            "teacher": learner.teacher_logprobs(batch, StepTimer()),
            "pi_old": learner.policy_logprobs(batch),
        }
    out["teacher_rows"] = seen
    return out


def _train_step(learner: Learner, state: TrainState, batch: RolloutBatch, step: int) -> None:
    """A step whose advantages and returns come from the sampling generator and torch's global
    RNG, so that a resume must restore both."""
    advantages = torch.randn(8, generator=state.generator)
    returns = torch.rand(8, 7)
    data = UpdateBatch(
        batch,
        advantages,
        batch.completion_mask,
        learner.reference_logprobs(batch),
        learner.values(batch),
        returns,
    )
    learner.policy_step(data, learner.plan_update(data), StepTimer())
    learner.critic_step(data, StepTimer())
    state.scheduler.step()
    state.step = state.data_position = step


def _full_optimizer_state(state: TrainState) -> dict:
    """AdamW's moments and steps of every parameter, gathered whole (on every rank)."""
    _, optim = get_state_dict(
        state.policy, state.optimizer, options=StateDictOptions(full_state_dict=True)
    )
    return optim["state"]


def _resume_case(ctx: DistContext, directory: Path) -> dict:
    """Three steps uninterrupted, checkpointed after step 2; then a fresh state (other initial
    weights) loads that checkpoint and takes step 3 again."""
    config = GRPOConfig(max_new_tokens=7, group_size=2, beta=0.1, micro_batch_tokens=40)
    plan = build_plan(config, ctx.world_size)
    batch = _batch()

    def fresh(seed: int) -> tuple[TrainState, Learner]:
        state = build_state(
            _model(seed), seed=seed, lr=1e-2, warmup_steps=4, reference=True, critic_lr=1e-2,
            dist_ctx=ctx,
        )  # fmt: skip
        return state, Learner(state, plan)

    state, learner = fresh(0)
    for step in (1, 2):
        _train_step(learner, state, batch, step)
    save_checkpoint(directory, state, keep_last=1)
    _train_step(learner, state, batch, 3)
    uninterrupted = _after_step(learner, state)

    state, learner = fresh(1)
    load_checkpoint(latest_checkpoint(directory), state)
    _train_step(learner, state, batch, 3)
    return {"uninterrupted": uninterrupted, "resumed": _after_step(learner, state)}


def _after_step(learner: Learner, state: TrainState) -> tuple:
    """(every model's full weights, the policy's full optimizer state, the learning rate)."""
    assert state.reference is not None and state.critic is not None
    weights = {
        "policy": learner.state_dict(),
        "reference": full_state_dict(state.reference),
        "critic": full_state_dict(state.critic),
    }
    return weights, _full_optimizer_state(state), state.scheduler.get_last_lr()


def _chosen_checkpoint_case(ctx: DistContext, out: Path) -> int:
    """A resume where rank 1 is pointed at an empty checkpoints directory and rank 0 at the one
    `_resume_case` wrote: every rank loads rank 0's newest (ranks that each listed their own
    could load different steps, then wait for each other's collectives until the timeout:
    issue 28). The step every rank resumes from."""
    config = GRPOConfig(max_new_tokens=7, group_size=2, beta=0.1, micro_batch_tokens=40)
    state = build_state(
        _model(3), seed=3, lr=1e-2, reference=True, critic_lr=1e-2, dist_ctx=ctx
    )  # fmt: skip
    learner = Learner(state, build_plan(config, ctx.world_size))
    rollout = SimpleNamespace(skip=lambda n: None, sync=lambda learner: learner.state_dict())
    trainer = SimpleNamespace(state=state, learner=learner, rollout=rollout)
    run = RunDirectory(out, "chosen", resume=True) if ctx.is_main else None
    listed = out / "checkpoints" if ctx.is_main else out / "no-checkpoints"
    _resume_or_evaluate(trainer, state.policy, run, lambda m: {}, listed, {}, ctx.is_main)
    return state.step


def _barrier_lines(ctx: DistContext) -> str:
    """What a rank prints while it waits at a barrier that rank 0 reaches 1 s late."""
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        if ctx.is_main:
            time.sleep(1.0)
        barrier(ctx, "a test's barrier", heartbeat_s=0.3)
    return printed.getvalue()


def _rank(rank: int, port: int, out: str) -> None:
    """One rank: join the group as torchrun would set it up, run every case, write results."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_WAIT_POLICY="PASSIVE",
    )
    torch.set_num_threads(1)
    ctx = init_distributed(CPU, timeout_s=60)
    results = {name: _update_case(name, ctx) for name in UPDATE_CASES}
    results["critic"] = _critic_case(ctx)
    results["split"] = _split_forwards_case(ctx)
    results["resume"] = _resume_case(ctx, Path(out) / "checkpoints")
    results["chosen_step"] = _chosen_checkpoint_case(ctx, Path(out))
    results["barrier"] = _barrier_lines(ctx)
    results["sum"] = all_reduce_sum({"x": float(rank + 1)}, ctx)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    if rank == 1:  # lost: rank 0's next collective must raise, naming it
        os._exit(0)
    try:
        all_reduce_sum({"x": 1.0}, ctx)
        lost = "no error"
    except WorkerError as err:
        lost = str(err)
    (Path(out) / "lost.txt").write_text(lost)
    destroy()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    """Run `_rank` on two spawned processes once; the directory of their results."""
    out = tmp_path_factory.mktemp("ranks")
    mp.start_processes(_rank, args=(_free_port(), str(out)), nprocs=WORLD, start_method="spawn")
    return out


def _load(ranks: Path, rank: int) -> dict:
    return torch.load(ranks / f"rank{rank}.pt", weights_only=False)


def _close_dicts(actual: dict, expected: dict, atol: float = 1e-6) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        close(actual[key], expected[key], atol)


@pytest.mark.parametrize("name", list(UPDATE_CASES))
def test_two_ranks_update_as_one_process(ranks, name):
    one = _update_case(name, single_process(CPU))
    two = [_load(ranks, r)[name] for r in range(WORLD)]
    assert two[0]["metrics"] == two[1]["metrics"]  # all-reduced: the same on every rank
    for key in ["loss", "grad_norm", *(k for k in one["metrics"] if k.startswith("policy/"))]:
        close(two[0]["metrics"][key], one["metrics"][key], 1e-6)
    _close_dicts(two[0]["grads"], one["grads"])
    _close_dicts(two[0]["weights"], one["weights"])
    _close_dicts(two[1]["weights"], one["weights"])
    if name == "uneven":
        assert sorted(two[0]["passes"]) == [2, 3]  # the zero-weight pass ran
    if name == "one_row":
        assert two[0]["passes"] == [1]  # rank 1 had no rows
    if name != "nothing":
        assert one["metrics"]["grad_norm"] > 0


def test_two_ranks_reference_critic_and_forwards_as_one_process(ranks):
    one = _critic_case(single_process(CPU))
    two = _load(ranks, 0)["critic"]
    for key in ("pi_old", "ref", "values"):
        close(two[key], one[key], 1e-6)
    for key in ("loss", "grad_norm", "value/mse", "value/clip_frac", "policy/kl_ref"):
        close(two["metrics"][key], one["metrics"][key], 1e-6)
    _close_dicts(two["weights"], one["weights"])
    _close_dicts(two["critic"], one["critic"])
    _close_dicts(two["reference"], one["reference"])


def test_two_ranks_split_the_no_grad_forwards_by_rows_as_one_process(ranks):
    one = _split_forwards_case(single_process(CPU))
    two = [_load(ranks, r)["split"] for r in range(WORLD)]
    for n in SPLIT_ROWS:
        for key in ("ref", "values", "teacher", "pi_old"):
            assert one[n][key].shape[0] == n
            close(two[0][n][key], one[n][key], 1e-6)
            close(two[1][n][key], one[n][key], 1e-6)  # all-gathered: the same on every rank
    assert one["teacher_rows"] == [5, 1]  # one process: the whole batch
    assert two[0]["teacher_rows"] == two[1]["teacher_rows"] == [3, 1]  # ceil(n / 2) rows each


def test_two_rank_resume_equals_the_uninterrupted_run(ranks):
    for rank in range(WORLD):
        result = _load(ranks, rank)["resume"]
        (weights, optimizer, lr), (weights_r, optimizer_r, lr_r) = (
            result["uninterrupted"],
            result["resumed"],
        )
        for model in weights:
            _close_dicts(weights_r[model], weights[model])
        assert lr_r == lr
        assert optimizer_r.keys() == optimizer.keys()
        for param in optimizer:
            _close_dicts(optimizer_r[param], optimizer[param])
    checkpoint = latest_checkpoint(ranks / "checkpoints")
    assert checkpoint is not None and checkpoint.name == "step-000002"
    names = {p.name for p in checkpoint.iterdir()}
    assert {"policy", "reference", "critic", "rng-0.pt", "rng-1.pt", "COMPLETE"} <= names
    state = build_state(_model(), seed=0, lr=1e-2, reference=True, critic_lr=1e-2)
    with pytest.raises(CheckpointError, match="saved by 2 torch.distributed rank"):
        load_checkpoint(checkpoint, state)  # one process cannot resume a 2-rank checkpoint


def test_every_rank_resumes_from_the_checkpoint_rank_0_chose(ranks):
    assert [_load(ranks, r)["chosen_step"] for r in range(WORLD)] == [2, 2]


def test_a_waiting_barrier_says_what_it_waits_for(ranks):
    assert _load(ranks, 0)["barrier"] == ""  # the last to arrive does not wait
    lines = _load(ranks, 1)["barrier"].splitlines()
    assert len(lines) >= 2, lines  # 1 s of waiting, a line every 0.3 s
    assert all(
        line.startswith("[rlvr] rank 1 waiting for rank 0 at a test's barrier (") for line in lines
    )


def test_metrics_are_summed_and_a_lost_rank_is_a_worker_error(ranks):
    assert _load(ranks, 0)["sum"] == _load(ranks, 1)["sum"] == {"x": 3.0}
    lost = (ranks / "lost.txt").read_text()
    assert lost.startswith("rank 1: lost during a metrics all-reduce"), lost


def test_one_process_without_torchrun_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    ctx = init_distributed(CPU, timeout_s=1)
    assert (ctx.world_size, ctx.backend, ctx.is_main, ctx.sharded) == (1, None, True, False)
    assert not torch.distributed.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT missing"):
        init_distributed(CPU, timeout_s=1)


def test_python_m_rlvr_help():
    result = subprocess.run(
        [sys.executable, "-m", "rlvr", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "train" in result.stdout
