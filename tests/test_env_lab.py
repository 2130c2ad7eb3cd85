"""`rlvr train --env NAME` end to end on the tiny model, and the refusals of `--env` before
anything is trained (one `rlvr: error:` line each)."""

from __future__ import annotations

import json

import pytest

from rlvr.cli import main
from tests.helpers import SMALL_TRAIN_FLAGS


def run_env(tmp_path, *flags: str) -> list[dict]:
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    main(["train", *flags, *SMALL_TRAIN_FLAGS, "--runs-dir", str(runs), "--cache-dir", str(cache)])
    lines = (runs / "lab" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_retry_arith_trains_end_to_end(tmp_path):
    records = run_env(tmp_path, "--env", "retry_arith")
    steps = [r for r in records if "reward/mean" in r]
    assert len(steps) == 2
    for record in steps:
        assert 1.0 <= record["env/turns_mean"] <= 3.0
        statuses = sum(record[f"env/{s}_frac"] for s in ("done", "max_turns", "truncated"))
        assert statuses + record["env/timeout_frac"] + record["env/error_frac"] == 1.0
        assert 0.0 <= record["env/env_token_frac"] < 1.0
    final = records[-1]
    assert {"eval/greedy_acc", "eval/sampled_acc", "eval/greedy_turns"} <= set(final)
    summary = json.loads((tmp_path / "runs" / "lab" / "summary.json").read_text())
    assert summary  # the run finished and reported


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--env", "nope"], "unknown environment 'nope'; choose tool_chain"),
        (["--env", "retry_arith", "--ray"], "--ray does not have yet; drop --ray"),
        (["--env", "retry_arith", "--engine", "vllm"], "--engine vllm does not have yet"),
        (["--env", "retry_arith", "--env.max-turns", "-1"], "--env.max-turns must be >= 0"),
        (["--env", "retry_arith", "--env.turn-discount", "2"], "--env.turn-discount must be"),
    ],
)
def test_env_flags_are_refused_in_one_line(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", *flags, "--runs-dir", str(tmp_path), "--cache-dir", str(tmp_path)])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("rlvr: error:")]) == 1


def test_a_task_file_goes_with_an_environment_of_your_own(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(SystemExit):
        main(["train", "--env", "retry_arith", "--task", str(rows), "--runs-dir", str(tmp_path)])
    assert "--env retry_arith brings its own rows; drop --task" in capsys.readouterr().err
