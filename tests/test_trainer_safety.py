"""The pieces the SFT and DPO loops share with GRPO, by hand: a rank's share of the SFT loss
divides by the whole batch's tokens (the ranks' shares add up to the one-process loss); the
DPO loop's LoRA reference is its base; a NaN DPO update is skipped and counted; a resume of
SFT with LoRA continues bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.models.tiny import build_char_tokenizer, build_tiny_model
from rlvr.pipelines.sft import add_lora
from rlvr.train import dpo as dpo_module
from rlvr.train.checkpoint import latest_checkpoint_step
from rlvr.train.dpo import PairPool, PreferencePair, train_dpo
from rlvr.train.sft import (
    IGNORE_INDEX,
    Checkpoints,
    completion_loss,
    pairs_loss,
    share_loss,
    shuffled_epochs,
    train_next_token,
)
from tests.test_sft import TINY

X = IGNORE_INDEX
PAIRS = [("12+3=", "15"), ("7+8=", "15 #### 15"), ("1+1=", "2")]


def test_completion_loss_divides_by_the_given_tokens():
    labels = torch.tensor([[X, X, 1, 2]])  # 2 targets: ln 2 and ln 3
    logits = torch.zeros(1, 4, 3)
    logits[0, 1] = torch.tensor([0.0, math.log(2.0), 0.0])
    loss, n = completion_loss(logits, labels, num_tokens=5)  # a share of a 5-token batch
    assert n == 5
    assert loss.item() == pytest.approx((math.log(2) + math.log(3)) / 5, abs=1e-6)


def test_the_ranks_shares_of_the_sft_loss_add_up_to_the_whole_batchs():
    tok = build_char_tokenizer()
    model = build_tiny_model(TINY, tok, seed=0)
    whole, n, truncated = pairs_loss(model, tok, PAIRS)
    shares = [share_loss(model, tok, PAIRS, None, rank, 2) for rank in (0, 1)]
    assert [s[1] for s in shares] == [n, n]  # every rank divides by the batch's tokens
    assert [s[2] for s in shares] == [truncated, truncated]
    assert sum(s[0].item() for s in shares) == pytest.approx(whole.item(), rel=1e-6)
    assert share_loss(model, tok, PAIRS, None, 0, 1)[0].item() == whole.item()  # one rank


def _pool(_policy, _round) -> PairPool:
    pairs = [PreferencePair("1+1=", "2", "3"), PreferencePair("2+2=", "4", "5")]
    return PairPool(pairs, 2, 4, 2, 0, 2)


def test_a_lora_policys_dpo_reference_is_its_base():
    pytest.importorskip("peft")
    tok = build_char_tokenizer()
    model = add_lora(build_tiny_model(TINY, tok, seed=0), rank=2, alpha=4)
    records: list[dict] = []
    train_dpo(model, tok, _pool, 3, 2, 0.5, 1e-2, on_step=lambda s, m: records.append(m))
    # step 1: the adapters start at zero, the policy is its base: h = 0, the loss is log 2
    assert records[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert records[-1]["loss"] < records[0]["loss"]  # the adapters learn against the base


def test_a_nonfinite_dpo_update_is_skipped_and_three_stop_the_run(monkeypatch):
    real = dpo_module.dpo_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(dpo_module, "dpo_loss", nan_loss)
    tok = build_char_tokenizer()
    model = build_tiny_model(TINY, tok, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    records: list[dict] = []
    with pytest.raises(FloatingPointError, match="3 updates in a row had a NaN/Inf"):
        train_dpo(model, tok, _pool, 5, 2, 0.5, 1e-2, on_step=lambda s, m: records.append(m))
    assert [r["update/nonfinite"] for r in records] == [1.0, 1.0]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # untouched


def test_lora_sft_resumes_bit_for_bit(tmp_path):
    pytest.importorskip("peft")
    tok = build_char_tokenizer()

    def run(directory, resume: bool, stop_after: int = 0) -> tuple[torch.nn.Module, int]:
        def on_step(step: int, metrics: dict) -> None:
            if step == stop_after:  # dies after the step, before its checkpoint
                raise KeyboardInterrupt

        model = add_lora(build_tiny_model(TINY, tok, seed=0), rank=2, alpha=4)
        losses = train_next_token(
            model,
            tok,
            shuffled_epochs(PAIRS, 0),
            steps=6,
            batch_size=2,
            lr=1e-2,
            warmup_steps=2,
            on_step=on_step,
            progress=False,
            seed=0,
            checkpoints=Checkpoints(directory, every=2, resume=resume),
        )
        return model, len(losses)

    whole, _ = run(tmp_path / "whole", False)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", False, stop_after=3)
    assert latest_checkpoint_step(tmp_path / "killed") == 2
    resumed, steps_run = run(tmp_path / "killed", True)
    assert steps_run == 4  # steps 3 to 6: from the checkpoint, not from the start
    a, b = whole.state_dict(), resumed.state_dict()
    assert any("lora_" in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
