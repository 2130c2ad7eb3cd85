"""Two turns; each reply's reward is its count of distinct characters over 10, so an untrained
model's episodes differ in reward (every group has spread: the tests' gradients are real)."""

ROWS = [{"prompt": f"{n}:"} for n in range(40)]
HELD_OUT = 4


class Chatty:
    max_turns = 2
    max_tokens = 24

    def reset(self, row, *, seed):
        self.turn = 0
        return [{"role": "user", "content": row["prompt"]}], [], {}

    def step(self, reply):
        self.turn += 1
        reward = len(set(reply)) / 10
        if self.turn >= 2:
            return [], reward, True, {}
        return [{"role": "user", "content": "more\n"}], reward, False, {}

    def close(self):
        pass
