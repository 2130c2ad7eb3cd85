import pytest
import torch

from rlvr.models.logprobs import completion_logprobs
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.rollout.engine import HFEngine, VLLMEngine, batch_from_token_lists, vllm_available

TOKENIZER = build_char_tokenizer()
EOS, PAD = TOKENIZER.eos_token_id, TOKENIZER.pad_token_id


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def test_hf_engine_output_matches_a_plain_forward_pass():
    model = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), TOKENIZER, seed=4)
    engine = HFEngine(model, TOKENIZER)
    generator = torch.Generator().manual_seed(0)
    batch = engine.generate(["12+34=", "5+6="], 4, 8, temperature=0.9, generator=generator)
    assert batch.completion_ids.shape[0] == 8 and batch.group_ids.tolist() == [0] * 4 + [1] * 4
    with torch.no_grad():
        logp = completion_logprobs(
            model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            temperature=0.9,
        )
    torch.testing.assert_close(logp * batch.completion_mask, batch.logprobs, atol=1e-5, rtol=1e-5)
    # the ids decode to the texts, and the masks cover exactly the generated tokens
    for row, text, n in zip(batch.completion_ids, batch.completions, batch.lengths.long()):
        assert TOKENIZER.decode(row[:n].tolist()).removesuffix(TOKENIZER.eos_token) == text


def test_hf_engine_sync_copies_weights_into_a_separate_sampler():
    policy = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), TOKENIZER, seed=0)
    sampler = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), TOKENIZER, seed=1)
    HFEngine(sampler, TOKENIZER).load_weights(policy.state_dict())
    for a, b in zip(policy.parameters(), sampler.parameters()):
        assert torch.equal(a, b)


def test_hf_engine_sampling_with_the_policy_itself_copies_nothing(monkeypatch):
    policy = build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), TOKENIZER, seed=0)

    def refuse(*args, **kwargs):
        raise AssertionError("the policy's own weights were copied into itself")

    monkeypatch.setattr(policy, "load_state_dict", refuse)
    HFEngine(policy, TOKENIZER).load_weights(policy.state_dict())


def test_batch_from_token_lists_masks_end_at_eos_or_at_the_row_length():
    rows = [ids("12") + [EOS], ids("9999"), ids("7")]  # ended, truncated at 4, cut at 1
    logps = [[-0.1, -0.2, -0.3], [-1.0] * 4, [-0.5]]
    batch = batch_from_token_lists(TOKENIZER, ["1+1=", "2+2=", "3+3="], 1, rows, logps)
    assert batch.completions == ["12", "9999", "7"]
    assert batch.completion_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert batch.truncated.tolist() == [False, True, True]
    assert batch.completion_ids[2, 1:].tolist() == [PAD] * 3
    torch.testing.assert_close(batch.logprobs[0], torch.tensor([-0.1, -0.2, -0.3, 0.0]))
    assert batch.logprobs[2, 1:].abs().sum() == 0


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and vllm_available()),
    reason="vLLM on a GPU (its CPU build runs tests/test_vllm.py: scripts/vllm_check.sh)",
)
def test_vllm_engine_matches_a_plain_forward_pass(tmp_path):
    from rlvr.models.tiny import save_model

    model = build_tiny_model(TinyModelConfig(hidden_size=64, num_layers=2), TOKENIZER, seed=4)
    save_model(model, TOKENIZER, tmp_path / "m")
    engine = VLLMEngine(tmp_path / "m", TOKENIZER, dtype="float32")
    batch = engine.generate(["12+34=", "5+6="], 4, 8, temperature=1.0)
    with torch.no_grad():
        logp = completion_logprobs(
            model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            temperature=1.0,
        )
    torch.testing.assert_close(logp * batch.completion_mask, batch.logprobs, atol=1e-3, rtol=1e-3)


def test_vllm_engine_refuses_clearly_without_a_gpu(tmp_path):
    if vllm_available():
        pytest.skip("a GPU with vLLM is present")
    with pytest.raises(RuntimeError, match="vLLM and a CUDA GPU"):
        VLLMEngine(tmp_path, TOKENIZER)
