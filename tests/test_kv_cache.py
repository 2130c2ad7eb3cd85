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
