"""The layout component (`train/strategy.py`) and LoRA's special cases (`train/lora_state.py`)
without a process group; the FSDP2 paths themselves run on two ranks in test_distributed.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.config import ConfigError
from rlvr.models.lora import LoRAConfig, apply_lora
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.train.distributed import DistContext, single_process
from rlvr.train.lora_state import checkpoint_meta, make_reference, scoring_reference
from rlvr.train.state import TrainState, build_state
from rlvr.train.strategy import (
    WHOLE_BATCH_FORWARDS_ENV,
    FSDP2Strategy,
    LocalStrategy,
    make_strategy,
    optimizer_file,
)

CPU = torch.device("cpu")
TRAIN = Path(__file__).resolve().parents[1] / "src" / "rlvr" / "train"


def _tiny() -> torch.nn.Module:
    size = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return build_tiny_model(size, build_char_tokenizer(), seed=0)


def _two_ranks(rank: int = 1) -> DistContext:
    return DistContext(rank, 2, rank, CPU, "gloo")


def test_the_strategy_is_chosen_by_the_number_of_ranks(monkeypatch):
    monkeypatch.delenv(WHOLE_BATCH_FORWARDS_ENV, raising=False)
    assert isinstance(make_strategy(None), LocalStrategy)
    assert isinstance(make_strategy(single_process(CPU)), LocalStrategy)
    fsdp = make_strategy(_two_ranks())
    assert isinstance(fsdp, FSDP2Strategy) and fsdp.split_forwards
    assert (fsdp.rank, fsdp.world_size, fsdp.is_main) == (1, 2, False)
    monkeypatch.setenv(WHOLE_BATCH_FORWARDS_ENV, "1")  # the benchmark's layout before the split
    assert not make_strategy(_two_ranks()).split_forwards


def test_what_each_layout_honours_and_names():
    local, fsdp = LocalStrategy(), FSDP2Strategy(_two_ranks())
    every = ("padded", "shared-prompt", "packed")
    for strategy, honoured in [(local, (64, every, 3)), (fsdp, (0, ("padded", "packed"), 2))]:
        got = (strategy.chunk_tokens(64), strategy.forwards(every), strategy.update_workers(3))
        assert got == honoured
    assert fsdp.forwards(("shared-prompt",)) == ("padded",)
    assert (local.engine_workers(3), fsdp.engine_workers(3)) == (3, 1)
    assert (local.rng_file(), fsdp.rng_file()) == ("rng.pt", "rng-1.pt")
    assert (local.checkpoint_meta(), fsdp.checkpoint_meta()) == ({}, {"world_size": 2})
    assert (local.describe(2), fsdp.describe(2)) == ("2 worker thread(s)", "FSDP ranks")
    local.check_async(1)  # one process runs any async_steps
    with pytest.raises(ConfigError, match="async_steps > 0 with several torchrun ranks"):
        fsdp.check_async(1)
    fsdp.check_async(0)
    assert [optimizer_file(k) for k in ("policy", "critic")] == ["optimizer", "critic_optimizer"]


def test_a_lora_policy_is_refused_on_several_ranks_before_anything_is_sharded():
    pytest.importorskip("peft")
    policy = apply_lora(_tiny(), LoRAConfig(rank=2), seed=0)
    with pytest.raises(ConfigError, match="LoRA with more than one torch.distributed rank"):
        FSDP2Strategy(_two_ranks()).prepare(policy, None)


def test_the_state_holds_the_strategy_of_its_context():
    state = build_state(_tiny(), seed=0, lr=1e-3)
    assert isinstance(state.strategy, LocalStrategy) and state.world_size == 1
    given = TrainState(state.policy, state.optimizer, None, state.generator, dist_ctx=_two_ranks())
    assert isinstance(given.strategy, FSDP2Strategy) and given.world_size == 2


def test_the_reference_is_a_frozen_copy_or_a_lora_policys_base():
    policy = _tiny()
    assert make_reference(policy, False) == (None, False)
    copy, is_base = make_reference(policy, True)
    assert copy is not policy and not is_base and not copy.training
    assert not any(p.requires_grad for p in copy.parameters())
    pytest.importorskip("peft")
    lora = apply_lora(_tiny(), LoRAConfig(rank=2), seed=0)
    assert make_reference(lora, True) == (None, True)


def test_a_lora_reference_scores_with_the_adapters_off_in_eval_mode():
    pytest.importorskip("peft")
    lora = apply_lora(_tiny(), LoRAConfig(rank=2), seed=0).train()
    with torch.no_grad():  # adapters that change the output: B is zero at initialisation
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.fill_(0.5)
    ids = torch.tensor([[5, 6, 7]])
    base = _tiny()(ids).logits
    with scoring_reference(None, lora, True) as ref:
        assert ref is lora and not lora.training
        torch.testing.assert_close(ref(ids).logits, base)
    assert lora.training  # its mode restored
    assert not torch.allclose(lora(ids).logits, base)  # its adapters back on
    with scoring_reference(None, lora, False) as ref:
        assert ref is None  # beta == 0: no reference at all
    frozen = _tiny()
    with scoring_reference(frozen, lora, False) as ref:
        assert ref is frozen


def test_only_a_lora_checkpoint_records_its_base():
    assert checkpoint_meta({"policy": _tiny()}, False) == {}
    pytest.importorskip("peft")
    lora = apply_lora(_tiny(), LoRAConfig(rank=2), seed=0)
    meta = checkpoint_meta({"policy": lora}, True)
    frozen = sum(p.double().square().sum().item() for p in lora.parameters() if not p.requires_grad)
    assert meta["reference_is_base"] is True
    assert meta["adapter_only"]["policy"] == pytest.approx(frozen, rel=1e-12)


def test_only_the_strategy_and_the_collectives_speak_of_sharding():
    """The layout is asked, not tested: no other train/ module mentions `sharded`."""
    mentions = {
        path.name
        for path in TRAIN.glob("*.py")
        if "sharded" in path.read_text() and path.name not in ("strategy.py", "distributed.py")
    }
    assert mentions == set()
