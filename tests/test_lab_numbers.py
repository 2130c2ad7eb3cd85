"""The lab's numbers, as far as they hold (`pytest -m slow`; minutes on 2 cores).

A seeded run is bit-identical on one machine with one lock of versions (constraints/lock.txt):
the second test reruns the lab and compares every metric, the summary's numbers and the final
weights bit for bit. On another CPU or another release, rounding differs and at the lab's size
it moves the trajectory, so what holds anywhere is a band: the first test checks the README's
default lab lands in the band measured over seeds (`benchmarks/lab_seeds.py`).
"""

import json
from pathlib import Path

import pytest

from rlvr.train.agreement import FP32_TOLERANCE

pytestmark = pytest.mark.slow

BANDS = {  # the default lab (seed 0); measured here 0.365 / 0.501 -> 0.995 / 0.939
    "base_greedy_acc": (0.28, 0.46),
    "base_sampled_acc": (0.42, 0.58),
    "final_greedy_acc": (0.95, 1.0),
    "final_sampled_acc": (0.85, 1.0),
}
NUMBERS = tuple(BANDS)
UNTIMED = ("time/", "throughput/", "memory/")  # wall clocks: never equal twice


def run_lab(root: Path, cache: Path, *flags: str) -> Path:
    from rlvr.cli import main

    main(["lab", "--runs-dir", str(root), "--cache-dir", str(cache), "--no-progress", *flags])
    return root / "lab"


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lab-first")
    return run_lab(tmp / "runs", tmp / "cache")


def test_the_lab_lands_in_its_band(first_run):
    summary = json.loads((first_run / "summary.json").read_text())
    got = {k: summary[k] for k in NUMBERS}
    print(f"the lab here: {got} on {summary['environment']}")
    for key, (low, high) in BANDS.items():
        assert low <= got[key] <= high, (key, got[key], (low, high))
    steps = [json.loads(line) for line in (first_run / "metrics.jsonl").read_text().splitlines()]
    on_policy = [
        r["agreement/max_abs_log_ratio"] for r in steps if "agreement/max_abs_log_ratio" in r
    ]
    # sampler and learner agree (measured here: at most 1.2e-4, median 1.6e-5)
    assert len(on_policy) >= 50 and max(on_policy) < FP32_TOLERANCE


def test_a_rerun_on_this_machine_is_bit_identical(first_run, tmp_path):
    """A fresh base model and RL run (nothing cached) in the same process environment."""
    second = run_lab(tmp_path / "runs", tmp_path / "cache")
    first_summary, second_summary = (
        json.loads((run / "summary.json").read_text()) for run in (first_run, second)
    )
    assert {k: second_summary[k] for k in NUMBERS} == {k: first_summary[k] for k in NUMBERS}

    def untimed(run: Path) -> list[dict]:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(UNTIMED)} for r in rows]

    assert untimed(second) == untimed(first_run)
    for weights in sorted((first_run / "model").glob("*.safetensors")):
        assert (second / "model" / weights.name).read_bytes() == weights.read_bytes(), weights


def test_the_lab_with_packed_sequences_learns_as_the_default_does(tmp_path):
    """`--grpo.forward packed` (rows end to end, no padding) on the same seeded lab: every
    step packed, and the held-out numbers in the same band."""
    packed = run_lab(tmp_path / "runs", tmp_path / "cache", "--grpo.forward", "packed")
    summary = json.loads((packed / "summary.json").read_text())
    for key, (low, high) in BANDS.items():
        assert low <= summary[key] <= high, (key, summary[key], (low, high))
    steps = [json.loads(line) for line in (packed / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in steps if "update/packed" in r]
    assert updates and all(
        r["update/packed"] == 1.0 and r["update/padding_frac"] == 0 for r in updates
    )
