"""A verifiable reward for GRPO, written for teaching: the one final answer, compared exactly."""

import re

MARKER = "####"  # the lab's completions end "... #### 715"
INTEGER = re.compile(r"[+-]?\d+")


def reward(completion: str, answer: str) -> float:
    """1.0 when the completion's single final answer equals `answer` (an integer), else 0.0."""
    if completion.count(MARKER) != 1:
        return 0.0  # no final answer, or two: a second answer is a hedge
    final = completion.split(MARKER)[1].strip().removesuffix(".")
    if not INTEGER.fullmatch(final):
        return 0.0  # "715 or 825", "715, 825", "about 715", "312+403", "": not one number
    return 1.0 if int(final) == int(answer) else 0.0


def rewards(prompts: list[str], completions: list[str], answer: list[str], **_) -> list[float]:
    """The same in TRL's reward-function form: one reward per completion."""
    return [reward(c, a) for c, a in zip(completions, answer, strict=True)]
