"""How reasoning-gym's own scorers (0.1.25) grade reward hacks, next to rlvr's grading.

    python benchmarks/gym_scorers.py [--items 500] [--seed 0]

Each row is one hack on one task: a reply that does not solve the problem. `gym mean` is the
mean of reasoning-gym's `score_answer(reply, item)`, `gym =1.0` the share of items it gives
full marks, `gym raises` the share where it raises; `rlvr mean` is the reward of the same reply
written as a final answer (`#### reply`) under rlvr's grading of that task
(`rlvr.tasks.reasoning_gym`: strict math, exact match, or an allow-listed scorer counted only at
exactly 1.0 with exceptions as 0). Items are generated with `seed` and the generator's defaults.

The hacks:
  * next / around: the true number with one or both neighbours, `a, a+1` / `a-1, a, a+1`
    (reasoning-gym's default scorer pays len(answer)/len(reply) whenever the answer is a
    substring of the reply).
  * both: `True False` (or `Yes No`) on a yes/no task that keeps the default scorer.
  * const:X: the same reply X for every item.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

from rlvr.tasks.reasoning_gym import GymReward, task_spec

Hack = Callable[[dict[str, Any]], str]

DEFAULT_SCORER_NUMERIC = (
    "basic_arithmetic",
    "count_bits",
    "count_primes",
    "gcd",
    "lcm",
    "leg_counting",
    "number_sequence",
    "simple_equations",
)
DEFAULT_SCORER_BOOLEAN = ("course_schedule", "isomorphic_strings", "ransom_note", "syllogism")


def next_to(item: dict[str, Any]) -> str:
    """The true answer and the next number: `a, a+1`."""
    a = int(item["answer"])
    return f"{a}, {a + 1}"


def around(item: dict[str, Any]) -> str:
    """The true answer between its neighbours: `a-1, a, a+1`."""
    a = int(item["answer"])
    return f"{a - 1}, {a}, {a + 1}"


def both(item: dict[str, Any]) -> str:
    """Both truth values, in the spelling the task's answers use."""
    return "Yes No" if item["answer"] in ("Yes", "No") else "True False"


def constant(text: str) -> Hack:
    """The same reply for every item."""
    return lambda item: text


def measure(name: str, hack_name: str, hack: Hack, items: int, seed: int) -> dict[str, Any]:
    """One table row: reasoning-gym's scores of `hack` on `items` items of `name`, and rlvr's."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(name, seed=seed, size=items)
    spec = task_spec(name, seed=seed, held_out_size=20)
    reward: GymReward = spec.reward_fn  # type: ignore[assignment]
    method = reward.methods[name]
    scores, raised, rlvr = [], 0, []
    for i in range(items):
        item = dataset[i]
        reply = hack(item)
        try:
            scores.append(float(dataset.score_answer(reply, item)))
        except Exception:
            raised += 1
        row = {"answer": item["answer"], "task": name, "metadata": item["metadata"]}
        rlvr.append(reward.score(f"#### {reply}", row))
    return {
        "task": name,
        "hack": hack_name,
        "rlvr grading": method,
        "gym mean": statistics.fmean(scores) if scores else float("nan"),
        "gym =1.0": sum(s == 1.0 for s in scores) / items,
        "gym raises": raised / items,
        "rlvr mean": statistics.fmean(rlvr),
    }


def rows(items: int, seed: int) -> list[dict[str, Any]]:
    """Every measured (task, hack) row."""
    cases: list[tuple[str, str, Hack]] = []
    for name in DEFAULT_SCORER_NUMERIC:
        cases += [(name, "next", next_to), (name, "around", around)]
    cases += [(n, "both", both) for n in DEFAULT_SCORER_BOOLEAN]
    cases += [
        ("coin_flip", "const:0", constant("0")),
        ("game_of_life_halting", "const:False", constant("False")),
        ("game_of_life_halting", "const:banana", constant("banana")),
        ("prime_factorization", "const:2 x 3", constant("2 x 3")),
        ("prime_factorization", "const:2*3", constant("2*3")),
        ("prime_factorization", "const:I don't know", constant("I don't know")),
    ]
    return [measure(name, hack_name, hack, items, seed) for name, hack_name, hack in cases]


def puzzle24_row(items: int, seed: int) -> dict[str, Any]:
    """puzzle24 (refused by rlvr): its scorer checks that four numbers in range make 24, not
    that they are the puzzle's numbers, so one constant expression solves every puzzle."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("puzzle24", seed=seed, size=items)
    reply = "1*2*3*4"
    scores = [dataset.score_answer(reply, dataset[i]) for i in range(items)]
    return {
        "task": "puzzle24",
        "hack": f"const:{reply}",
        "rlvr grading": "refused",
        "gym mean": statistics.fmean(scores),
        "gym =1.0": sum(s == 1.0 for s in scores) / items,
        "gym raises": 0.0,
        "rlvr mean": float("nan"),
    }


def print_table(table: list[dict[str, Any]]) -> None:
    """The rows as a Markdown table."""
    columns = list(table[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in table:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=500, help="items per task")
    parser.add_argument("--seed", type=int, default=0, help="the datasets' seed")
    args = parser.parse_args(argv)
    table = rows(args.items, args.seed) + [puzzle24_row(args.items, args.seed)]
    print(f"reasoning-gym scorers vs rlvr grading: {args.items} items per task, seed {args.seed}")
    print_table(table)
    print()
    for hack in ("next", "around"):
        means = [r["gym mean"] for r in table if r["hack"] == hack]
        rlvr = max(r["rlvr mean"] for r in table if r["hack"] == hack)
        print(
            f"'{hack}' hack, default scorer: mean {min(means):.2f}-{max(means):.2f} per task; "
            f"rlvr: at most {rlvr:.2f}"
        )


if __name__ == "__main__":
    main()
