"""A TRL-style environment class (TRL's `environment_factory`), written for TRL and used by rlvr
unchanged: `reset(**row)`, public methods as tools, `get_reward()`."""


class Calculator:
    def __init__(self):
        self.answer = None
        self.used = 0

    def reset(self, **row):
        self.answer = int(row["answer"])
        self.used = 0
        return "\nUse the tool, then answer."

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first addend
            b: the second addend
        """
        self.used += 1
        return a + b

    def get_reward(self) -> float:
        return 1.0 if self.used else 0.0


class NoTools:
    def reset(self, **row):
        return None
