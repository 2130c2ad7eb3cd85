"""A `tool_env` built from one typed function."""

from rlvr.tasks.tool_env import tool_env


def mul(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


calculator = tool_env(mul, reward=lambda env: float(env.final_reply.strip() == "42"))
