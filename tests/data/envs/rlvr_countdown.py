"""An rlvr environment class and a factory function, with rows of its own (`ROWS`)."""

ROWS = [{"prompt": f"reach {n}\n", "answer": n} for n in range(20)]
HELD_OUT = 4


class Countdown:
    max_turns = 3

    def reset(self, row, *, seed):
        self.target = int(row["answer"])
        return [{"role": "user", "content": row["prompt"]}], [], {}

    def step(self, reply):
        try:
            guess = int(reply.strip())
        except ValueError:
            return [{"role": "user", "content": "a number\n"}], 0.0, False, {}
        if guess == self.target:
            return [], 1.0, True, {}
        return [{"role": "user", "content": "no\n"}], None, False, {}

    def close(self):
        pass


def make_countdown():
    return Countdown()


def needs_arguments(level):
    return Countdown()


NOT_AN_ENV = 3
