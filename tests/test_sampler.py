import itertools
from types import SimpleNamespace

import torch

from rlvr.models.logprobs import (
    completion_logprobs,
    completion_logprobs_shared_prompts,
    position_ids_from_mask,
)
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.rollout.sampler import sample_completions

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
PAD = TOKENIZER.pad_token_id


class MarkovModel(torch.nn.Module):
    """Deterministic: the next token is `table[last input token]` (EOS if absent). It sees only
    the tokens it is fed, so it works with any batch order, prefill sharing or row dropping."""

    def __init__(self, table: dict[int, int]):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.table = table
        self.calls: list[int] = []  # batch size of every forward pass

    def forward(self, input_ids, **kwargs):
        self.calls.append(input_ids.shape[0])
        logits = torch.full((input_ids.shape[0], 1, len(TOKENIZER)), -30.0)
        for i, last in enumerate(input_ids[:, -1].tolist()):
            logits[i, 0, self.table.get(last, EOS)] = 30.0
        return SimpleNamespace(logits=logits)


class EosBias(torch.nn.Module):
    """A model whose EOS logit is raised by `bias`, so that rows end at different steps."""

    def __init__(self, model: torch.nn.Module, bias: float):
        super().__init__()
        self.model, self.bias = model, bias
        self.config = model.config  # so the sampler picks the same KV cache as for `model`

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.logits[..., EOS] += self.bias
        return out


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def chain(text: str) -> dict[int, int]:
    """Transitions that spell `text` one character after another."""
    t = ids(text)
    return dict(zip(t[:-1], t[1:]))


# prompt "a" -> "12", "b" -> "", "c" -> "9999..." (never ends), "d" -> "7"
TABLE = {**chain("a12"), ids("2")[0]: EOS, ids("b")[0]: EOS, **chain("c9"), **chain("99")}
TABLE.update({**chain("d7"), ids("7")[0]: EOS})


def test_mask_ends_at_eos_and_truncation_is_flagged():
    model = MarkovModel(TABLE)
    batch = sample_completions(model, TOKENIZER, ["a", "b", "c", "d"], 2, 4, temperature=0)
    assert batch.completions == ["12", "12", "", "", "9999", "9999", "7", "7"]
    torch.testing.assert_close(
        batch.completion_mask[::2],
        torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]]).float(),
    )
    assert batch.truncated[::2].tolist() == [False, False, True, False]
    assert batch.lengths[::2].tolist() == [3, 1, 4, 2]  # EOS counts as a completion token
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # after EOS a row holds padding, and its log-probs are 0 there
    assert batch.completion_ids[2, 1:].tolist() == [PAD] * 3
    assert torch.all(batch.logprobs[batch.completion_mask == 0] == 0)


def test_prefill_runs_once_per_prompt_and_finished_rows_leave_the_batch():
    model = MarkovModel(TABLE)
    sample_completions(model, TOKENIZER, ["a", "b", "c", "d"], 2, 4, temperature=0)
    # prefill: 4 prompts, not 8 rows; then b's rows end at once, d's after 2 tokens, a's after 3
    assert model.calls == [4, 6, 4, 2]
    model.calls.clear()
    sample_completions(
        model,
        TOKENIZER,
        ["a", "b", "c", "d"],
        2,
        4,
        temperature=0,
        drop_finished=False,
        share_prompt_cache=False,
    )
    assert model.calls == [8, 8, 8, 8]  # every row decodes until the longest ends


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


def test_row_dropping_prompt_sharing_and_cache_preallocation_do_not_change_greedy_output():
    tiny = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), TOKENIZER, seed=3)
    model = EosBias(tiny, 0.92)  # rows end after 1 to 15 tokens, some never
    # unequal lengths: left padding exercised
    prompts = ["357+468=", "1+2=", "99-5=", "7=", "12+34=", "5+6=", "808-1=", "42="]
    outputs = []
    for drop, share, preallocate in itertools.product((True, False), repeat=3):
        batch = sample_completions(
            model,
            TOKENIZER,
            prompts,
            2,
            16,
            temperature=0,
            drop_finished=drop,
            share_prompt_cache=share,
            preallocate_cache=preallocate,
        )
        outputs.append(batch)
    lengths = set(outputs[0].lengths.tolist())
    assert len(lengths) >= 3 and 16 in lengths  # early ends and a truncation
    for other in outputs[1:]:
        assert other.completions == outputs[0].completions
        torch.testing.assert_close(other.completion_mask, outputs[0].completion_mask)
        torch.testing.assert_close(other.logprobs, outputs[0].logprobs, atol=1e-5, rtol=1e-5)


def test_sampling_logprobs_match_a_full_forward_pass():
    tiny = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), TOKENIZER, seed=1)
    model = EosBias(tiny, 2.0)  # rows of different lengths leave the decode batch early
    generator = torch.Generator().manual_seed(0)
    batch = sample_completions(
        model, TOKENIZER, ["12+34=", "5+6="], 3, 10, temperature=0.7, generator=generator
    )
    with torch.no_grad():
        logp = completion_logprobs(
            model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            temperature=0.7,
        )
    mask = batch.completion_mask
    assert len(set(batch.lengths.tolist())) >= 2
    torch.testing.assert_close(logp * mask, batch.logprobs, atol=1e-5, rtol=1e-5)


def test_sampling_is_seeded():
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), TOKENIZER, seed=1)

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        return sample_completions(model, TOKENIZER, ["1+1="], 4, 8, 1.0, g).completions

    assert draw(0) == draw(0)
    assert draw(0) != draw(1)


def test_sampling_in_worker_threads_matches_one_thread():
    """Prompts split across 2 worker threads: greedy output and log-probs as from one call;
    sampled output reproducible from the seed, with log-probs matching a full forward pass."""
    tiny = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), TOKENIZER, seed=3)
    model = EosBias(tiny, 0.92)
    prompts = ["357+468=", "1+2=", "99-5=", "7=", "12+34="]  # 5 prompts: shards of 2 and 3
    one = sample_completions(model, TOKENIZER, prompts, 2, 16, temperature=0)
    two = sample_completions(model, TOKENIZER, prompts, 2, 16, temperature=0, workers=2)
    assert two.completions == one.completions
    assert two.group_ids.tolist() == one.group_ids.tolist()
    torch.testing.assert_close(two.prompt_ids, one.prompt_ids)
    torch.testing.assert_close(two.logprobs, one.logprobs, atol=1e-5, rtol=1e-5)

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        return sample_completions(model, TOKENIZER, prompts, 3, 10, 0.7, g, workers=2)

    first, again = draw(0), draw(0)
    assert first.completions == again.completions
    assert first.completions != draw(1).completions
    assert model.training == tiny.training  # the mode is restored after the threads
    with torch.no_grad():
        logp = completion_logprobs(
            model,
            first.prompt_ids,
            first.prompt_mask,
            first.completion_ids,
            first.completion_mask,
            temperature=0.7,
        )
    torch.testing.assert_close(logp * first.completion_mask, first.logprobs, atol=1e-5, rtol=1e-5)


def test_shared_prompt_logprobs_and_gradients_equal_per_row_prompts():
    """Prompts of unequal length (left padding), completions of unequal length (right
    padding), groups in any row order, a row left out of its group."""
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), TOKENIZER, seed=2)
    batch = sample_completions(
        EosBias(model, 1.5),
        TOKENIZER,
        ["357+468=", "1+2=", "99-5="],
        3,
        10,
        1.0,
        torch.Generator().manual_seed(0),
    )
    rows = torch.tensor([4, 0, 8, 1, 3, 6, 7])  # group 1 then 0 then 2; rows 2 and 5 left out
    assert len(set(batch.lengths[rows].tolist())) >= 2
    cols = [t[rows] for t in (batch.prompt_ids, batch.prompt_mask, batch.completion_ids)]
    mask = batch.completion_mask[rows]
    model.train()
    results = []
    for shared in (False, True):
        model.zero_grad()
        if shared:
            logp = completion_logprobs_shared_prompts(
                model, *cols, mask, batch.group_ids[rows], temperature=0.7
            )
        else:
            logp = completion_logprobs(model, *cols, mask, temperature=0.7)
        (logp * mask).sum().backward()
        results.append((logp * mask, [p.grad.clone() for p in model.parameters()]))
    (plain, plain_grads), (shared, shared_grads) = results
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    for a, b in zip(plain_grads, shared_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
