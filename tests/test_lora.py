"""LoRA in RL training: only the adapters train, the reference is the base with the adapters
disabled (no copy), checkpoints hold the adapters and resume exactly, merging keeps the model."""

from __future__ import annotations

import builtins
import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlvr.models.logprobs import completion_logprobs
from rlvr.models.lora import (
    LoRAConfig,
    adapter_state_dict,
    adapters_disabled,
    apply_lora,
    is_lora,
    linear_module_names,
    merged,
)
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.run_dir import RunDirectory
from rlvr.rollout.sampler import sample_completions
from rlvr.tasks import arithmetic
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rlvr.train.config import GRPOConfig, Monitor, build_plan
from rlvr.train.grpo import build_trainer, train_grpo
from rlvr.train.learner import Learner
from rlvr.train.state import build_state

pytest.importorskip("peft")

TOKENIZER = build_char_tokenizer()
TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
LORA = LoRAConfig(rank=4)
CONFIG = GRPOConfig(
    steps=2,
    prompts_per_step=2,
    group_size=4,
    max_new_tokens=8,
    lr=1e-2,
    beta=0.04,  # a reference: the base with the adapters disabled
    eval_every=1000,
    monitor=Monitor(every=0),
    checkpoint_every=0,
    cpu_workers=1,
)


def tiny(seed: int = 0) -> torch.nn.Module:
    """rlvr's tiny model (tied embeddings), 32 wide."""
    return build_tiny_model(TINY, TOKENIZER, seed=seed)


def tiny_lora(seed: int = 0) -> torch.nn.Module:
    return apply_lora(tiny(seed), LORA, seed=seed)


def hf_llama(seed: int = 0) -> LlamaForCausalLM:
    """A tiny Hugging Face Llama that is not built by rlvr (untied head, 2 layers)."""
    config = LlamaConfig(
        vocab_size=len(TOKENIZER),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=TOKENIZER.pad_token_id,
        eos_token_id=TOKENIZER.eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def distinct_reward(prompts, completions, **_):
    """Differs inside every group, so every step has a gradient."""
    return [len(set(c)) / 8 for c in completions]


def rows():
    task = ArithmeticTaskConfig(digits=2)
    return ({"prompt": p.prompt, "answer": p.answer} for p in arithmetic.train_problems(task, 3))


def batch_of(model: torch.nn.Module):
    prompts = ["1+2=", "13+4="]
    generator = torch.Generator().manual_seed(0)
    return sample_completions(model, TOKENIZER, prompts, 2, 6, 1.0, generator)


def perturb_adapters(model: torch.nn.Module, seed: int = 1) -> None:
    """Adapters as if trained: lora_B starts at zero, which makes the adapters a no-op."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter_state_dict(model).values():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))


def frozen_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def grpo(model, run: RunDirectory, config: GRPOConfig = CONFIG, resume: bool = False):
    torch.set_num_threads(1)
    return train_grpo(
        model,
        TOKENIZER,
        rows(),
        [distinct_reward],
        config,
        run,
        evaluate=lambda m: {},
        seed=0,
        progress=False,
        resume=resume,
    )


@pytest.mark.parametrize("build", [tiny, hf_llama], ids=["tiny", "hf-llama"])
def test_the_optimizer_holds_only_the_adapters_and_no_reference_copy_is_made(build):
    model = apply_lora(build(), LORA, seed=0)
    assert is_lora(model)
    adapters = adapter_state_dict(model)
    assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    state = build_state(model, seed=0, lr=1e-3, reference=True)
    optimized = [p for group in state.optimizer.param_groups for p in group["params"]]
    assert len(optimized) == len(adapters)
    assert {id(p) for p in optimized} == {id(p) for p in adapters.values()}
    # the reference is the policy's own base: no second model anywhere in the state
    assert state.reference is None and state.reference_is_base
    assert list(state.modules()) == ["policy"]


def test_the_reference_with_adapters_disabled_is_the_base_model():
    base = hf_llama()
    batch = batch_of(base)
    before = completion_logprobs(base.eval(), *batch.model_inputs())
    policy = apply_lora(base.train(), LORA, seed=0)
    state = build_state(policy, seed=0, lr=1e-3, reference=True)
    learner = Learner(state, build_plan(dataclasses.replace(CONFIG, temperature=1.0)))
    perturb_adapters(policy)  # the policy moved away from its base

    policy.train()
    ref = learner.reference_logprobs(batch)
    assert policy.training  # the mode is restored
    mask = batch.completion_mask.bool()
    assert torch.equal(ref[mask], before[mask])
    with torch.no_grad():
        moved = completion_logprobs(policy, *batch.model_inputs())
    assert not torch.allclose(moved[mask], before[mask], atol=1e-3)
    with torch.no_grad(), adapters_disabled(policy):
        assert torch.equal(completion_logprobs(policy, *batch.model_inputs())[mask], ref[mask])


def test_the_adapter_reference_saves_the_copys_memory():
    """The deep-copied reference costs one more copy of every weight; the base costs none."""
    full = build_state(hf_llama(), seed=0, lr=1e-3, reference=True)
    lora = build_state(apply_lora(hf_llama(), LORA, seed=0), seed=0, lr=1e-3, reference=True)

    def weight_bytes(state) -> int:
        storages = {
            p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
            for m in state.modules().values()
            for p in m.parameters()
        }
        return sum(storages.values())

    base_bytes = sum(p.numel() * p.element_size() for p in hf_llama().parameters())
    assert weight_bytes(full) == 2 * base_bytes  # the policy and its copy
    adapter_bytes = sum(
        p.numel() * p.element_size() for p in adapter_state_dict(lora.policy).values()
    )
    assert weight_bytes(lora) == base_bytes + adapter_bytes  # the base and its adapters, once
    print(f"reference copy {base_bytes} bytes avoided; adapters {adapter_bytes} bytes")


def test_a_target_the_model_lacks_names_the_linear_layers():
    model = hf_llama()
    with pytest.raises(ValueError, match="qkv_proj") as info:
        apply_lora(model, LoRAConfig(rank=2, target_modules=("q_proj", "qkv_proj")))
    message = str(info.value)
    assert "\n" not in message
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert name in message
    assert linear_module_names(model) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    )
    with pytest.raises(ValueError, match="all-linear"):
        apply_lora(model, LoRAConfig(rank=2, target_modules=("all-linear", "q_proj")))
    named = apply_lora(model, LoRAConfig(rank=2, target_modules=("q_proj", "self_attn.v_proj")))
    assert {n.split(".")[-4] for n in adapter_state_dict(named)} == {"q_proj", "v_proj"}


def test_lora_needs_a_rank_and_says_how_to_install_peft(monkeypatch):
    with pytest.raises(ValueError, match="rank"):
        apply_lora(hf_llama(), LoRAConfig(rank=0))
    real_import = builtins.__import__

    def no_peft(name, *args, **kwargs):
        if name == "peft" or name.startswith("peft."):
            raise ImportError("No module named 'peft'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_peft)
    with pytest.raises(ImportError, match="pip install peft") as info:
        apply_lora(hf_llama(), LORA)
    assert "\n" not in str(info.value)
    assert not is_lora(hf_llama())


def test_a_seed_makes_the_adapters_reproducible_and_leaves_the_global_rng_alone():
    plain_a, plain_b = hf_llama(), hf_llama()
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b = apply_lora(plain_a, LORA, seed=5), apply_lora(plain_b, LORA, seed=5)
    assert torch.equal(torch.rand(1), expected_next)
    for (na, pa), (nb, pb) in zip(adapter_state_dict(a).items(), adapter_state_dict(b).items()):
        assert na == nb and torch.equal(pa, pb)


@pytest.mark.parametrize("build", [tiny, hf_llama], ids=["tiny", "hf-llama"])
def test_merging_keeps_the_adapted_model(build):
    model = apply_lora(build(), LORA, seed=0)
    perturb_adapters(model)
    ids = torch.randint(5, len(TOKENIZER), (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with adapters_disabled(model):
            base = model(input_ids=ids).logits
        plain = merged(model)
        folded = plain(input_ids=ids).logits
    assert not is_lora(plain) and not any("lora_" in n for n, _ in plain.named_parameters())
    assert not torch.allclose(adapted, base, atol=1e-3)
    torch.testing.assert_close(folded, adapted, atol=1e-5, rtol=1e-5)
    assert merged(plain) is plain  # a plain model is returned as it is


def test_a_plain_torch_module_gets_adapters_too():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(5, 3)
    expected = net(x)
    model = apply_lora(net, LoRAConfig(rank=2))
    assert is_lora(model) and len(adapter_state_dict(model)) == 4
    torch.testing.assert_close(model(x), expected)  # lora_B starts at zero


def test_grpo_with_lora_trains_the_adapters_and_leaves_the_base_alone(tmp_path):
    model = tiny_lora()
    base, adapters = (
        frozen_weights(model),
        {n: p.detach().clone() for n, p in adapter_state_dict(model).items()},
    )
    records = grpo(model, RunDirectory(tmp_path, "lora"))
    assert [r["step"] for r in records] == [0, 1, 2]
    # step 1: the fresh adapters are a no-op (lora_B = 0), so policy and reference agree;
    # step 2: the policy has moved away from its base, the reference has not
    assert records[1]["policy/kl_ref"] < 1e-9 < records[2]["policy/kl_ref"]
    after = frozen_weights(model)
    assert after.keys() == base.keys()
    assert all(torch.equal(after[n], base[n]) for n in base)
    changed = [n for n, p in adapter_state_dict(model).items() if not torch.equal(p, adapters[n])]
    assert changed and any(".lora_A." in n for n in changed)


def test_resume_with_lora_is_exact_and_the_checkpoint_holds_only_the_adapters(tmp_path):
    four = dataclasses.replace(CONFIG, steps=4)
    straight = tiny_lora()
    expected = grpo(straight, RunDirectory(tmp_path, "straight"), four)

    first = tiny_lora()
    grpo(first, RunDirectory(tmp_path, "split"), CONFIG)  # 2 steps, checkpointed at the end
    checkpoint = tmp_path / "split" / "checkpoints" / "step-000002"
    saved = checkpoint / "policy.safetensors"
    assert saved.stat().st_size < 0.5 * sum(p.numel() * 4 for p in first.parameters())
    assert not (checkpoint / "reference.safetensors").exists()

    # the same base rebuilt, with other adapters: the checkpoint's must replace them
    resumed = apply_lora(build_tiny_model(TINY, TOKENIZER, seed=0), LORA, seed=7)
    got = grpo(resumed, RunDirectory(tmp_path, "split", resume=True), four, resume=True)
    assert [r["step"] for r in got] == [0, 1, 2, 3, 4]
    volatile = ("time/", "throughput/")
    assert [{k: v for k, v in r.items() if not k.startswith(volatile)} for r in got] == [
        {k: v for k, v in r.items() if not k.startswith(volatile)} for r in expected
    ]
    want, have = straight.state_dict(), resumed.state_dict()
    assert want.keys() == have.keys()
    assert all(torch.equal(want[k], have[k]) for k in want)


def test_a_lora_checkpoint_refuses_another_base_or_a_full_model(tmp_path):
    state = build_state(tiny_lora(), seed=0, lr=1e-3, reference=True)
    path = save_checkpoint(tmp_path, state)
    with pytest.raises(CheckpointError, match="base weights differ"):
        load_checkpoint(path, build_state(tiny_lora(seed=1), seed=0, lr=1e-3, reference=True))
    full = build_state(build_tiny_model(TINY, TOKENIZER, 0), seed=0, lr=1e-3)
    with pytest.raises(CheckpointError, match="LoRA"):
        load_checkpoint(path, full)
    with pytest.raises(CheckpointError, match="adapters differ"):
        other_rank = apply_lora(build_tiny_model(TINY, TOKENIZER, 0), LoRAConfig(rank=2))
        load_checkpoint(path, build_state(other_rank, seed=0, lr=1e-3, reference=True))


def test_syncing_a_base_reference_is_refused_when_the_trainer_is_built():
    config = dataclasses.replace(CONFIG, ref_sync_every=2)
    with pytest.raises(ValueError, match="ref_sync_every=2 cannot be used with LoRA"):
        build_trainer(tiny_lora(), TOKENIZER, rows(), [distinct_reward], config, seed=0)
    # without a KL term there is no reference to sync: allowed, as for a full model
    no_kl = dataclasses.replace(config, beta=0.0)
    build_trainer(tiny_lora(), TOKENIZER, rows(), [distinct_reward], no_kl, seed=0)
