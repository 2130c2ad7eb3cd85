"""Asynchronous (one-step-off-policy) training and the rollout correction in the step: the
staleness is what it says, weights never load while sampling, a stuck rollout thread ends with
a named error instead of a hang, and a corrected async run still learns held-out problems."""

import copy
import threading
import time

import pytest

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.run_dir import RunDirectory
from rlvr.report.timer import StepTimer
from rlvr.rollout.engine import HFEngine
from rlvr.tasks import arithmetic
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.train.checkpoint import step_dir_name
from rlvr.train.config import GRPOConfig, RolloutCorrection, build_plan
from rlvr.train.grpo import build_trainer, grpo_step, train_grpo
from rlvr.train.rollouts import AsyncRollout
from rlvr.verifiers.math import math_reward
from rlvr.workers import WorkerError
from tests.test_learning import learn_carrying

TIS = RolloutCorrection(mode="tis")


def tiny(seed: int = 0):
    tokenizer = build_char_tokenizer()
    config = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return build_tiny_model(config, tokenizer, seed), tokenizer


def rows():
    task = ArithmeticTaskConfig(digits=1, held_out_size=10)
    return ({"prompt": p.prompt, "answer": p.answer} for p in arithmetic.train_problems(task, 3))


class VersionedEngine:
    """An HFEngine over its own model that records which weight version each generate call
    sampled from, and fails if weights are loaded while it samples."""

    def __init__(self, model, tokenizer) -> None:
        self.inner = HFEngine(model, tokenizer)
        self.version, self.sampled_versions = 0, []
        self.busy = threading.Lock()

    def generate(self, *args, **kwargs):
        with self.busy:
            self.sampled_versions.append(self.version)
            time.sleep(0.01)  # widen the window a racing load would hit
            return self.inner.generate(*args, **kwargs)

    def load_weights(self, state_dict) -> None:
        assert self.busy.acquire(blocking=False), "weights loaded while sampling"
        try:
            self.inner.load_weights(state_dict)
            self.version += 1
        finally:
            self.busy.release()


@pytest.mark.parametrize("ahead", [1, 2])
def test_rollouts_are_at_most_ahead_updates_old_and_never_loaded_mid_sampling(ahead):
    model, tokenizer = tiny()
    engine = VersionedEngine(copy.deepcopy(model), tokenizer)
    config = GRPOConfig(
        steps=5,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=4,
        async_steps=ahead,
        rollout_correction=TIS,
    )
    t = build_trainer(model, tokenizer, rows(), [math_reward], config, seed=0, engine=engine)
    assert isinstance(t.rollout, AsyncRollout)
    staleness = []
    try:
        for _ in range(5):
            result = grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())
            staleness.append(result.metrics["async/staleness"])
    finally:
        t.rollout.close()
    # step t trains from version t-1 on rollouts from version max(0, t-1-ahead)
    assert staleness == [min(step, ahead) for step in range(5)]
    # the engine sampled the queued steps from the versions synced when each was queued
    assert engine.sampled_versions[:5] == [max(0, s - ahead) for s in range(5)]


def test_a_synchronous_correction_weighs_every_token_by_one_and_changes_nothing():
    """In one process in fp32 the engine's log-probs are the learner's: the weights are 1, and
    the corrected step's loss equals the uncorrected one."""
    results = {}
    for correction in (None, "tis"):
        model, tokenizer = tiny()
        config = GRPOConfig(
            steps=1,
            prompts_per_step=4,
            group_size=4,
            max_new_tokens=6,
            rollout_correction=RolloutCorrection(mode=correction),
        )
        t = build_trainer(model, tokenizer, rows(), [math_reward], config, seed=0)
        results[correction] = grpo_step(
            t.plan, t.rollout, t.learner, t.state.generator, StepTimer()
        ).metrics
    corrected = results["tis"]
    assert corrected["mismatch/kl"] == pytest.approx(0.0, abs=1e-5)
    assert corrected["mismatch/ess"] == pytest.approx(1.0, abs=1e-5)
    assert corrected["mismatch/capped_frac"] == 0.0
    assert corrected["loss"] == pytest.approx(results[None]["loss"], abs=1e-5)
    assert "mismatch/kl" not in results[None]


def test_an_async_run_without_a_correction_is_refused():
    with pytest.raises(ValueError, match="set rollout_correction.mode to tis, mis or icepop"):
        build_plan(GRPOConfig(max_new_tokens=4, async_steps=1))
    none = RolloutCorrection(mode="none")
    build_plan(GRPOConfig(max_new_tokens=4, async_steps=1, rollout_correction=none))


def async_config(**switches) -> GRPOConfig:
    """A tiny one-step-off run with truncated IS."""
    base = {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4, "eval_every": 0}
    return GRPOConfig(async_steps=1, rollout_correction=TIS, **base | switches)


def run_with(engine, config: GRPOConfig, run: RunDirectory):
    model, tokenizer = tiny()
    return train_grpo(
        model,
        tokenizer,
        rows(),
        [math_reward],
        config,
        run,
        evaluate=lambda m: {},
        seed=0,
        progress=False,
        engine=engine,
    )


class StuckEngine:
    def __init__(self, model, tokenizer) -> None:
        self.inner, self.release = HFEngine(model, tokenizer), threading.Event()

    def generate(self, *args, **kwargs):
        self.release.wait(30)
        return self.inner.generate(*args, **kwargs)

    def load_weights(self, state_dict) -> None:
        self.inner.load_weights(state_dict)


def test_a_stuck_rollout_thread_ends_the_run_naming_it_and_the_checkpoint(tmp_path, capsys):
    model, tokenizer = tiny()
    engine = StuckEngine(copy.deepcopy(model), tokenizer)
    config = async_config(steps=2, worker_timeout_s=0.5)
    start = time.perf_counter()
    try:
        with pytest.raises(WorkerError, match="the rollout thread: did not answer") as raised:
            run_with(engine, config, RunDirectory(tmp_path, "stuck"))
    finally:
        engine.release.set()
    assert time.perf_counter() - start < 10
    assert str(raised.value).endswith("no checkpoint was written yet")


def test_the_lost_worker_message_names_the_last_checkpoint(tmp_path):
    model, tokenizer = tiny()
    config = async_config(steps=3, checkpoint_every=1)

    class DiesAtStep3:
        def __init__(self) -> None:
            self.inner, self.calls = HFEngine(copy.deepcopy(model), tokenizer), 0

        def generate(self, *args, **kwargs):
            self.calls += 1
            if self.calls == 3:
                raise WorkerError("rollout actor 1 (pid 4242)", "died")
            return self.inner.generate(*args, **kwargs)

        def load_weights(self, state_dict) -> None:
            self.inner.load_weights(state_dict)

    run = RunDirectory(tmp_path, "dies")
    with pytest.raises(WorkerError) as raised:
        run_with(DiesAtStep3(), config, run)
    message = str(raised.value)
    assert message.startswith("rollout actor 1 (pid 4242): died; the last checkpoint is ")
    assert message.split("; ")[1].endswith(step_dir_name(2))  # steps 1 and 2 were trained
    assert f"resume with: rlvr train --resume {run.path}" in message


def test_async_with_one_step_of_staleness_and_tis_learns_held_out_problems(tmp_path):
    """test_learning.py's seeded run, one step off-policy with truncated IS."""
    learned = learn_carrying(tmp_path, async_steps=1, rollout_correction=TIS)
    steps = [r for r in learned.records if "reward/mean" in r]
    print(f"async + tis: held-out greedy {learned.before:.3f} -> {learned.after:.3f}")
    assert [r["async/staleness"] for r in steps[:3]] == [0.0, 1.0, 1.0]
    assert all(r["mismatch/ess"] > 0.9 for r in steps)
    # measured: 0.493 -> 0.933 (synchronous: 0.887 on the same loaded machine)
    assert learned.before < 0.7 and learned.after >= learned.before + 0.25


@pytest.mark.slow
def test_the_lab_one_step_off_with_tis_reaches_095_held_out(tmp_path):
    """The issue's bar: `rlvr lab --grpo.async-steps 1 --grpo.rollout-correction.mode tis` (the
    lab's 3-digit task, 100 steps) ends at held-out greedy >= 0.95 (measured: 0.365 -> 0.980)."""
    import json

    from rlvr.cli import main

    runs, cache = tmp_path / "runs", tmp_path / "cache"
    main(
        ["lab", "--runs-dir", str(runs), "--cache-dir", str(cache), "--no-progress"]
        + ["--grpo.async-steps", "1", "--grpo.rollout-correction.mode", "tis"]
    )
    summary = json.loads(next(runs.glob("*/summary.json")).read_text())
    assert summary["base_greedy_acc"] < 0.5 and summary["final_greedy_acc"] >= 0.95
