"""The failure-mode diagnostics of a step, by hand: lengths of right and wrong completions, the
zero-variance groups' token share and seconds, and the token- vs sequence-level ratio spread."""

import math

import pytest
import torch

from rlvr import algo
from rlvr.algo.losses import ratio_spread
from rlvr.rollout.sampler import RolloutBatch
from rlvr.train.monitor import HackingMonitor
from rlvr.train.step_metrics import length_by_correctness, step_metrics, zero_variance_cost


def test_lengths_of_right_and_wrong_completions():
    lengths = torch.tensor([10.0, 20.0, 30.0, 41.0])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5])  # 0.5 is not right
    out = length_by_correctness(lengths, rewards)
    assert out == {"completion/len_correct_mean": 20.0, "completion/len_wrong_mean": 30.5}


def test_a_kind_absent_from_the_step_is_absent():
    lengths = torch.tensor([3.0, 5.0])
    assert length_by_correctness(lengths, torch.ones(2)) == {"completion/len_correct_mean": 4.0}
    assert length_by_correctness(lengths, torch.zeros(2)) == {"completion/len_wrong_mean": 4.0}


def test_zero_variance_token_share_and_seconds():
    # groups: 0 all right (constant), 1 mixed, 2 a group of one (constant)
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2])
    lengths = torch.tensor([10.0, 30.0, 20.0, 20.0, 20.0])  # 100 tokens, 60 in constant groups
    out = zero_variance_cost(rewards, groups, lengths, seconds=5.0)
    assert out["zero_std/token_frac"] == pytest.approx(0.6)
    assert out["zero_std/seconds"] == pytest.approx(3.0)
    assert zero_variance_cost(rewards, groups, lengths) == {
        "zero_std/token_frac": out["zero_std/token_frac"]
    }
    assert algo.zero_std_group_fraction(rewards, groups) == pytest.approx(2 / 3)


def _batch(lengths: list[int], groups: list[int]) -> RolloutBatch:
    n, t = len(lengths), max(lengths)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).float()
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, t, dtype=torch.long),
        completion_mask=mask,
        logprobs=torch.zeros(n, t),
        truncated=torch.zeros(n, dtype=torch.bool),
        group_ids=torch.tensor(groups),
        completions=[""] * n,
    )


def test_step_metrics_of_a_batch_and_the_monitor_logs_them_every_step():
    batch = _batch([2, 4, 6, 8], [0, 0, 1, 1])
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])  # group 1 constant: 14 of 20 tokens
    times = {"time/generate_s": 1.5, "time/verify_s": 0.5}
    expected = {
        "completion/len_correct_mean": 2.0,
        "completion/len_wrong_mean": 6.0,
        "zero_std/token_frac": pytest.approx(0.7),
        "zero_std/seconds": pytest.approx(1.4),
    }
    assert step_metrics(batch, rewards, times) == expected
    assert step_metrics(batch, torch.zeros(0)) == {}
    monitor = HackingMonitor(None, None, every=0, samples=4, gap=0.2)  # no hacking monitor
    del expected["zero_std/seconds"]
    assert monitor(3, batch, rewards) == expected


def test_ratio_spread_by_hand_on_a_padded_batch():
    # row 0: log-ratios [ln 2, 0] ; row 1: [ln 0.5] then padding (garbage already zeroed)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    logp = torch.tensor([[math.log(2.0), -1.0], [math.log(0.5), 0.0]])
    old = torch.tensor([[0.0, -1.0], [0.0, 0.0]])
    out = ratio_spread(logp, old, mask)
    # token ratios 2, 1, 0.5: ((2-1)^2 + 0 + (0.5-1)^2) / 3 tokens
    assert out["policy/ratio_token_sq_dev"] == pytest.approx(1.25 / 3, abs=1e-6)
    # sequence ratios sqrt(2) (row 0, 2 tokens) and 0.5 (row 1, 1 token), over 3 tokens
    seq_dev = (2 * (math.sqrt(2.0) - 1) ** 2 + 0.25) / 3
    assert out["policy/ratio_seq_sq_dev"] == pytest.approx(seq_dev, abs=1e-6)


def test_ratio_spread_is_the_same_however_the_batch_is_split():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    logp = torch.tensor([[0.3, -0.2, 0.1], [0.5, 0.0, 0.0], [-0.4, 0.2, 0.0]])
    whole = ratio_spread(logp, torch.zeros(3, 3), mask)
    parts = [ratio_spread(logp[i : i + 1], torch.zeros(1, 3), mask[i : i + 1]) for i in range(3)]
    tokens = mask.sum(dim=1)
    for key in whole:  # the token-weighted mean of the parts, as micro-batches combine
        combined = sum(p[key] * n for p, n in zip(parts, tokens.tolist())) / tokens.sum()
        assert whole[key] == pytest.approx(combined.item(), rel=1e-6)


def test_ratio_spread_ignores_rows_without_tokens_and_is_in_the_loss_metrics():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    logp = torch.tensor([[math.log(3.0), math.log(3.0)], [0.0, 0.0]])
    out = ratio_spread(logp, torch.zeros(2, 2), mask)
    assert out["policy/ratio_token_sq_dev"] == pytest.approx(4.0)  # (3 - 1)^2, row 1 empty
    assert out["policy/ratio_seq_sq_dev"] == pytest.approx(4.0)
    garbage = torch.tensor([[math.log(3.0), math.log(3.0)], [5.0, -7.0]])  # padded row
    _, metrics = algo.policy_loss(
        garbage, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), mask, ratio_level="sequence"
    )
    assert metrics["policy/ratio_token_sq_dev"] == pytest.approx(4.0)  # padding ignored
    assert metrics["policy/ratio_seq_sq_dev"] == pytest.approx(4.0)
    assert ratio_spread(logp, logp, torch.zeros(2, 2)) == {
        "policy/ratio_token_sq_dev": 0.0,
        "policy/ratio_seq_sq_dev": 0.0,
    }
