"""Token entropy from the loss's forward pass (`with_entropy=True`): hand-computed values on a
padded logits tensor, the chunked paths equal to whole logits, the gradients unchanged bit for
bit, and the step's `policy/entropy` a token mean over the loss mask."""

import math

import pytest
import torch

from rlvr import algo
from rlvr.models.logprobs import (
    chunked_token_logprobs,
    completion_logprobs,
    completion_logprobs_shared_prompts,
    token_logprobs,
)

# a 2-layer Llama; 6 rows (groups of 2) of left-padded prompts and right-padded completions
from tests.test_logprobs_chunked import TEMPERATURE, VOCAB, N, P, T, llama, padded_batch


def test_uniform_is_log_v_and_one_hot_is_near_zero():
    v = 8
    logits = torch.zeros(1, 3, v)  # position 0: uniform
    logits[0, 1, 3] = 40.0  # position 1: one token holds all but e^-40 of the mass
    logits[0, 2] = torch.tensor([math.log(1.0), math.log(3.0)] + [-1e4] * (v - 2))  # [1/4, 3/4]
    ids = torch.tensor([[0, 3, 1]])
    logp, entropy = token_logprobs(logits, ids, temperature=1.0, with_entropy=True)
    assert entropy[0, 0].item() == pytest.approx(math.log(8), abs=1e-6)
    assert 0.0 <= entropy[0, 1].item() < 1e-12 * 1e6  # ~41 e^-40, below 1e-6
    two = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623
    assert entropy[0, 2].item() == pytest.approx(two, abs=1e-6)
    assert logp[0, 1].item() == pytest.approx(0.0, abs=1e-6)
    assert torch.equal(logp, token_logprobs(logits, ids, temperature=1.0))


def test_temperature_scales_the_distribution_it_measures():
    logits = torch.tensor([[[2.0, 0.0]]])
    _, entropy = token_logprobs(logits, torch.tensor([[0]]), temperature=2.0, with_entropy=True)
    p = 1 / (1 + math.exp(-1.0))  # softmax([1, 0])
    assert entropy.item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)), 1e-6)


def test_chunked_head_equals_whole_logits_and_is_zero_on_padding():
    torch.manual_seed(1)
    hidden = torch.randn(2, 3, 6)
    head = torch.nn.Linear(6, VOCAB)
    ids = torch.randint(0, VOCAB, (2, 3))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    _, whole = token_logprobs(head(hidden), ids, TEMPERATURE, with_entropy=True)
    for chunk in (1, 2, 5):
        logp, entropy = chunked_token_logprobs(
            hidden, head, ids, mask, TEMPERATURE, chunk, with_entropy=True
        )
        torch.testing.assert_close(entropy[mask.bool()], whole[mask.bool()], atol=1e-5, rtol=0)
        assert torch.equal(entropy[~mask.bool()], torch.zeros(3))


@pytest.mark.parametrize("shared", [False, True])
def test_model_paths_agree(shared):
    model = llama()
    inputs, groups = padded_batch()
    mask = inputs[3].bool()

    def run(chunk):
        if shared:
            return completion_logprobs_shared_prompts(
                model, *inputs, groups, TEMPERATURE, chunk, with_entropy=True
            )
        return completion_logprobs(model, *inputs, TEMPERATURE, chunk, with_entropy=True)

    _, whole = run(0)
    for chunk in (1, 3):
        _, chunked = run(chunk)
        torch.testing.assert_close(chunked[mask], whole[mask], atol=1e-5, rtol=0)
    assert whole[mask].min() > 0 and whole[mask].max() <= math.log(VOCAB) + 1e-5


def _hooked_head(model):
    """The head with a forward hook: not a plain Linear, so chunks run under checkpoint."""
    model.lm_head.register_forward_hook(lambda module, args, out: out)
    return model


@pytest.mark.parametrize("chunk", [0, 2])
@pytest.mark.parametrize("hooked", [False, True])
def test_gradients_bit_identical_with_and_without_entropy(chunk, hooked):
    inputs, _ = padded_batch()
    weights = torch.randn(N, T, generator=torch.Generator().manual_seed(3))

    def grads(with_entropy):
        model = llama(seed=2)
        if hooked:
            _hooked_head(model)
        out = completion_logprobs(model, *inputs, TEMPERATURE, chunk, with_entropy=with_entropy)
        logp = out[0] if with_entropy else out
        (logp * weights * inputs[3]).sum().backward()
        return [p.grad.clone() for p in model.parameters()], logp.detach()

    plain, logp_plain = grads(False)
    measured, logp_measured = grads(True)
    assert torch.equal(logp_plain, logp_measured)
    assert all(torch.equal(a, b) for a, b in zip(plain, measured))
    assert any(a.abs().sum() > 0 for a in plain)


def test_step_entropy_is_the_loss_mask_token_mean():
    """`policy/entropy` of a two-micro-batch update equals the masked mean over the whole
    batch's loss-mask tokens of the entropies of one whole-batch forward pass."""
    from rlvr.rollout.sampler import RolloutBatch
    from rlvr.train.update import accumulate_gradients, plan_update_work

    model = llama(seed=4)
    (prompt_ids, prompt_mask, completion_ids, completion_mask), groups = padded_batch()
    batch = RolloutBatch(
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        logprobs=torch.zeros(N, T),
        truncated=torch.zeros(N, dtype=torch.bool),
        group_ids=groups,
        completions=[""] * N,
    )
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.25, -0.25])
    loss_mask = completion_mask.clone()
    loss_mask[1, 3:] = 0  # a loss mask narrower than the completion mask

    def loss_fn(logp, old, adv, mask, *, ref_logp=None, **divisors):
        return algo.policy_loss(logp, old, adv, mask, **divisors)

    work = plan_update_work(
        batch,
        advantages,
        loss_mask,
        skip_zero_advantage=True,
        workers=1,
        micro_batch_tokens=2 * (P + T),  # two rows a micro-batch
        forwards=("padded",),
    )
    assert len(work.parts) == 3
    result = accumulate_gradients(
        model, batch, work, advantages, loss_mask, None, loss_fn, TEMPERATURE, 1
    )
    with torch.no_grad():
        _, entropy = completion_logprobs(
            model,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            TEMPERATURE,
            with_entropy=True,
        )
    expected = (entropy * loss_mask).sum() / loss_mask.sum()
    assert result.metrics["policy/entropy"] == pytest.approx(expected.item(), abs=1e-5)
