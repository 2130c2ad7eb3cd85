"""The tiny default model and its character-level tokenizer, both built locally.

Nothing here downloads anything. The tokenizer is a `tokenizers` WordLevel model over single
characters (printable ASCII, newline, and a few special tokens), wrapped as a Hugging Face fast
tokenizer. Its directory carries a `tokenizer_config.json` naming the generic fast-tokenizer
class, so `AutoTokenizer.from_pretrained(dir)` gives back exactly this tokenizer.

The model is a Llama-architecture causal LM. Qwen2 would do as well numerically, but transformers
5 loads Qwen2's own tokenizer class for any `qwen2` directory whatever `tokenizer_config.json`
says (qwen2 is on its list of models with an "incorrect hub tokenizer class"), which silently
changes how text is split; a Llama config leaves the saved tokenizer alone.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast

from rlvr.config import ConfigError, UserError

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
THINK_TOKENS = ("<think>", "</think>")
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN, *THINK_TOKENS)
CHARACTERS = tuple(dict.fromkeys(string.digits + string.ascii_letters + string.punctuation + " \n"))


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny Llama-architecture model (about 1.2 M parameters by default).

    Three layers of width 160 learned the lab's task better per second of CPU than four of
    width 128 (measured: the latter's base still mis-copied digits after the same time).
    """

    hidden_size: int = 160
    """Width of the residual stream."""
    num_layers: int = 3
    """Number of transformer blocks."""
    num_heads: int = 4
    """Attention heads (key/value heads are the same number)."""
    intermediate_size: int = 640
    """Width of the SwiGLU MLP."""
    max_positions: int = 256
    """Longest sequence (prompt + completion) the model accepts."""


def check_tiny(tiny: TinyModelConfig, longest: int, prefix: str = "--tiny.") -> None:
    """Refuse a shape the tiny model cannot be built with, or one too short for the task's
    sequences (`longest`: prompt + completion budget, in tokens), as a `ConfigError` naming
    the field as `prefix` + its name (a flag when `prefix` is one)."""

    def name(field: str) -> str:
        return prefix + (field.replace("_", "-") if prefix.startswith("--") else field)

    for field in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        if getattr(tiny, field) < 1:
            raise ConfigError(f"{name(field)} must be >= 1, got {getattr(tiny, field)}")
    head_dim, rest = divmod(tiny.hidden_size, tiny.num_heads)
    if rest or head_dim % 2:
        raise ConfigError(
            f"{name('hidden_size')} {tiny.hidden_size} must split into {name('num_heads')} "
            f"{tiny.num_heads} heads of an even width (rotary positions pair the dimensions)"
        )
    if tiny.max_positions < longest:
        raise ConfigError(
            f"{name('max_positions')} {tiny.max_positions} is shorter than the task's longest "
            f"sequence ({longest} tokens: prompt + completion budget); raise it"
        )


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: one token per character, special tokens kept whole."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=list(THINK_TOKENS),
    )
    tokenizer.padding_side = "left"  # generation batches are left-padded
    return tokenizer


def build_tiny_model(config: TinyModelConfig, tokenizer, seed: int) -> torch.nn.Module:
    """A freshly initialised Llama-architecture causal LM sized by `config`, seeded by `seed`."""
    hf_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=True,
        attention_bias=True,  # as Qwen2: a query/key bias lets RoPE attend by relative position
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(hf_config)


def save_model(model: torch.nn.Module, tokenizer, directory: str | Path) -> Path:
    """Save `model` and `tokenizer` as an ordinary Hugging Face directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    _pin_tokenizer_class(directory)
    return directory


def _pin_tokenizer_class(directory: Path) -> None:
    """Name the generic fast class in tokenizer_config.json so AutoTokenizer loads it as is."""
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2))


class ModelDirectoryError(UserError, FileNotFoundError):
    """A model directory that does not exist or is not a complete Hugging Face model."""


def check_model_dir(directory: str | Path) -> Path:
    """`directory` as a Path if it holds a Hugging Face model's files (a config, weights and a
    tokenizer), else a `ModelDirectoryError` naming what is missing; loads nothing, so entry
    points call it before any work."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelDirectoryError(f"model directory {directory} does not exist")
    if not (directory / "config.json").exists():
        raise ModelDirectoryError(f"{directory} has no config.json: not a Hugging Face model")
    weights = list(directory.glob("*.safetensors")) + list(directory.glob("*.bin"))
    if not weights:
        raise ModelDirectoryError(f"{directory} has no weights (*.safetensors or *.bin)")
    if not any((directory / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelDirectoryError(f"{directory} has no tokenizer (tokenizer.json)")
    return directory


def load_model(
    directory: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
):
    """Load (model, tokenizer) from a local Hugging Face directory onto `device` (weights in
    `dtype`); never touches the Hub.

    Raises `ModelDirectoryError` (a FileNotFoundError and a `UserError`) naming what is
    missing when the directory does not exist or lacks a config, weights or a tokenizer.
    """
    directory = check_model_dir(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    return model.to(device), tokenizer


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
