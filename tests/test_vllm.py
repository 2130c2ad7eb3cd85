"""VLLMEngine on vLLM's CPU build: log-probs, weight reloads, greedy decoding, clear refusals.

Runs where vLLM's CPU build is installed (`scripts/vllm_check.sh` builds its venv and runs this
file); skipped elsewhere, as in the main venv. One engine serves the module (vLLM takes seconds
to start); the tests that change its weights load the original ones back.
"""

import copy

import pytest
import torch

SET_NUM_THREADS = torch.set_num_threads  # before vLLM's CPU worker replaces it

pytest.importorskip("vllm")
from vllm.platforms import current_platform  # noqa: E402

if not current_platform.is_cpu():
    pytest.skip("these checks are for vLLM's CPU build", allow_module_level=True)


from rlvr.config import UserError  # noqa: E402
from rlvr.models.logprobs import completion_logprobs  # noqa: E402
from rlvr.models.tiny import (  # noqa: E402
    TinyModelConfig,
    build_char_tokenizer,
    build_tiny_model,
    save_model,
)
from rlvr.rollout.engine import HFEngine, VLLMEngine, VLLMError, vllm_available  # noqa: E402

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
# head_dim 128 / 4 = 32, one vLLM's CPU attention accepts
SHAPE = TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256)
# the first prompt is longer than a KV block (128 tokens on the CPU): vLLM caches its prefix
PROMPTS = ["Add the two numbers and write their sum. " * 4 + "12+34=", "5+6=", "100-7=", "9*9="]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    policy = build_tiny_model(SHAPE, TOKENIZER, seed=3).eval()
    model_dir = save_model(policy, TOKENIZER, tmp_path_factory.mktemp("tiny") / "model")
    return VLLMEngine(model_dir, TOKENIZER, device="cpu", seed=0), policy


def sample(engine, temperature: float, seed: int, num_samples: int = 4):
    generator = torch.Generator().manual_seed(seed)
    return engine.generate(PROMPTS, num_samples, 16, temperature, generator)


def max_logprob_gap(model, batch, temperature: float) -> float:
    """Largest |engine log-prob - completion_logprobs| over the completion mask."""
    with torch.no_grad():
        logp = completion_logprobs(model, *batch.model_inputs(), temperature=temperature)
    return float(((logp - batch.logprobs) * batch.completion_mask).abs().max())


@torch.no_grad()
def greedy_by_full_forwards(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding with one full forward pass per token (no KV cache): the reference."""
    completion: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, -1]
        completion.append(int(logits.argmax()))
        if completion[-1] == EOS:
            break
    return completion


def test_vllm_is_available_on_its_cpu_build():
    assert vllm_available()


def test_sampled_logprobs_match_completion_logprobs(setup):
    engine, policy = setup
    batch = sample(engine, 0.7, seed=0)
    assert batch.group_ids.tolist() == [g for g in range(len(PROMPTS)) for _ in range(4)]
    # vLLM's own prompt ids, left-padded: those rlvr's tokenizer gives for these prompts
    expected = TOKENIZER(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    assert torch.equal(batch.prompt_ids, expected["input_ids"].repeat_interleave(4, dim=0))
    assert torch.equal(batch.prompt_mask, expected["attention_mask"].repeat_interleave(4, dim=0))
    assert max_logprob_gap(policy, batch, 0.7) <= 1e-5
    # rows that stopped end their mask at the EOS; the others ran to max_new_tokens
    ended = ~batch.truncated
    assert ended.any() and batch.truncated.any()  # both kinds of row are checked
    last = batch.lengths.long() - 1
    assert (batch.completion_ids[ended, last[ended]] == EOS).all()
    assert (batch.lengths[batch.truncated] == 16).all()


def test_a_generator_seed_reproduces_the_samples(setup):
    engine, _ = setup
    first, again, other = sample(engine, 1.0, 5), sample(engine, 1.0, 5), sample(engine, 1.0, 6)
    assert torch.equal(first.completion_ids, again.completion_ids)
    assert not torch.equal(first.completion_ids, other.completion_ids)
    # a prompt's samples differ from one another
    assert len({tuple(row.tolist()) for row in first.completion_ids[:4]}) > 1


def test_loaded_weights_are_the_ones_sampled_from(setup):
    engine, policy = setup
    sample(engine, 1.0, seed=1)  # the long prompt's KV block is now in vLLM's prefix cache
    updated = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
    engine.load_weights(updated.state_dict())
    try:
        batch = sample(engine, 1.0, seed=1)
        assert max_logprob_gap(updated, batch, 1.0) <= 1e-5
        assert max_logprob_gap(policy, batch, 1.0) > 1e-2  # the old weights are gone
    finally:
        engine.load_weights(policy.state_dict())
    assert max_logprob_gap(policy, sample(engine, 1.0, seed=1), 1.0) <= 1e-5


def test_greedy_equals_greedy_by_full_forward_passes(setup):
    engine, policy = setup
    batch = sample(engine, 0.0, seed=0, num_samples=2)
    assert torch.equal(batch.completion_ids[0::2], batch.completion_ids[1::2])
    for i, prompt in enumerate(PROMPTS):
        expected = greedy_by_full_forwards(policy, TOKENIZER(prompt)["input_ids"], 16)
        n = int(batch.lengths[2 * i])
        assert batch.completion_ids[2 * i, :n].tolist() == expected
    # greedy log-probs are the untempered ones, as HFEngine's
    assert max_logprob_gap(policy, batch, 1.0) <= 1e-5


def test_greedy_equals_hf_engine_greedy(setup):
    engine, policy = setup
    ours = sample(engine, 0.0, seed=0, num_samples=2)
    theirs = HFEngine(policy, TOKENIZER).generate(PROMPTS, 2, 16, 0.0)
    assert torch.equal(ours.completion_mask, theirs.completion_mask)
    assert torch.equal(ours.completion_ids, theirs.completion_ids)
    torch.testing.assert_close(ours.logprobs, theirs.logprobs, atol=1e-5, rtol=0)


def test_the_engine_leaves_torch_set_num_threads_working(setup):
    assert torch.set_num_threads is SET_NUM_THREADS


def test_a_head_dim_the_cpu_backend_refuses_is_one_clear_error(tmp_path):
    default = TinyModelConfig()  # hidden 160 / 4 heads: head_dim 40
    save_model(build_tiny_model(default, TOKENIZER, seed=0), TOKENIZER, tmp_path)
    with pytest.raises(VLLMError, match=r"head_dim 40 .*\(32, 64, .*--tiny.hidden-size") as err:
        VLLMEngine(tmp_path, TOKENIZER, device="cpu")
    assert isinstance(err.value, UserError) and "\n" not in str(err.value)


def test_rlvr_trains_with_engine_vllm(tmp_path):
    """`rlvr lab --engine vllm`: rollouts from vLLM, the weights reloaded after every update,
    the run finished and logged (a lab-sized model whose head_dim vLLM's CPU attention takes;
    a second engine in this process, beside the module's)."""
    import json

    from rlvr.cli import main

    runs = tmp_path / "runs"
    shape = ["--tiny.hidden-size", "128", "--tiny.num-heads", "4", "--tiny.num-layers", "1"]
    main(
        ["lab", "--engine", "vllm", "--runs-dir", str(runs), "--run-name", "v", "--no-progress"]
        + ["--cache-dir", str(tmp_path / "cache"), "--arithmetic.digits", "1"]
        + ["--arithmetic.held-out-size", "8", *shape, "--base.steps", "20"]
        + ["--grpo.steps", "3", "--grpo.prompts-per-step", "4", "--grpo.group-size", "4"]
        + ["--grpo.rollout-correction.mode", "tis"]
    )
    records = [json.loads(line) for line in (runs / "v" / "metrics.jsonl").open()]
    steps = [r for r in records if "reward/mean" in r]
    assert len(steps) == 3
    # vLLM's log-probs against the learner's fp32 ones: close, not identical engines
    assert all(abs(r["mismatch/kl"]) < 1e-3 and r["mismatch/ess"] > 0.99 for r in steps)
