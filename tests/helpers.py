"""Small helpers shared by the test files."""

from __future__ import annotations

import torch

TINY_MODEL_FLAGS = [
    "--tiny.hidden-size",
    "32",
    "--tiny.num-layers",
    "1",
    "--tiny.num-heads",
    "2",
    "--tiny.intermediate-size",
    "64",
]
"""CLI flags of the smallest tiny model the tests train (32 wide, one layer, two heads)."""

SMALL_TRAIN_FLAGS = [
    *TINY_MODEL_FLAGS,
    "--base.steps",
    "3",
    "--base.batch-size",
    "4",
    "--grpo.steps",
    "2",
    "--grpo.prompts-per-step",
    "2",
    "--grpo.group-size",
    "2",
    "--eval-samples",
    "1",
    "--no-progress",
]
"""`rlvr train` flags of a two-step run from a three-step tiny base: a task trains end to end."""


def close(actual, expected, atol: float = 1e-6, *, dtype: torch.dtype = torch.float32) -> None:
    """Assert that ``actual`` equals ``expected`` elementwise within ``atol`` (no relative slack).

    Both sides (tensors, numbers or nested lists) are converted to tensors of ``dtype`` first,
    so a hand-written list can be compared with a tensor of any dtype. Pass
    ``dtype=torch.float64`` to compare float64 results without rounding them to float32.
    """
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=dtype),
        torch.as_tensor(expected, dtype=dtype),
        atol=atol,
        rtol=0,
    )


class ScriptedEngine:
    """A token-level engine (`generate_tokens`) for episode tests: call k replies with
    `replies[k]` (the last one again past the end), the same for every prompt, followed by
    EOS and cut to the budget (no EOS then), log-prob -0.5 a token; `prompts` records each
    call's prompt ids."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies = tokenizer, replies
        self.prompts: list[list[list[int]]] = []

    def generate_tokens(self, prompts, max_new_tokens, temperature, generator=None, **_):
        text = self.replies[min(len(self.prompts), len(self.replies) - 1)]
        self.prompts.append([list(p) for p in prompts])
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        out = (list(ids) + [self.tokenizer.eos_token_id])[:max_new_tokens]
        return [(out, [-0.5] * len(out)) for _ in prompts]


def tiny_llama(vocab: int, seed: int = 0, tie: bool = False, kv_heads: int = 2):
    """A two-layer Llama of width 32 (4 query heads, `kv_heads` key/value heads), with its
    real attention code (sdpa), in training mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return _tiny(LlamaConfig, LlamaForCausalLM, vocab, seed, kv_heads, tie_word_embeddings=tie)


def tiny_qwen2(vocab: int, seed: int = 0):
    """`tiny_llama`'s shape as Qwen2 (biases on q/k/v, one key/value head)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _tiny(Qwen2Config, Qwen2ForCausalLM, vocab, seed, 1)


def _tiny(config_class, model_class, vocab: int, seed: int, kv_heads: int, **extra):
    config = config_class(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        attn_implementation="sdpa",
        **extra,
    )
    torch.manual_seed(seed)
    return model_class(config).train()
