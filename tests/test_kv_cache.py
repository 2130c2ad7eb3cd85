import pytest
import torch
from transformers.cache_utils import DynamicLayer

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.rollout.kv_cache import PreallocatedLayer, decode_cache


def _kv(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (rows, 2, length, 3)  # [rows, heads, positions, head_dim]
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def test_preallocated_layer_holds_what_a_dynamic_layer_holds():
    """Prefill, repeat each row, decode, drop rows, decode: same keys and values as HF's."""
    ours, theirs = PreallocatedLayer(capacity=10), DynamicLayer()
    for layer in (ours, theirs):
        layer.update(*_kv(2, 4, seed=0))  # prefill of 2 prompts, 4 positions
        layer.batch_repeat_interleave(3)  # 6 rows: prompt 0 x3, prompt 1 x3
    for step in range(3):
        for layer in (ours, theirs):
            keys, values = layer.update(*_kv(6, 1, seed=step + 1))
        torch.testing.assert_close(keys, theirs.keys, rtol=0, atol=0)
    keep = torch.tensor([0, 2, 5])  # rows 1, 3, 4 finished
    for layer in (ours, theirs):
        layer.batch_select_indices(keep)
        keys, values = layer.update(*_kv(3, 1, seed=9))
    assert ours.get_seq_length() == theirs.get_seq_length() == 8
    torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=0)
    torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=0)


def test_preallocated_layer_refuses_to_overflow():
    layer = PreallocatedLayer(capacity=5)
    layer.update(*_kv(1, 4, seed=0))
    layer.update(*_kv(1, 1, seed=1))
    with pytest.raises(ValueError, match="5 positions"):
        layer.update(*_kv(1, 1, seed=2))


def test_decode_cache_is_preallocated_for_full_attention_models_only():
    model = build_tiny_model(
        TinyModelConfig(hidden_size=32, num_layers=2), build_char_tokenizer(), seed=0
    )
    cache = decode_cache(model, capacity=16)
    assert [type(layer) for layer in cache.layers] == [PreallocatedLayer] * 2
    assert not any(isinstance(x, PreallocatedLayer) for x in decode_cache(model, 16, False).layers)
    model.config.sliding_window = 8  # a windowed model keeps Hugging Face's own cache
    assert not any(isinstance(x, PreallocatedLayer) for x in decode_cache(model, 16).layers)


def test_the_cache_goes_by_the_name_the_forward_takes():
    """transformers 5.24 names the forward's KV cache `cache`; earlier 5.x (vLLM's CPU build
    pins < 5.20) `past_key_values`, and swallows a wrong name in **kwargs without a word."""
    from rlvr.models.logprobs import cache_argument

    class Older(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs): ...

    class Newer(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None, **kwargs): ...

    class Wrapper(torch.nn.Module):
        def forward(self, **kwargs): ...

    marker = object()
    assert cache_argument(Older(), marker) == {"past_key_values": marker}
    assert cache_argument(Newer(), marker) == {"cache": marker}
    # a wrapper passes it on to a model of the installed transformers: that release's name
    import inspect

    from transformers import LlamaForCausalLM

    installed = (
        "cache"
        if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
        else "past_key_values"
    )
    assert cache_argument(Wrapper(), marker) == {installed: marker}


# --- an episode's keys and values kept between turns ---------------------------------------


def _episode_turns(model, kept, turns=4, seed=0):
    """Four turns of eight episodes with environment tokens of varied length between turns
    (0 to 6), sampled at a high temperature so that some replies end early (EOS mid-batch).
    Returns each turn's outputs and the prompt widths each forward of the model was given."""
    import random

    from rlvr.rollout.sampler import sample_token_ids

    tokenizer = build_char_tokenizer()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rng = random.Random(seed)
    prompts = [[rng.randrange(5, 60) for _ in range(rng.randrange(3, 12))] for _ in range(8)]
    generator = torch.Generator().manual_seed(seed)
    widths: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    outputs = []
    try:
        for _ in range(turns):
            out = sample_token_ids(
                model, prompts, 30, 3.0, generator, eos, pad, kept=kept, keys=list(range(8))
            )
            outputs.append(out)
            for i, (ids, _) in enumerate(out):
                env = [rng.randrange(5, 60) for _ in range(rng.randrange(0, 7))]
                prompts[i] = prompts[i] + ids + env
    finally:
        hook.remove()
    return outputs, widths


def test_kept_episode_kv_samples_what_running_the_whole_conversation_samples():
    """Same ids, log-probs within 1e-5, rows leaving the decode batch at their EOS included;
    after the first turn each prefill runs only the tokens the cache lacks: the last reply's
    final token (never fed back while sampling) and the environment's (0 to 6)."""
    from rlvr.rollout.kv_cache import EpisodeKV

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(), tokenizer, seed=0)
    full, full_widths = _episode_turns(model, kept=None)
    kept, kept_widths = _episode_turns(model, kept=EpisodeKV())
    ended_early = 0
    for turn_full, turn_kept in zip(full, kept):
        for (ids_a, logp_a), (ids_b, logp_b) in zip(turn_full, turn_kept):
            assert ids_a == ids_b
            torch.testing.assert_close(
                torch.tensor(logp_b), torch.tensor(logp_a), atol=1e-5, rtol=0
            )
            ended_early += len(ids_a) < 30
    assert ended_early >= 3  # the leave-at-EOS path ran
    prefills_full = [w for w in full_widths if w > 1]
    prefills_kept = [w for w in kept_widths if w > 1]
    assert len(prefills_full) == len(prefills_kept) == 4
    assert prefills_kept[0] == prefills_full[0]  # the first turn has nothing kept
    assert all(w <= 1 + 6 for w in prefills_kept[1:])
    assert all(w > 30 for w in prefills_full[1:])  # the whole conversation again


def test_a_kept_episode_whose_prompt_changed_is_run_from_scratch():
    from rlvr.rollout.kv_cache import EpisodeKV
    from rlvr.rollout.sampler import sample_token_ids

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(), tokenizer, seed=0)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    kept = EpisodeKV()
    first = sample_token_ids(model, [[7, 8, 9]], 5, 0.0, None, eos, pad, kept=kept, keys=[0])
    assert kept.cached_length(0, [7, 8, 9, *first[0][0], 10]) == 3 + len(first[0][0]) - 1
    other = [11, 12, 13, 14]  # not the kept prompt's continuation
    assert kept.cached_length(0, other) == 0
    again = sample_token_ids(model, [other], 5, 0.0, None, eos, pad, kept=kept, keys=[0])
    fresh = sample_token_ids(model, [other], 5, 0.0, None, eos, pad)
    assert again[0][0] == fresh[0][0]
    kept.retain([])
    assert not kept.kept


def test_a_groups_shared_opening_is_prefilled_once():
    """A first turn whose episodes share their opening (a group) runs one prefill row per
    distinct opening; greedy replies and log-probs are those of one prefill per episode."""
    from rlvr.rollout.kv_cache import EpisodeKV
    from rlvr.rollout.sampler import sample_token_ids

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(), tokenizer, seed=0)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts = [[7, 8, 9]] * 3 + [[20, 21]] * 3
    rows: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        shared = sample_token_ids(
            model, prompts, 6, 0.0, None, eos, pad, kept=EpisodeKV(), keys=list(range(6))
        )
    finally:
        hook.remove()
    assert rows[0] == 2  # two distinct openings
    each = [sample_token_ids(model, [p], 6, 0.0, None, eos, pad)[0] for p in prompts]
    for (ids_a, logp_a), (ids_b, logp_b) in zip(shared, each):
        assert ids_a == ids_b
        torch.testing.assert_close(torch.tensor(logp_a), torch.tensor(logp_b), atol=1e-5, rtol=0)
