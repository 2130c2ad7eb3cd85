"""Packed sequences (`rlvr.models.packing`): the rows of a micro-batch end to end, attention
per segment. Log-probs equal each row's own unpadded forward (fp32, 1e-5) on the tiny model, a
tiny Llama and a tiny Qwen2 with their real attention code (grouped-query heads, Qwen2's
biases); gradients equal the padded forward's; nothing crosses a boundary; no mask, no cache."""

from __future__ import annotations

import pytest
import torch

from rlvr.models.logprobs import completion_logprobs
from rlvr.models.packing import (
    PackingError,
    completion_logprobs_packed,
    enable_packing,
    pack_rows,
    packed_forward_inputs,
)
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from tests.helpers import tiny_llama, tiny_qwen2

VOCAB = 64


def tiny() -> torch.nn.Module:
    return build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2), build_char_tokenizer(), 0
    )


def llama() -> torch.nn.Module:
    return tiny_llama(VOCAB)


def qwen2() -> torch.nn.Module:
    return tiny_qwen2(VOCAB)


MODELS = {"tiny": tiny, "llama": llama, "qwen2": qwen2}
PROMPTS = [7, 3, 5, 1, 6]  # real prompt tokens per row (left-padded to 7)
COMPLETIONS = [9, 2, 5, 4, 1]  # real completion tokens per row (right-padded to 9)


def batch(seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Left-padded prompts, right-padded completions, padding ids that are real tokens (a
    pass that read them would change)."""
    g = torch.Generator().manual_seed(seed)
    n, p, t = len(PROMPTS), max(PROMPTS), max(COMPLETIONS)
    prompt_ids = torch.randint(5, VOCAB, (n, p), generator=g)
    completion_ids = torch.randint(5, VOCAB, (n, t), generator=g)
    prompt_mask = torch.zeros((n, p), dtype=torch.long)
    completion_mask = torch.zeros((n, t))
    for i, (a, b) in enumerate(zip(PROMPTS, COMPLETIONS)):
        prompt_mask[i, p - a :] = 1
        completion_mask[i, :b] = 1.0
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def row_alone(model, prompt_ids, prompt_mask, completion_ids, completion_mask, i, chunk):
    """Row i's log-probs from a forward over that row alone, unpadded."""
    p, c = int(prompt_mask[i].sum()), int(completion_mask[i].sum())
    return completion_logprobs(
        model,
        prompt_ids[i : i + 1, prompt_ids.shape[1] - p :],
        prompt_mask[i : i + 1, prompt_ids.shape[1] - p :],
        completion_ids[i : i + 1, :c],
        completion_mask[i : i + 1, :c],
        0.7,
        chunk,
        True,
    )


@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("name", list(MODELS))
def test_packed_logprobs_equal_each_rows_own_unpadded_forward(name, chunk):
    model = MODELS[name]().eval()
    inputs = batch()
    with torch.no_grad():
        logp, entropy = completion_logprobs_packed(model, *inputs, 0.7, chunk, True)
        for i, c in enumerate(COMPLETIONS):
            alone, alone_entropy = row_alone(model, *inputs, i, chunk)
            torch.testing.assert_close(logp[i, :c], alone[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(entropy[i, :c], alone_entropy[0], atol=1e-5, rtol=0)
            assert (logp[i, c:] == 0).all()  # padding holds 0


@pytest.mark.parametrize("name", list(MODELS))
def test_packed_gradients_equal_the_padded_forwards(name):
    model = MODELS[name]().train()
    prompt_ids, prompt_mask, completion_ids, completion_mask = inputs = batch()
    weights = torch.linspace(-1.0, 2.0, completion_mask.numel()).view(completion_mask.shape)

    def grads(fn):
        model.zero_grad()
        ((fn(model, *inputs, 0.7) * weights * completion_mask).sum()).backward()
        return [p.grad.clone() for p in model.parameters()]

    padded, packed = grads(completion_logprobs), grads(completion_logprobs_packed)
    for a, b in zip(padded, packed):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)


def test_no_label_crosses_a_boundary_and_no_token_attends_across_one():
    prompt_ids, prompt_mask, completion_ids, completion_mask = inputs = batch()
    ids, positions, bounds, labels = pack_rows(*inputs)
    # rows of 16, 5, 10, 5 and 7 tokens, packed shortest first (stable): rows 1, 3, 4, 2, 0
    assert bounds.tolist() == [0, 5, 10, 17, 27, 43]
    assert positions[:5].tolist() == positions[5:10].tolist() == list(range(5))
    assert positions[27:].tolist() == list(range(16))
    start = {1: 0, 3: 5, 4: 10, 2: 17, 0: 27}
    length = {i: PROMPTS[i] + COMPLETIONS[i] for i in range(5)}
    rows, _ = (completion_mask != 0).nonzero(as_tuple=True)
    for label, row in zip(labels.tolist(), rows.tolist()):
        # the state before a completion token, inside its row: never a segment's last token
        assert start[row] + PROMPTS[row] - 1 <= label <= start[row] + length[row] - 2
    assert (ids[labels + 1] == completion_ids[completion_mask != 0]).all()
    model = tiny().eval()
    with torch.no_grad():
        before = completion_logprobs_packed(model, *inputs)
        changed = completion_ids.clone()
        changed[1] = (changed[1] + 1) % 60 + 5  # row 1 only: the first segment of the pack
        after = completion_logprobs_packed(model, prompt_ids, prompt_mask, changed, completion_mask)
    others = [0, 2, 3, 4]  # all packed after it: none of them may see it
    assert torch.equal(after[others], before[others])
    assert not torch.equal(after[1], before[1])


def test_a_packed_pass_refuses_a_mask_and_creates_no_cache(monkeypatch):
    model = tiny().eval()
    enable_packing(model)
    ids, positions, bounds, _ = pack_rows(*batch())
    inputs = packed_forward_inputs(ids, positions, bounds)
    with pytest.raises(PackingError, match="no attention mask"):
        model(**{**inputs, "attention_mask": torch.ones((1, len(ids)), dtype=torch.long)})
    from transformers import cache_utils

    made = []
    original = cache_utils.DynamicCache.__init__
    monkeypatch.setattr(
        cache_utils.DynamicCache,
        "__init__",
        lambda self, *a, **k: made.append(1) or original(self, *a, **k),
    )
    with torch.no_grad():
        model(**inputs)
        completion_logprobs_packed(model, *batch())
    assert made == []


def test_holes_in_a_mask_and_eager_attention_are_refused():
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch()
    holed = completion_mask.clone()
    holed[0, 3] = 0.0
    with pytest.raises(PackingError, match="holes"):
        completion_logprobs_packed(tiny(), prompt_ids, prompt_mask, completion_ids, holed)
    model = llama()
    model.config._attn_implementation = "eager"
    with pytest.raises(PackingError, match="sdpa or flash"):
        completion_logprobs_packed(
            model, prompt_ids % VOCAB, prompt_mask, completion_ids % VOCAB, completion_mask
        )


def test_padded_passes_of_a_packing_model_are_unchanged():
    """Switching a model to the packed-aware attention changes none of its other passes (the
    sampler's, the padded update's): bit for bit."""
    model = tiny().eval()
    inputs = batch()
    with torch.no_grad():
        before = completion_logprobs(model, *inputs)
        enable_packing(model)
        after = completion_logprobs(model, *inputs)
    assert torch.equal(before, after)


@pytest.mark.real
def test_packed_logprobs_on_smollm2_equal_each_rows_own_forward():
    """The real checkpoint (`rlvr models prepare smollm2-135m-instruct` first): chat-template
    prompts and completions of different lengths, packed, against each row alone (fp32,
    1e-5)."""
    from rlvr.models.tiny import load_model
    from rlvr.pipelines.base_model import prepared_model_dir

    directory = prepared_model_dir("smollm2-135m-instruct")
    if not (directory / "config.json").exists():
        pytest.skip("needs: rlvr models prepare smollm2-135m-instruct")
    model, tokenizer = load_model(directory)
    questions = ["What is 2+2?", "Name a prime number larger than ten, please.", "Hi"]
    answers = ["4", "Eleven is one.", "Hello! How can I help you today?"]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    prompts = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    completions = tokenizer(
        answers, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
    )
    inputs = (
        prompts["input_ids"],
        prompts["attention_mask"],
        completions["input_ids"],
        completions["attention_mask"].float(),
    )
    model.eval()
    with torch.no_grad():
        logp = completion_logprobs_packed(model, *inputs, 1.0, 1024)
        for i in range(len(questions)):
            p = int(inputs[1][i].sum())
            c = int(inputs[3][i].sum())
            alone = completion_logprobs(
                model,
                inputs[0][i : i + 1, -p:],
                inputs[1][i : i + 1, -p:],
                inputs[2][i : i + 1, :c],
                inputs[3][i : i + 1, :c],
                1.0,
                1024,
            )
            torch.testing.assert_close(logp[i, :c], alone[0], atol=1e-5, rtol=0)
