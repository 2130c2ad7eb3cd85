"""Checkpoints: resume is bit-identical, partial directories are never taken, a full disk
leaves the previous checkpoint intact."""

from __future__ import annotations

import errno
import json
import random
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.models.value import ValueModel
from rlvr.train.checkpoint import (
    MARKER,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from rlvr.train.state import TrainState

TOKENIZER = build_char_tokenizer()


def _tiny(seed: int = 0) -> torch.nn.Module:
    return build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=1), TOKENIZER, seed=seed)


def _objects(seed: int = 0):
    model = _tiny(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    generator = torch.Generator().manual_seed(seed)
    return model, optimizer, scheduler, generator


def _train_step(model, optimizer, scheduler, generator) -> None:
    """A fixed LM loss on inputs drawn from the generator, plus noise from the global RNG,
    so that resuming is exact only if weights, Adam moments, LR schedule and RNG all are."""
    ids = torch.randint(5, len(TOKENIZER), (2, 12), generator=generator)
    loss = model(input_ids=ids, labels=ids).loss
    loss = loss + 1e-3 * torch.randn(()) * sum(p.sum() for p in model.parameters())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _save(directory: Path, step: int, objs, **kwargs) -> Path:
    state = TrainState(*objs, step=step, data_position=step * 4)
    return save_checkpoint(directory, state, **kwargs)


def _load(path: Path, objs) -> dict:
    state = TrainState(*objs)
    info = load_checkpoint(path, state)
    assert (state.step, state.data_position) == (info["step"], info["data_position"])
    return info


def test_resume_gives_bit_identical_weights(tmp_path):
    torch.manual_seed(0)
    run = _objects(seed=0)
    for _ in range(3):
        _train_step(*run)
    path = _save(tmp_path, 3, run, extra={"note": "x"})
    for _ in range(2):
        _train_step(*run)
    uninterrupted = _weights(run[0])

    resumed = _objects(seed=1)  # different initial weights and generator seed
    torch.manual_seed(99)
    info = _load(path, resumed)
    assert info == {"step": 3, "data_position": 12, "extra": {"note": "x"}}
    assert resumed[2].last_epoch == 3
    for _ in range(2):
        _train_step(*resumed)
    after = _weights(resumed[0])
    assert after.keys() == uninterrupted.keys()
    for key in after:
        assert torch.equal(after[key], uninterrupted[key]), key


def test_round_trip_reference_and_critic(tmp_path):
    policy = _tiny(0)
    reference = _tiny(2)
    critic = ValueModel(policy)
    torch.nn.init.normal_(critic.head.weight)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    ids = torch.randint(5, len(TOKENIZER), (2, 8))
    for opt, loss in (
        (optimizer, policy(input_ids=ids, labels=ids).loss),
        (critic_optimizer, critic.body(input_ids=ids).last_hidden_state.pow(2).mean()),
    ):
        loss.backward()
        opt.step()
    saved = TrainState(
        policy, optimizer, None, None, reference, critic, critic_optimizer, 1, data_position=7
    )
    path = save_checkpoint(tmp_path, saved)

    policy2, reference2 = _tiny(5), _tiny(6)
    critic2 = ValueModel(policy2)
    optimizer2 = torch.optim.AdamW(policy2.parameters(), lr=1e-3)
    critic_optimizer2 = torch.optim.AdamW(critic2.parameters(), lr=1e-3)
    info = load_checkpoint(
        path, TrainState(policy2, optimizer2, None, None, reference2, critic2, critic_optimizer2)
    )
    assert info["data_position"] == 7
    for a, b in ((policy, policy2), (reference, reference2), (critic, critic2)):
        for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
            assert ka == kb and torch.equal(va, vb), ka
    # tied embedding / LM head stay tied after loading
    assert policy2.lm_head.weight.data_ptr() == policy2.get_input_embeddings().weight.data_ptr()
    for o, o2 in ((optimizer, optimizer2), (critic_optimizer, critic_optimizer2)):
        s, s2 = o.state_dict()["state"], o2.state_dict()["state"]
        assert s.keys() == s2.keys()
        for i in s:
            for name in s[i]:
                assert torch.equal(s[i][name], s2[i][name])


def _draws(generator: torch.Generator) -> tuple:
    return (
        [random.random() for _ in range(3)],
        np.random.rand(3).tolist(),
        torch.rand(3).tolist(),
        torch.rand(3, generator=generator).tolist(),
    )


def test_rng_states_restored(tmp_path):
    objs = _objects()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # a cached gaussian is part of Python's state
    np.random.randn()
    path = _save(tmp_path, 1, objs)
    expected = _draws(objs[3])
    _draws(objs[3])  # move every stream on
    _load(path, objs)
    assert _draws(objs[3]) == expected


def test_rng_file_without_cuda_states_still_loads(tmp_path):
    """rng.pt of a checkpoint written before CUDA states were saved has no "cuda" entry."""
    objs = _objects()
    torch.manual_seed(3)
    path = _save(tmp_path, 1, objs)
    rng = torch.load(path / "rng.pt", weights_only=True)
    del rng["cuda"]
    torch.save(rng, path / "rng.pt")
    manifest = json.loads((path / MARKER).read_text())
    manifest["rng.pt"] = (path / "rng.pt").stat().st_size
    (path / MARKER).write_text(json.dumps(manifest))
    expected = _draws(objs[3])
    _draws(objs[3])
    _load(path, objs)
    assert _draws(objs[3]) == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rng_states_restored(tmp_path):
    objs = _objects()
    torch.cuda.manual_seed_all(4)
    path = _save(tmp_path, 1, objs)
    expected = torch.rand(3, device="cuda").tolist()
    torch.rand(3, device="cuda")
    _load(path, objs)
    assert torch.rand(3, device="cuda").tolist() == expected


def test_keep_last_deletes_only_older_complete_checkpoints(tmp_path):
    objs = _objects()
    for step in range(1, 6):
        _save(tmp_path, step, objs, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000004", "step-000005"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000005"
    _save(tmp_path, 6, objs, keep_last=None)
    assert len(list(tmp_path.iterdir())) == 3


def test_partial_directories_ignored(tmp_path):
    objs = _objects()
    good = _save(tmp_path, 2, objs)
    (tmp_path / "step-000009").mkdir()  # no marker: a half-written or foreign directory
    tmp = tmp_path / ".tmp-step-000010-123"  # a crashed save, even with a marker inside
    tmp.mkdir()
    (tmp / MARKER).write_text("{}")
    (tmp_path / "step-000011").write_text("a file, not a directory")
    assert latest_checkpoint(tmp_path) == good
    assert latest_checkpoint(tmp_path / "missing") is None
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        _load(tmp_path / "step-000009", objs)


def test_steps_sort_numerically(tmp_path):
    objs = _objects()
    _save(tmp_path, 999_999, objs)
    newest = _save(tmp_path, 1_000_000, objs)
    assert latest_checkpoint(tmp_path) == newest


def _disk_full(real):
    """A writer that gets partway through the file, then finds the disk full."""

    def writer(obj, dest, *args, **kwargs):
        Path(dest).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    return writer


@pytest.mark.parametrize("target", ["torch.save", "safetensors.save_model"])
def test_full_disk_leaves_previous_intact(tmp_path, monkeypatch, target):
    objs = _objects()
    previous = _save(tmp_path, 1, objs)
    before = _weights(objs[0])
    _train_step(*objs)
    if target == "torch.save":
        monkeypatch.setattr(torch, "save", _disk_full(torch.save))
    else:
        monkeypatch.setattr(safetensors.torch, "save_model", _disk_full(None))
    with pytest.raises(CheckpointError) as info:
        _save(tmp_path, 2, objs)
    message = str(info.value)
    assert "disk is full" in message and "intact" in message and str(previous) in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000001"]  # no leftovers
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == previous
    _load(previous, objs)
    assert all(torch.equal(v, before[k]) for k, v in objs[0].state_dict().items())


def test_full_disk_without_previous_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", _disk_full(torch.save))
    with pytest.raises(CheckpointError, match="no earlier complete checkpoint"):
        _save(tmp_path, 1, _objects())


def test_mismatched_objects_and_damage_refused(tmp_path):
    objs = _objects()
    path = _save(tmp_path, 1, objs)
    model, optimizer, _, generator = objs
    with pytest.raises(CheckpointError, match="scheduler"):
        load_checkpoint(path, TrainState(model, optimizer, None, generator))
    (path / "optimizer.pt").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="damaged: optimizer.pt"):
        _load(path, objs)
    with pytest.raises(ValueError, match="JSON"):
        _save(tmp_path, 2, objs, extra={"bad": object()})


def test_resave_same_step_replaces(tmp_path):
    objs = _objects()
    _save(tmp_path, 3, objs, extra={"v": 1})
    path = _save(tmp_path, 3, objs, extra={"v": 2})
    assert _load(path, objs)["extra"] == {"v": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003"]
