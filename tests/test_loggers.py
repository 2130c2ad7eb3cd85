"""--report-to: parsing, the fan-out of RunDirectory, and each tracker read back from its files.

TensorBoard is read back with its own EventAccumulator; wandb (offline) from the .wandb file
its core writes, parsed with wandb's own protobuf; trackio through its local SQLite storage,
in a subprocess (trackio reads $TRACKIO_DIR once, when imported).
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlvr.config import ConfigError
from rlvr.report.loggers import (
    REPORT_TO_CHOICES,
    WANDB_ID_FILE,
    LoggerFanOut,
    TensorBoardLogger,
    flat_config,
    markdown_table,
    open_loggers,
    parse_report_to,
    sample_table,
    scalars_of,
)
from rlvr.report.run_dir import RunDirectory, read_jsonl

CONFIG = {"seed": 3, "grpo": {"lr": 0.001, "steps": 3, "stop": ["\n"]}, "model": None}

# three steps of a run: step 0 is the start's evaluation, steps 1-3 train; the values are
# chosen by hand, and the list, None and NaN are what the fan-out must leave out
METRICS = [
    {"step": 0, "eval/greedy_acc": 0.25},
    {"step": 1, "reward/mean": 0.5, "time/step_s": 2.0, "update/nonfinite": math.nan},
    {"step": 2, "reward/mean": 0.75, "time/step_s": 1.5, "lengths": [3, 4], "note": None},
    {"step": 3, "reward/mean": 1.0, "time/step_s": 1.25, "eval/greedy_acc": 0.5},
]
SAMPLES = {
    s: [
        {"step": s, "prompt": "2+2=", "answer": "4", "completion": f"<think>{s}</think> 4"},
        {"step": s, "prompt": "3|3=", "answer": "6", "completion": "a\nb", "reward": 0.0},
    ]
    for s in (1, 2, 3)
}
# what each tracker must hold: every finite number of METRICS, by tag
EXPECTED = {
    "eval/greedy_acc": [(0, 0.25), (3, 0.5)],
    "reward/mean": [(1, 0.5), (2, 0.75), (3, 1.0)],
    "time/step_s": [(1, 2.0), (2, 1.5), (3, 1.25)],
}


def write_run(run: RunDirectory, metrics: list[dict] = METRICS) -> None:
    """What a training run writes: the config, then each step's metrics and samples."""
    run.write_config(CONFIG)
    for record in metrics:
        run.log_metrics(record)
        if record["step"] in SAMPLES:
            run.log_samples(SAMPLES[record["step"]])


def by_tag(points: list[tuple[str, int, float]]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for tag, step, value in sorted(points, key=lambda p: (p[0], p[1])):
        out.setdefault(tag, []).append((step, value))
    return out


# --- parsing and the pieces ------------------------------------------------------------------


def test_parse_report_to():
    assert parse_report_to("none") == ()
    assert parse_report_to("") == ()
    assert parse_report_to("tensorboard") == ("tensorboard",)
    assert parse_report_to(" wandb , TensorBoard,wandb") == ("wandb", "tensorboard")
    assert parse_report_to("trackio,tensorboard,wandb") == ("trackio", "tensorboard", "wandb")
    assert REPORT_TO_CHOICES == ("none", "tensorboard", "wandb", "trackio")


@pytest.mark.parametrize("text", ["tensorbord", "wandb,mlflow", "none,wandb"])
def test_parse_report_to_refuses_in_one_line(text):
    with pytest.raises(ConfigError) as info:
        parse_report_to(text)
    message = str(info.value)
    assert message.startswith("--report-to") and "\n" not in message
    if text != "none,wandb":
        assert "none, tensorboard, wandb, trackio" in message


def test_scalars_of_keeps_finite_numbers_only():
    record = {"step": 4, "a": 1, "b": 0.5, "c": True, "d": math.nan, "e": math.inf}
    record |= {"f": None, "g": [1.0], "h": "text"}
    assert scalars_of(record) == {"a": 1.0, "b": 0.5, "c": 1.0}


def test_sample_table_flat_config_and_markdown():
    columns, rows = sample_table(SAMPLES[1])
    assert columns == ["prompt", "answer", "completion", "reward"]
    assert rows == [["2+2=", "4", "<think>1</think> 4", None], ["3|3=", "6", "a\nb", 0.0]]
    assert flat_config(CONFIG) == {
        "seed": 3,
        "grpo.lr": 0.001,
        "grpo.steps": 3,
        "grpo.stop": '["\\n"]',
        "model": "none",
    }
    assert markdown_table(["x", "y"], [["<b>|", "1\n2"]]) == (
        "| x | y |\n|---|---|\n| &lt;b&gt;&#124; | 1<br>2 |"
    )


def test_missing_package_names_the_pip_command(tmp_path, monkeypatch):
    for module, extra in (
        ("tensorboard", "tensorboard"),
        ("wandb", "wandb"),
        ("trackio", "trackio"),
    ):
        monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
        with pytest.raises(ConfigError, match=rf"pip install 'rlvr\[{extra}\]'$"):
            open_loggers([extra], tmp_path, "run", {}, None)


def test_trackio_refuses_a_space(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_SPACE_ID", "someone/space")
    with pytest.raises(ConfigError, match="locally only; unset TRACKIO_SPACE_ID"):
        open_loggers(["trackio"], tmp_path, "run", {}, None)


# --- the fan-out -----------------------------------------------------------------------------


class Recorder:
    """A tracker that keeps what it is sent; `fail_at` makes log_scalars raise at that step."""

    def __init__(self, name: str = "recorder", fail_at: int | None = None):
        self.name, self.fail_at = name, fail_at
        self.configs, self.scalars, self.samples, self.closed = [], [], [], 0

    def log_config(self, config):
        self.configs.append(config)

    def log_scalars(self, step, scalars):
        if step == self.fail_at:
            raise OSError("disk full\nsecond line")
        self.scalars.append((step, scalars))

    def log_samples(self, step, records):
        self.samples.append((step, len(records)))

    def close(self):
        self.closed += 1


def test_fan_out_sends_config_scalars_and_samples(tmp_path):
    recorder = Recorder()
    with RunDirectory(tmp_path, "fan") as run:
        run.attach([recorder])
        write_run(run)
    assert recorder.configs == [CONFIG]
    assert recorder.scalars == [
        (0, {"eval/greedy_acc": 0.25}),
        (1, {"reward/mean": 0.5, "time/step_s": 2.0}),
        (2, {"reward/mean": 0.75, "time/step_s": 1.5}),
        (3, {"reward/mean": 1.0, "time/step_s": 1.25, "eval/greedy_acc": 0.5}),
    ]
    assert recorder.samples == [(1, 2), (2, 2), (3, 2)]
    assert recorder.closed == 1
    assert read_jsonl(run.metrics_path)[2]["lengths"] == [3, 4]  # the JSONL keeps everything


def test_fan_out_splits_samples_by_step():
    recorder = Recorder()
    LoggerFanOut([recorder]).log_samples([*SAMPLES[1], *SAMPLES[2], {"prompt": "no step"}])
    assert recorder.samples == [(1, 2), (2, 2)]


def test_a_failing_tracker_is_dropped_with_one_warning(tmp_path, capsys):
    failing, healthy = Recorder("flaky", fail_at=2), Recorder()
    run = RunDirectory(tmp_path, "flaky")
    run.attach([failing, healthy])
    write_run(run)
    run.close()
    err = capsys.readouterr().err
    assert err.count("[rlvr] warning:") == 1
    assert "--report-to flaky: log_scalars failed (OSError: disk full);" in err
    assert [s for s, _ in failing.scalars] == [0, 1] and failing.samples == [(1, 2)]
    assert failing.closed == 1  # closed when dropped, not again at the end
    assert [s for s, _ in healthy.scalars] == [0, 1, 2, 3] and healthy.closed == 1
    assert [r["step"] for r in read_jsonl(run.metrics_path)] == [0, 1, 2, 3]
    assert len(read_jsonl(run.samples_path)) == 6


# --- TensorBoard -----------------------------------------------------------------------------


def tensorboard_events(log_dir: Path):
    """TensorBoard's own reading of `log_dir`: (scalars by tag, text by tag and step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = by_tag(
        [(t, e.step, e.value) for t in events.Tags()["scalars"] for e in events.Scalars(t)]
    )
    texts = {
        t: {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors(t)}
        for t in events.Tags()["tensors"]
    }
    return scalars, texts, events


def test_tensorboard_end_to_end(tmp_path):
    pytest.importorskip("tensorboard")
    with RunDirectory(tmp_path, "tb") as run:
        run.attach(open_loggers(["tensorboard"], run.path, "tb", CONFIG, None))
        write_run(run)
    scalars, texts, events = tensorboard_events(run.path / "tensorboard")
    assert scalars.keys() == EXPECTED.keys()
    for tag, points in EXPECTED.items():
        assert scalars[tag] == [(s, pytest.approx(v, rel=1e-6)) for s, v in points], tag
    assert sorted(texts["samples/text_summary"]) == [1, 2, 3]
    table = texts["samples/text_summary"][2]
    assert table.splitlines()[0] == "| prompt | answer | completion | reward |"
    assert "| 2+2= | 4 | &lt;think&gt;2&lt;/think&gt; 4 | None |" in table
    assert "lr: 0.001" in texts["config/text_summary"][0]
    assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")


def test_tensorboard_resume_purges_the_steps_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    run = RunDirectory(tmp_path, "tb")
    run.attach(open_loggers(["tensorboard"], run.path, "tb", CONFIG, None))
    write_run(run)
    run.close()
    # the run stopped after step 3; its checkpoint is step 1, so steps 2 and 3 run again
    rerun = [{"step": 2, "reward/mean": 0.0}, {"step": 3, "reward/mean": 0.125}]
    run = RunDirectory(tmp_path, "tb", resume=True)
    run.attach(open_loggers(["tensorboard"], run.path, "tb", CONFIG, resume_step=1))
    for record in rerun:
        run.log_metrics(record)
    run.close()
    scalars, _, _ = tensorboard_events(run.path / "tensorboard")
    assert scalars["reward/mean"] == [(1, 0.5), (2, 0.0), (3, 0.125)]
    assert scalars["time/step_s"] == [(1, 2.0)]
    assert scalars["eval/greedy_acc"] == [(0, 0.25)]
    # a fresh run over it (--overwrite) starts from no events at all
    run = RunDirectory(tmp_path, "tb", overwrite=True)
    run.attach(open_loggers(["tensorboard"], run.path, "tb", CONFIG, None))
    run.log_metrics({"step": 1, "reward/mean": 0.375})
    run.close()
    assert tensorboard_events(run.path / "tensorboard")[0] == {"reward/mean": [(1, 0.375)]}


def test_tensorboard_logger_alone(tmp_path):
    pytest.importorskip("tensorboard")
    logger = TensorBoardLogger(tmp_path)
    logger.log_scalars(7, {"x": 1.5})
    logger.close()
    assert tensorboard_events(tmp_path / "tensorboard")[0] == {"x": [(7, 1.5)]}


# --- wandb (offline) -------------------------------------------------------------------------


def wandb_records(path: Path):
    """The records of a .wandb file: a 7-byte header (':W&B', magic, version), then LevelDB
    log blocks of 32 KiB whose chunks are (crc32 u32, length u16, type u8: 1 full, 2 first,
    3 middle, 4 last) + data; each record one wandb protobuf `Record`. wandb 0.31 ships no
    Python reader of it, so this is the format its Go core writes."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunks = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:  # a block's tail too short for a header
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks, pos = chunks + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            yield record
            chunks = b""


def wandb_history(run_dir: Path) -> tuple[list[tuple[str, int, float]], dict, dict]:
    """(the logged points, the run's config, the `samples/...` items of the last step) of the
    offline wandb run under `run_dir`."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    # finish() returns before wandb's core has always written the file out: wait for its end
    deadline = time.monotonic() + 30
    while (records := list(wandb_records(path))) == [] or _kind(records[-1]) != "exit":
        assert time.monotonic() < deadline, f"{path} has no exit record after 30 s"
        time.sleep(0.1)
    points, config, samples = [], {}, {}
    for record in records:
        kind = _kind(record)
        if kind == "run":
            config |= {i.key: json.loads(i.value_json) for i in record.run.config.update}
        elif kind == "config":
            config |= {i.key: json.loads(i.value_json) for i in record.config.update}
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
            step = int(items.pop("_step"))
            samples = {k: json.loads(v) for k, v in items.items() if k.startswith("samples/")}
            points += [
                (k, step, float(v)) for k, v in items.items() if not k.startswith(("_", "samples"))
            ]
    return points, config, samples


def _kind(record) -> str:
    return record.WhichOneof("record_type")


def test_wandb_offline_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    with RunDirectory(tmp_path, "wb") as run:
        run.attach(open_loggers(["wandb"], run.path, "wb", CONFIG, None))
        write_run(run)
    points, config, samples = wandb_history(run.path)
    assert by_tag(points) == EXPECTED
    assert config["grpo"] == CONFIG["grpo"] and config["seed"] == 3 and config["model"] is None
    assert samples["samples/_type"] == "table-file" and samples["samples/nrows"] == 2
    (table,) = run.path.glob("wandb/offline-run-*/files/" + samples["samples/path"])
    table = json.loads(table.read_text())
    assert table["columns"] == ["prompt", "answer", "completion", "reward"]
    assert table["data"][1] == ["3|3=", "6", "a\nb", 0.0]
    # a resumed run keeps the id; a fresh one over it (--overwrite) gets a new one
    run_id = (run.path / WANDB_ID_FILE).read_text().strip()
    assert len(list(run.path.glob(f"wandb/offline-run-*/run-{run_id}.wandb"))) == 1
    loggers = open_loggers(["wandb"], run.path, "wb", CONFIG, resume_step=1)
    assert loggers[0].run.id == run_id
    loggers[0].close()
    loggers = open_loggers(["wandb"], run.path, "wb", CONFIG, None)
    assert loggers[0].run.id != run_id
    loggers[0].close()


# --- trackio (local) -------------------------------------------------------------------------

TRACKIO_SCRIPT = """
import json, sys
from pathlib import Path
from tests.test_loggers import CONFIG, write_run
from rlvr.report.loggers import open_loggers
from rlvr.report.run_dir import RunDirectory

root = Path(sys.argv[1])
with RunDirectory(root, "tr") as run:
    run.attach(open_loggers(["trackio"], run.path, "tr", CONFIG, None, project="rlvr-test"))
    write_run(run)
# resumed from a checkpoint at step 1 after the run stopped at step 3: steps 2-3 are stored
with RunDirectory(root, "tr", resume=True) as run:
    run.attach(open_loggers(["trackio"], run.path, "tr", CONFIG, 1, project="rlvr-test"))
    for step, value in ((2, 0.0), (3, 0.125), (4, 0.875)):
        run.log_metrics({"step": step, "reward/mean": value})

from trackio import Api, SQLiteStorage
logs = SQLiteStorage.get_logs("rlvr-test", "tr")
(tracked,) = Api().runs("rlvr-test")
print("RESULT", json.dumps({"logs": logs, "config": tracked.config}, default=str))
"""


def test_trackio_local_end_to_end(tmp_path):
    pytest.importorskip("trackio")
    env = {
        "TRACKIO_DIR": str(tmp_path / "trackio"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TRACKIO_SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**_environ_without_trackio(), **env},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    points, tables = [], {}
    for log in result["logs"]:
        for key, value in log.items():
            if key == "samples":
                tables[log["step"]] = value
            elif key not in ("step", "timestamp"):
                points.append((key, log["step"], value))
    # the resumed session added step 4 only: trackio keeps the first values of steps 2-3
    assert by_tag(points) == EXPECTED | {"reward/mean": [*EXPECTED["reward/mean"], (4, 0.875)]}
    assert sorted(tables) == [1, 2, 3]
    assert tables[3]["_type"] == "trackio.table"
    assert tables[3]["_value"][1] == {"prompt": "3|3=", "answer": "6", "completion": "a\nb"} | {
        "reward": 0.0
    }
    assert result["config"]["grpo"] == CONFIG["grpo"] and result["config"]["seed"] == 3
    assert (tmp_path / "trackio" / "rlvr-test.db").is_file()


def _environ_without_trackio() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRACKIO_")}


# --- the CLI ---------------------------------------------------------------------------------


def test_lab_report_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from rlvr.cli import main
    from tests.test_lab import TINY

    runs, cache = tmp_path / "runs", tmp_path / "cache"
    args = ["lab", "--runs-dir", str(runs), "--cache-dir", str(cache), "--run-name", "tb"]
    main(args + TINY + ["--report-to", "tensorboard"])
    metrics = read_jsonl(runs / "tb" / "metrics.jsonl")
    scalars, texts, _ = tensorboard_events(runs / "tb" / "tensorboard")
    for tag in ("reward/mean", "eval/greedy_acc", "policy/approx_kl", "time/step_s"):
        expected = [(m["step"], m[tag]) for m in metrics if tag in m]
        assert scalars[tag] == [(s, pytest.approx(v, rel=1e-6)) for s, v in expected], tag
    assert sorted(texts["samples/text_summary"]) == [1, 2, 3]
    assert "run_name: tb" in texts["config/text_summary"][0]


def test_check_installed_refuses_a_missing_tracker_before_anything_opens(monkeypatch):
    from rlvr.report.loggers import check_installed

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'rlvr\[wandb\]'$"):
        check_installed(("wandb",))
    check_installed(())  # none: nothing to check
