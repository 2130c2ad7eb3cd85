import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.models.tiny import (
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    count_parameters,
    load_model,
    save_model,
)

TEXTS = [
    "357+468=7+8+0=15 5+6+1=12 3+4+1=08 #### 825",
    "<think>a b\nc</think> \\boxed{1/2}",
    "  leading and   repeated spaces ",
]


def test_default_model_is_about_one_million_parameters():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(), tokenizer, seed=0)
    assert 0.8e6 < count_parameters(model) < 1.5e6


def test_round_trip_through_auto_classes_keeps_tokenization(tmp_path):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), tokenizer, seed=0)
    save_model(model, tokenizer, tmp_path)

    loaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert loaded(text)["input_ids"] == ids
        assert loaded.decode(ids) == text
    # one token per character, special tokens kept whole
    assert len(tokenizer("<think>ab")["input_ids"]) == 3

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tokenizer(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)


def test_load_model_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), tokenizer, seed=0)
    save_model(model, tokenizer, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weights"):
        load_model(tmp_path)
    save_model(model, tokenizer, tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_model(tmp_path)


def test_seed_fixes_initial_weights():
    tokenizer = build_char_tokenizer()
    config = TinyModelConfig(hidden_size=32, num_layers=1)
    a = build_tiny_model(config, tokenizer, seed=3).state_dict()
    b = build_tiny_model(config, tokenizer, seed=3).state_dict()
    c = build_tiny_model(config, tokenizer, seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
