from types import SimpleNamespace

import torch

from rlvr.models.logprobs import completion_logprobs
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.rollout.sampler import position_ids_from_mask, sample_completions

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
PAD = TOKENIZER.pad_token_id


class ScriptedModel(torch.nn.Module):
    """Emits a fixed token script per row: row i's step-t token is script[i][t]."""

    def __init__(self, script: list[list[int]], prompt_len: int):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.script = script
        self.prompt_len = prompt_len

    def forward(self, input_ids, attention_mask, **kwargs):
        step = attention_mask.shape[1] - self.prompt_len
        logits = torch.full((input_ids.shape[0], 1, len(TOKENIZER)), -30.0)
        for i, row in enumerate(self.script):
            logits[i, 0, row[min(step, len(row) - 1)]] = 30.0
        return SimpleNamespace(logits=logits)


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def test_mask_ends_at_eos_and_truncation_is_flagged():
    # 2 prompts x 2 samples; rows stop after 2 chars, 0 chars, never, 1 char
    script = [ids("12") + [EOS], [EOS], ids("99999"), ids("7") + [EOS]]
    model = ScriptedModel(script, prompt_len=len(ids("1+1=")))
    batch = sample_completions(model, TOKENIZER, ["1+1=", "2+2="], 2, 4, temperature=0)
    assert batch.completions == ["12", "", "9999", "7"]
    torch.testing.assert_close(
        batch.completion_mask,
        torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]).float(),
    )
    assert batch.truncated.tolist() == [False, False, True, False]
    assert batch.lengths.tolist() == [3, 1, 4, 2]  # EOS counts as a completion token
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    # after EOS a row holds padding, and its log-probs are 0 there
    assert batch.completion_ids[1, 1:].tolist() == [PAD] * 3
    assert torch.all(batch.logprobs[batch.completion_mask == 0] == 0)


def test_position_ids_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def _naive_greedy(model, prompt: str, max_new_tokens: int) -> list[int]:
    """Reference: full forward over the whole sequence for every new token, no cache."""
    tokens = ids(prompt)
    out = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0, -1]
        token = int(logits.argmax())
        out.append(token)
        if token == EOS:
            break
        tokens.append(token)
    return out


def test_cached_batched_greedy_matches_naive_decoding():
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), TOKENIZER, seed=0)
    prompts = ["357+468=", "1+2=", "99-5="]  # unequal lengths: left padding is exercised
    batch = sample_completions(model, TOKENIZER, prompts, 1, 12, temperature=0)
    for i, prompt in enumerate(prompts):
        expected = _naive_greedy(model, prompt, 12)
        n = int(batch.lengths[i])
        assert batch.completion_ids[i, :n].tolist() == expected


def test_sampling_logprobs_match_a_full_forward_pass():
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), TOKENIZER, seed=1)
    generator = torch.Generator().manual_seed(0)
    batch = sample_completions(
        model, TOKENIZER, ["12+34=", "5+6="], 3, 10, temperature=0.7, generator=generator
    )
    with torch.no_grad():
        logp = completion_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
            batch.completion_mask, temperature=0.7,
        )  # fmt: skip
    mask = batch.completion_mask
    torch.testing.assert_close(logp * mask, batch.logprobs, atol=1e-5, rtol=1e-5)


def test_sampling_is_seeded():
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), TOKENIZER, seed=1)

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        return sample_completions(model, TOKENIZER, ["1+1="], 4, 8, 1.0, g).completions

    assert draw(0) == draw(0)
    assert draw(0) != draw(1)
