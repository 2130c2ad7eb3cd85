"""Chunked log-probs (`chunk_tokens > 0`) and gradient checkpointing: the same values and
gradients as whole logits without checkpointing, on a small Hugging Face Llama with left-padded
prompts, right-padded completions and a temperature != 1."""

import copy
import dataclasses

import pytest
import torch
from transformers import LlamaForCausalLM

from rlvr.config import ConfigError
from rlvr.models.logprobs import (
    LinearLogprobs,
    _checkpointing,
    completion_logprobs,
    completion_logprobs_shared_prompts,
    decoder_and_head,
    token_logprobs,
)
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.timer import StepTimer
from rlvr.rollout.engine import HFEngine
from rlvr.tasks.arithmetic import ArithmeticTaskConfig, train_problems
from rlvr.train.config import GRPOConfig, Monitor, build_plan
from rlvr.train.grpo import build_trainer, enable_gradient_checkpointing, grpo_step
from tests.helpers import tiny_llama

VOCAB, N, P, T, G = 300, 6, 5, 7, 2
TEMPERATURE = 0.7


def llama(seed: int = 0, tie: bool = False) -> LlamaForCausalLM:
    return tiny_llama(VOCAB, seed, tie)


def padded_batch():
    """Prompts left-padded (shared by the G rows of a group), completions right-padded (one
    row of a single token); padding positions hold token ids too, as a batch's do."""
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, VOCAB, (N // G, P), generator=g).repeat_interleave(G, dim=0)
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    prompt_mask[0:2, :2] = 0  # group 0's prompt is 3 tokens, group 2's 4
    prompt_mask[4:6, :1] = 0
    completion_ids = torch.randint(0, VOCAB, (N, T), generator=g)
    lengths = torch.tensor([4, 7, 1, 5, 7, 6])
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    group_ids = torch.arange(N) // G
    return (prompt_ids, prompt_mask, completion_ids, completion_mask), group_ids


def values_and_grads(model, shared: bool, chunk: int, temperature: float = TEMPERATURE):
    """(masked log-probs [N, T], gradients of their sum) under `model`."""
    cols, group_ids = padded_batch()
    mask = cols[3]
    model.zero_grad()
    if shared:
        logp = completion_logprobs_shared_prompts(model, *cols, group_ids, temperature, chunk)
    else:
        logp = completion_logprobs(model, *cols, temperature, chunk)
    (logp * mask).sum().backward()
    grads = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    return logp.detach(), mask, grads


def assert_same(a, b):
    (logp_a, mask, grads_a), (logp_b, _, grads_b) = a, b
    torch.testing.assert_close(logp_a * mask, logp_b * mask, atol=1e-6, rtol=1e-6)
    for x, y in zip(grads_a, grads_b):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def graph_names(tensor: torch.Tensor) -> set[str]:
    """Names of the autograd nodes `tensor` was computed through."""
    names, stack, seen = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(fn for fn, _ in node.next_functions)
    return names


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_fused_chunked_logprobs_and_gradients_equal_whole_logits(shared, chunk):
    model = llama(tie=shared)  # tied and untied heads both get their gradient
    whole = values_and_grads(model, shared=False, chunk=0)
    chunked = values_and_grads(model, shared=shared, chunk=chunk)
    assert_same(chunked, whole)
    logp, mask, _ = chunked
    assert torch.all(logp[mask == 0] == 0)  # padding is skipped, not computed
    cols, group_ids = padded_batch()
    assert "LinearLogprobsBackward" in graph_names(completion_logprobs(model, *cols, 0.7, chunk))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_checkpointed_chunks_of_any_other_head_equal_whole_logits(shared, chunk):
    """A hooked head is not a plain Linear: each chunk runs it under torch.utils.checkpoint,
    never on more than `chunk` tokens (the forward, then the backward's recompute)."""
    model = llama(tie=shared)
    whole = values_and_grads(model, shared=False, chunk=0)
    head_rows = []
    hook = model.lm_head.register_forward_hook(lambda m, args, out: head_rows.append(out.shape))
    chunked = values_and_grads(model, shared=shared, chunk=chunk)
    hook.remove()
    assert_same(chunked, whole)
    real_tokens = int(padded_batch()[0][3].sum())
    assert all(len(shape) == 2 and shape[0] <= chunk for shape in head_rows)
    assert sum(shape[0] for shape in head_rows) == 2 * real_tokens  # forward + recompute


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_logprobs_with_a_bias_match_autograd(dtype):
    g = torch.Generator().manual_seed(1)
    states = torch.randn(11, 16, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(40, 16, generator=g).to(dtype).requires_grad_()
    bias = torch.randn(40, generator=g).to(dtype).requires_grad_()
    ids = torch.randint(0, 40, (11,), generator=g)
    upstream = torch.randn(11, generator=g)
    results = []
    for fused in (False, True):
        if fused:
            logp = LinearLogprobs.apply(states, weight, bias, ids, 0.7, 4)
        else:
            logits = torch.nn.functional.linear(states, weight, bias)
            logp = token_logprobs(logits[None], ids[None], 0.7)[0]
        grads = torch.autograd.grad((logp * upstream).sum(), (states, weight, bias))
        results.append((logp, grads))
    (plain, plain_grads), (fused, fused_grads) = results
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    torch.testing.assert_close(fused, plain, **tol)
    for a, b in zip(fused_grads, plain_grads):
        assert a.dtype == dtype
        torch.testing.assert_close(a, b, **tol)


def test_chunked_logprobs_without_gradients_and_at_temperature_one():
    model = llama()
    cols, group_ids = padded_batch()
    mask = cols[3]
    with torch.no_grad():  # the reference's forward: no checkpoint, same values
        whole = completion_logprobs(model, *cols, 1.0)
        chunked = completion_logprobs(model, *cols, 1.0, 4)
        shared = completion_logprobs_shared_prompts(model, *cols, group_ids, 1.0, 4)
    assert not chunked.requires_grad
    torch.testing.assert_close(chunked * mask, whole * mask, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(shared * mask, whole * mask, atol=1e-6, rtol=1e-6)


def test_models_that_cannot_be_split_take_whole_logits():
    class Shifted(torch.nn.Module):  # its own forward: the head alone would not match it
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, **kwargs):
            out = self.model(**kwargs)
            out.logits[..., 0] += 3.0
            return out

    model = llama()
    wrapped = Shifted(model)
    assert decoder_and_head(model) is not None and decoder_and_head(wrapped) is None
    assert_same(
        values_and_grads(wrapped, shared=False, chunk=3),
        values_and_grads(wrapped, shared=False, chunk=0),
    )


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")  # peft's call
def test_a_lora_model_is_chunked_through_its_base_model():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        llama(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    for p in model.parameters():  # LoRA's B starts at 0: give the adapters an effect
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.1)
    decoder, head = decoder_and_head(model)
    assert any("lora" in name for name, _ in decoder.named_modules())
    for shared in (False, True):
        assert_same(
            values_and_grads(model, shared=shared, chunk=3),
            values_and_grads(model, shared=False, chunk=0),
        )


@pytest.mark.parametrize("chunk", [0, 3])
def test_gradient_checkpointing_gives_the_same_gradients(chunk):
    plain = llama()
    checkpointed = copy.deepcopy(plain)
    enable_gradient_checkpointing(checkpointed)
    for shared in (False, True):  # shared prompts fall back to a prompt per row
        assert_same(
            values_and_grads(checkpointed, shared=shared, chunk=chunk),
            values_and_grads(plain, shared=False, chunk=0),
        )


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="logprob_chunk_tokens must be >= 0"):
        build_plan(GRPOConfig(max_new_tokens=8, logprob_chunk_tokens=-1))
    plan = build_plan(GRPOConfig(max_new_tokens=8, gradient_checkpointing=True))
    assert plan.gradient_checkpointing and "shared-prompt" not in plan.forwards
    assert plan.logprob_chunk_tokens == GRPOConfig().logprob_chunk_tokens
    with pytest.raises(ConfigError, match="gradient_checkpointing=true needs a Hugging Face"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


def test_a_step_with_gradient_checkpointing_equals_one_without():
    """build_trainer switches it on; sampling (eval mode) keeps its KV cache and samples the
    same completions; the update's gradient is the same."""
    tokenizer = build_char_tokenizer()
    config = GRPOConfig(
        prompts_per_step=2, group_size=3, max_new_tokens=8, cpu_workers=1, monitor=Monitor(every=0)
    )

    def reward(prompts, completions, **_):
        return [len(c) % 3 / 2 for c in completions]

    results = []
    for on in (False, True):
        policy = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), tokenizer, 0)
        problems = train_problems(ArithmeticTaskConfig(digits=2), seed=0)  # a fresh stream
        rows = ({"prompt": p.prompt, "answer": p.answer} for p in problems)
        t = build_trainer(
            policy,
            tokenizer,
            rows,
            [reward],
            dataclasses.replace(config, gradient_checkpointing=on),
            seed=0,
            engine=HFEngine(policy, tokenizer),
        )
        assert _checkpointing(policy) == on
        result = grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())
        results.append((result, [p.grad for p in policy.parameters()]))
    (off, off_grads), (on, on_grads) = results
    assert on.batch.completions == off.batch.completions
    assert on.metrics["loss"] == pytest.approx(off.metrics["loss"], abs=1e-6)
    for a, b in zip(off_grads, on_grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_the_learner_chunks_the_loss_and_the_reference_as_configured(monkeypatch):
    """A step with logprob_chunk_tokens set runs the fused chunked head (in the loss and the
    reference forward) and gives the whole-logits step's loss and gradients."""
    import rlvr.models.logprobs as logprobs

    calls = []
    real_apply = logprobs.LinearLogprobs.apply

    def counting_apply(*args):
        calls.append(args[-1])  # the chunk size
        return real_apply(*args)

    monkeypatch.setattr(logprobs.LinearLogprobs, "apply", counting_apply)
    tokenizer = build_char_tokenizer()
    config = GRPOConfig(
        prompts_per_step=2, group_size=3, max_new_tokens=8, cpu_workers=1, beta=0.1, lr=1e-3
    )

    def reward(prompts, completions, **_):
        return [len(c) % 3 / 2 for c in completions]

    results = []
    for chunk in (0, 3):
        policy = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), tokenizer, 0)
        problems = train_problems(ArithmeticTaskConfig(digits=2), seed=0)
        rows = ({"prompt": p.prompt, "answer": p.answer} for p in problems)
        replaced = dataclasses.replace(config, logprob_chunk_tokens=chunk)
        t = build_trainer(policy, tokenizer, rows, [reward], replaced, seed=0)
        calls.clear()
        result = grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())
        results.append((result.metrics["loss"], [p.detach().clone() for p in policy.parameters()]))
        assert (calls and set(calls) == {3}) if chunk else not calls
        if chunk:
            assert len(calls) >= 2  # the reference forward and the loss's
    (loss0, params0), (loss3, params3) = results
    assert loss3 == pytest.approx(loss0, abs=1e-6)
    for a, b in zip(params0, params3):  # after one AdamW step of lr 1e-3 (~1e-3 per weight)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
