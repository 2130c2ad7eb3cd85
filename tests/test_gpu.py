"""CUDA checks (marker `gpu`): the same loop on a GPU as on the CPU. scripts/gpu_check.sh runs
them on a GPU machine; without CUDA every test here skips."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlvr.devices import generator_on, resolve_precision
from rlvr.models.logprobs import completion_logprobs
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.timer import StepTimer
from rlvr.rollout.sampler import sample_completions
from rlvr.tasks.arithmetic import ArithmeticTaskConfig, task_spec
from rlvr.train.config import GRPOConfig
from rlvr.train.grpo import build_trainer, grpo_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SHAPE = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def _model(device: str) -> tuple[torch.nn.Module, object]:
    tokenizer = build_char_tokenizer()
    return build_tiny_model(SHAPE, tokenizer, seed=0).to(device), tokenizer


def test_auto_picks_cuda_in_bf16():
    precision = resolve_precision("auto", "auto")
    assert precision.device.type == "cuda"
    assert precision.dtype == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32)


def test_sampling_on_cuda_draws_on_the_device_and_is_reproducible():
    model, tokenizer = _model("cuda")
    prompts = ["12+30=", "45+27="]
    batches = [
        sample_completions(model, tokenizer, prompts, 4, 12, 1.0, torch.Generator().manual_seed(1))
        for _ in range(2)
    ]
    assert batches[0].completion_ids.device.type == "cuda"
    assert torch.equal(batches[0].completion_ids, batches[1].completion_ids)
    assert generator_on(torch.Generator(), torch.device("cuda")).device.type == "cuda"


@pytest.mark.parametrize(("dtype", "atol"), [("float32", 1e-4), ("bfloat16", 0.1)])
def test_log_probs_on_cuda_match_the_cpu(dtype, atol):
    cpu_model, tokenizer = _model("cpu")
    batch = sample_completions(
        cpu_model, tokenizer, ["12+30=", "45+27="], 4, 12, 1.0, torch.Generator().manual_seed(1)
    )
    expected = completion_logprobs(cpu_model, *batch.model_inputs())
    cuda_model = _model("cuda")[0]
    inputs = [t.cuda() for t in batch.model_inputs()]
    with resolve_precision("cuda", dtype).autocast():
        got = completion_logprobs(cuda_model, *inputs).float().cpu()
    mask = batch.completion_mask.bool()
    assert torch.allclose(got[mask], expected[mask], atol=atol)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_grpo_step_on_cuda_updates_float32_weights_with_finite_values(dtype):
    task = task_spec(ArithmeticTaskConfig(digits=2, held_out_size=8))
    config = dataclasses.replace(
        GRPOConfig(), prompts_per_step=2, group_size=4, max_new_tokens=24, lr=1e-3
    )
    model, tokenizer = _model("cuda")
    before = [p.detach().clone() for p in model.parameters()]
    trainer = build_trainer(model, tokenizer, task.train_rows(0), [task.reward_fn], config, seed=0)
    with resolve_precision("cuda", dtype).autocast():
        result = grpo_step(
            trainer.plan, trainer.rollout, trainer.learner, trainer.state.generator, StepTimer()
        )
    assert result.batch.completion_ids.device.type == "cuda"
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    changed = any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert changed or result.metrics["reward/std"] == 0  # no signal in the group: no update


@pytest.mark.parametrize(("dtype", "atol"), [("float32", 1e-4), ("bfloat16", 0.1)])
def test_packed_log_probs_and_gradients_on_cuda_match_the_padded_forward(dtype, atol):
    """The packed forward on CUDA (per-segment SDPA through transformers' attention
    interface; flash attention's varlen path where the model runs flash) against the padded
    forward on the same device and precision."""
    from rlvr.models.packing import completion_logprobs_packed

    cpu_model, tokenizer = _model("cpu")
    batch = sample_completions(
        cpu_model,
        tokenizer,
        ["12+30=", "45+27=", "7+8="],
        4,
        16,
        1.0,
        torch.Generator().manual_seed(1),
    )
    model = _model("cuda")[0].train()
    inputs = [t.cuda() for t in batch.model_inputs()]
    mask = inputs[3].bool()
    grads = []
    outs = []
    for run in (completion_logprobs, completion_logprobs_packed):
        model.zero_grad()
        with resolve_precision("cuda", dtype).autocast():
            logp = run(model, *inputs).float()
        (logp * inputs[3]).sum().backward()
        outs.append(logp.detach()[mask])
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(outs[1], outs[0], atol=atol)
    scale = grads[0].abs().max()
    assert (grads[1] - grads[0]).abs().max() <= (1e-3 if dtype == "float32" else 0.1) * scale


def test_a_packed_grpo_step_on_cuda_logs_the_forward():
    task = task_spec(ArithmeticTaskConfig(digits=2, held_out_size=8))
    config = dataclasses.replace(
        GRPOConfig(), prompts_per_step=4, group_size=4, max_new_tokens=24, lr=1e-3, forward="packed"
    )
    model, tokenizer = _model("cuda")
    trainer = build_trainer(model, tokenizer, task.train_rows(0), [task.reward_fn], config, seed=0)
    result = grpo_step(
        trainer.plan, trainer.rollout, trainer.learner, trainer.state.generator, StepTimer()
    )
    assert all(torch.isfinite(p).all() for p in model.parameters())
    if result.metrics["reward/std"] > 0:
        assert result.metrics["update/packed"] == 1.0 and result.metrics["update/padding_frac"] == 0
