"""A run whose verifier reads no answer from most completions, and whose reward is therefore
exactly 0 step after step, stops with a message about the answer format instead of training on
for hours; a reward of 0 on answers the verifier did read (a hard task) goes on."""

import pytest

from rlvr.report.run_dir import RunDirectory
from rlvr.train.config import GRPOConfig
from rlvr.train.grpo import train_grpo
from rlvr.train.monitor import (
    ZeroRewardError,
    ZeroRewardWatch,
    never_parsed_warning,
    unparsed_fraction,
    unparsed_share,
)
from rlvr.verifiers.math import math_reward
from tests.test_async import rows, tiny


def test_the_unparsed_share_is_the_worst_reward_function_over_the_completions():
    metrics = {"verifier/math_reward/no_answer": 6.0, "verifier/other/no_answer": 3.0}
    assert unparsed_fraction(metrics, 8) == 0.75
    assert unparsed_fraction({"reward/mean": 0.0}, 8) is None  # nobody reports parsing


def test_the_watch_counts_silent_steps_in_a_row_and_resets():
    watch = ZeroRewardWatch(limit=3)
    silent = {"reward/mean": 0.0, "verifier/f/no_answer": 7.0}
    parsed = {"reward/mean": 0.0, "verifier/f/no_answer": 1.0}  # wrong answers, read fine
    watch(1, silent, 8)
    watch(2, silent, 8)
    watch(3, parsed, 8)  # resets: the verifier read most answers
    watch(4, {"reward/mean": 0.125, "verifier/f/no_answer": 7.0}, 8)  # some reward: resets
    watch(5, silent, 8)
    watch(6, silent, 8)
    with pytest.raises(ZeroRewardError, match=r"step 7: .* 0 for 3 steps .* no answer in 88%"):
        watch(7, silent, 8)
    ZeroRewardWatch(limit=0)(1, silent, 8)  # 0: off


class NeverParses:
    """A verifier that finds no answer anywhere (every reward 0), and says so."""

    __name__ = "never_parses"

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, prompts, completions, **_):
        self.seen = len(completions)
        return [0.0] * len(completions)

    def reason_counts(self, reset: bool = False) -> dict[str, int]:
        counts, self.seen = {"no_answer": self.seen}, 0 if reset else self.seen
        return counts


def test_a_run_the_verifier_cannot_read_stops_naming_the_format(tmp_path):
    model, tokenizer = tiny()
    config = GRPOConfig(
        steps=10, prompts_per_step=2, group_size=2, max_new_tokens=4, abort_zero_reward_steps=3
    )
    with pytest.raises(ZeroRewardError, match=r"step 3: .*samples\.jsonl.*abort-zero-reward"):
        train_grpo(
            model,
            tokenizer,
            rows(),
            [NeverParses()],
            config,
            RunDirectory(tmp_path, "silent"),
            evaluate=lambda m: {},
            seed=0,
            progress=False,
        )


def test_the_base_warning_comes_only_when_no_completion_has_a_readable_answer():
    held_out = [{"prompt": "2+3=", "answer": "5"}, {"prompt": "4+4=", "answer": "8"}]
    prose = ["the sum is 5", "eight"]  # numbers in prose: the verifier reads no answer
    assert unparsed_share(math_reward, held_out, prose) == 1.0
    message = never_parsed_warning(1.0, 2)
    assert message is not None and "any of its 2" in message and "####" in message
    one_read = ["#### 6", "eight"]  # wrong, but read: the format is learnable
    assert unparsed_share(math_reward, held_out, one_read) == 0.5
    assert never_parsed_warning(0.5, 2) is None
    assert never_parsed_warning(None, 2) is None  # a verifier that does not say
