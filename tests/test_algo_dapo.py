"""Tests of DAPO's sampling patches (rlvr.algo.dapo), numbers by hand."""

import math

import pytest
import torch

from rlvr.algo.dapo import dynamic_sampling_keep, overlong_penalty, truncation_mask
from rlvr.algo.losses import policy_loss
from tests.helpers import close

GARBAGE = 1e6


class TestDynamicSampling:
    def test_keeps_groups_with_spread(self):
        # groups (interleaved, unequal sizes): 0 = {1, 0, 0} varies, 1 = {2, 4} varies,
        # 2 = {5} size 1 (constant), 3 = {3, 3} constant
        rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 0.0, 5.0, 3.0, 3.0])
        ids = torch.tensor([0, 1, 0, 1, 0, 2, 3, 3])
        keep = dynamic_sampling_keep(rewards, ids)
        assert keep.dtype == torch.bool
        assert keep.tolist() == [True, True, True, True, True, False, False, False]

    def test_all_correct_and_all_wrong_dropped(self):
        # ids 7 = {1, 1, 1} all correct, 9 = {0, 0} all wrong, 4 = {0, 1} mixed
        rewards = torch.tensor([1, 1, 0, 1, 0, 0, 1])
        ids = torch.tensor([7, 7, 9, 7, 9, 4, 4])
        assert dynamic_sampling_keep(rewards, ids).tolist() == [
            False,
            False,
            False,
            False,
            False,
            True,
            True,
        ]

    def test_empty(self):
        assert dynamic_sampling_keep(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)


class TestOverlongPenalty:
    def test_three_pieces(self):
        # max_len 10, buffer 4: the penalty starts above 10 - 4 = 6
        # 3 -> 0; 6 -> 0 (boundary, <= 6); 7 -> (6 - 7) / 4 = -0.25; 9 -> (6 - 9) / 4 = -0.75;
        # 10 -> (6 - 10) / 4 = -1.0; 11 (> max_len) -> -1
        lengths = torch.tensor([3, 6, 7, 9, 10, 11])
        close(overlong_penalty(lengths, 10, 4), [0.0, 0.0, -0.25, -0.75, -1.0, -1.0])
        # penalty_factor 0.5 scales every piece: 0, 0, -0.125, -0.375, -0.5, -0.5
        close(
            overlong_penalty(lengths, 10, 4, penalty_factor=0.5),
            [0.0, 0.0, -0.125, -0.375, -0.5, -0.5],
        )

    def test_zero_buffer_is_a_step(self):
        # buffer 0: nothing in the linear zone; 9, 10 -> 0 (<= 10), 11 -> -1
        close(overlong_penalty(torch.tensor([9, 10, 11]), 10, 0), [0.0, 0.0, -1.0])

    def test_float_lengths_and_errors(self):
        # 8.5 in the buffer of (10, 4): (6 - 8.5) / 4 = -0.625
        close(overlong_penalty(torch.tensor([8.5]), 10, 4), [-0.625])
        with pytest.raises(ValueError):
            overlong_penalty(torch.tensor([1]), 10, 11)
        with pytest.raises(ValueError):
            overlong_penalty(torch.tensor([1]), 0, 0)
        with pytest.raises(ValueError):
            overlong_penalty(torch.tensor([1]), 10, 4, penalty_factor=-1.0)


class TestTruncationMask:
    MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    TRUNCATED = torch.tensor([False, True, False])

    def test_rows_zeroed_dtype_kept(self):
        expected = [[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
        for mask in (self.MASK, self.MASK.float(), self.MASK.bool()):
            out = truncation_mask(mask, self.TRUNCATED)
            assert out.dtype == mask.dtype
            assert out.int().tolist() == expected
        # 0/1 integer flags work too
        assert truncation_mask(self.MASK, torch.tensor([0, 1, 0])).tolist() == expected

    def test_loss_ignores_truncated_rows(self):
        # ratio 1 everywhere -> per-token loss -A; A = (1, 5, -1); row 1 (A = 5) is truncated.
        # token-mean over the 4 remaining tokens: (-1 * 3 + 1) / 4 = -0.5 (row 1 never counts;
        # without the filter: (-3 - 20 + 1) / 8 = -2.75)
        logp = torch.full((3, 4), math.log(0.5))
        adv = torch.tensor([1.0, 5.0, -1.0])
        mask = truncation_mask(self.MASK, self.TRUNCATED)
        loss, _ = policy_loss(logp, logp, adv, mask)
        close(loss, -0.5)
        loss_all, _ = policy_loss(logp, logp, adv, self.MASK)
        close(loss_all, -2.75)

    def test_shape_check(self):
        with pytest.raises(ValueError):
            truncation_mask(self.MASK, torch.tensor([True, False]))
