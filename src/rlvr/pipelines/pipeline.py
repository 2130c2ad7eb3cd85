"""Pipelines: a short list of stages in a YAML file, run in order, each in its own directory.

    name: r1
    task: {digits: 3, mix_prob: 0.5}     # the reasoning task (rlvr.tasks.reasoning)
    eval_modes: [default]                # thinking modes each stage's model is evaluated in
    stages:
      - {name: base, kind: base, steps: 800}
      - {name: cold-start, kind: sft, data: [readable:200], steps: 150}
      - {name: reasoning-rl, kind: grpo, consistency_weight: 0.5, grpo: {steps: 60}}

Built-in pipelines (`r1-zero`, `r1`, `distill`, `qwen3`) live next to this file in
`builtin/`. A finished stage leaves `stage.json` in its directory (its settings, outputs,
evaluation and wall time); running the pipeline again skips every finished stage whose settings
are unchanged, and re-runs the first changed stage and everything after it. Every value is
type-checked when the file is read, before any stage runs (`stages[2].grpo.lr: expected
float, ...`), and every stage directory gets a `config.yaml` of its settings. The report
(`report.md`, `report.json`, `report.png`) has, per stage, held-out accuracy, readability,
mean completion length and wall time.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError, UserError, from_dict, read_yaml
from rlvr.devices import Precision, on_device, resolve_precision
from rlvr.models.tiny import TinyModelConfig
from rlvr.pipelines import stages
from rlvr.pipelines.base_model import check_base
from rlvr.pipelines.common import PipelineContext
from rlvr.report.loggers import check_installed, parse_report_to
from rlvr.report.plots import plot_pipeline
from rlvr.report.run_log import RunLog
from rlvr.report.stats import format_interval
from rlvr.tasks import reasoning
from rlvr.tasks.spec import TaskSpec
from rlvr.train.evaluate import evaluate_stage_model

BUILTIN_DIR = Path(__file__).parent / "builtin"
PIPELINE_LOG = RunLog(to_stderr=True)
"""A pipeline's log: its `[rlvr] stage ...` lines on stderr, progress bars on."""

TOP_LEVEL_KEYS = ("name", "description", "task", "tiny", "seed", "eval_modes", "stages")


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str
    settings: Any  # the kind's dataclass (stages.STAGE_KINDS)


@dataclass(frozen=True)
class PipelineSettings:
    """The top-level keys of a pipeline file other than `stages`, type-checked."""

    name: str = ""
    description: str = ""
    task: reasoning.ReasoningTaskConfig = field(default_factory=reasoning.ReasoningTaskConfig)
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    seed: int = 0
    eval_modes: tuple[str, ...] = ("default",)


@dataclass(frozen=True)
class Pipeline:
    name: str
    description: str
    task: reasoning.ReasoningTaskConfig
    tiny: TinyModelConfig
    seed: int
    eval_modes: tuple[str, ...]
    stages: tuple[Stage, ...]


def builtin_pipelines() -> list[str]:
    """The names of the built-in pipelines (the YAML files in `builtin/`)."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


class PipelineNotFoundError(UserError, FileNotFoundError):
    """A pipeline name that is neither built in nor a file."""


def load_pipeline(name_or_path: str) -> Pipeline:
    """A built-in pipeline by name, or a YAML file; every key and type is checked before anything
    runs (errors are `ConfigError`s that start with the file's path)."""
    path = Path(name_or_path)
    if not path.suffix and (BUILTIN_DIR / f"{name_or_path}.yaml").exists():
        path = BUILTIN_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise PipelineNotFoundError(
            f"no pipeline {name_or_path!r}: use one of {builtin_pipelines()} or a YAML file"
        )
    data = read_yaml(path) or {}
    return parse_pipeline(data, default_name=path.stem, source=str(path))


def parse_pipeline(data: dict[str, Any], default_name: str, source: str) -> Pipeline:
    """A Pipeline from a pipeline file's data; unknown keys, kinds and modes and wrong types
    are refused, naming `source` and the field's path (`stages[2].grpo.lr`)."""
    try:
        return _parse(data, default_name)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _parse(data: Any, default_name: str) -> Pipeline:
    """`parse_pipeline` without the source in its errors."""
    if not isinstance(data, dict):
        raise ConfigError(f"a pipeline file is a mapping of {list(TOP_LEVEL_KEYS)}")
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown}; valid: {list(TOP_LEVEL_KEYS)}")
    if not data.get("stages") or not isinstance(data["stages"], list):
        raise ConfigError("a pipeline needs a non-empty `stages` list")
    parsed, names = [], set()
    for i, entry in enumerate(data["stages"]):
        where = f"stages[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: a stage is a mapping with `name` and `kind`")
        entry = dict(entry)
        name, kind = entry.pop("name", None), entry.pop("kind", None)
        if not name or not kind:
            raise ConfigError(f"{where}: a stage needs a `name` and a `kind`")
        if name in names:
            raise ConfigError(f"{where}: two stages are named {name!r}")
        names.add(name)
        parsed.append(Stage(name, kind, stages.stage_settings(kind, entry, where=where)))
    top = from_dict(PipelineSettings, {k: v for k, v in data.items() if k != "stages"})
    bad = [m for m in top.eval_modes if m not in reasoning.MODES]
    if bad:
        raise ConfigError(f"eval_modes {bad} not in {list(reasoning.MODES)}")
    return Pipeline(
        name=top.name or default_name,
        description=top.description,
        task=top.task,
        tiny=top.tiny,
        seed=top.seed,
        eval_modes=top.eval_modes,
        stages=tuple(parsed),
    )


def stage_key(pipeline: Pipeline, index: int) -> dict[str, Any]:
    """What determines a stage's result: the shared settings and every stage up to it."""
    return {
        "task": dataclasses.asdict(pipeline.task),
        "tiny": dataclasses.asdict(pipeline.tiny),
        "seed": pipeline.seed,
        "stages": [
            {"name": s.name, "kind": s.kind, **stages.settings_dict(s.settings)}
            for s in pipeline.stages[: index + 1]
        ],
    }


def run_pipeline(
    pipeline: Pipeline,
    out_dir: str | Path,
    log: RunLog = PIPELINE_LOG,
    reevaluate: bool = False,
    precision: Precision | None = None,
    report_to: str = "none",
) -> list[dict[str, Any]]:
    """Run (or resume) `pipeline` under `out_dir`; returns the report rows. With
    `reevaluate`, finished stages are not re-run but their models are evaluated afresh.
    `log` says each stage's start and evaluation (on stderr) and switches the progress bars.
    Every stage's model runs on `precision` (default: the CPU in float32); every GRPO stage
    also reports to the trackers of `report_to` (as `rlvr train --report-to`)."""
    precision = precision or resolve_precision("cpu", "float32")
    trackers = parse_report_to(report_to)
    check_installed(trackers)  # before the first stage trains, not at the first GRPO stage
    with on_device(precision):
        return _run_stages(pipeline, Path(out_dir), log, reevaluate, precision, trackers)


def _run_stages(
    pipeline: Pipeline,
    out: Path,
    log: RunLog,
    reevaluate: bool,
    precision: Precision,
    report_to: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """`run_pipeline` inside its precision."""
    task = reasoning.task_spec(pipeline.task)
    check_stages(pipeline, task)  # before the output directory is made
    out.mkdir(parents=True, exist_ok=True)
    ctx = PipelineContext(
        pipeline.task,
        task,
        pipeline.tiny,
        pipeline.seed,
        log,
        precision=precision,
        report_to=report_to,
    )
    device = precision.device
    report: list[dict[str, Any]] = []
    for index, stage in enumerate(pipeline.stages):
        stage_dir = out / f"{index + 1:02d}-{stage.name}"
        record_path = stage_dir / "stage.json"
        key = stage_key(pipeline, index)
        record = json.loads(record_path.read_text()) if record_path.exists() else None
        if record is not None and record["key"] == key:
            log.say(f"stage {stage.name}: finished earlier, skipped")
            if reevaluate and "model" in record["outputs"]:
                record["eval"] = evaluate_stage_model(
                    record["outputs"]["model"],
                    task,
                    pipeline.eval_modes,
                    pipeline.seed,
                    device=device,
                )
                record_path.write_text(json.dumps(record, indent=2))
        else:
            shutil.rmtree(stage_dir, ignore_errors=True)  # a changed or half-done stage
            stage_dir.mkdir(parents=True)
            stages.write_stage_config(stage_dir, stage.settings)
            log.say(f"stage {index + 1}/{len(pipeline.stages)}: {stage.name} ({stage.kind})")
            start = time.perf_counter()
            run_stage = stages.STAGE_KINDS[stage.kind][1]
            outputs = run_stage(stage.settings, ctx, stage_dir)
            seconds = time.perf_counter() - start
            evaluation = (
                evaluate_stage_model(
                    outputs["model"], task, pipeline.eval_modes, pipeline.seed, device=device
                )
                if "model" in outputs
                else {}
            )
            record = {
                "key": key,
                "name": stage.name,
                "kind": stage.kind,
                "outputs": outputs,
                "seconds": seconds,
                "eval": evaluation,
            }
            record_path.write_text(json.dumps(record, indent=2))
        ctx.outputs[stage.name] = record["outputs"]
        ctx.seconds[stage.name] = record["seconds"]
        if "model" in record["outputs"]:
            ctx.last_model = record["outputs"]["model"]
        cached = record["outputs"].get("cached") == "true"  # a base trained by another run
        report.append(
            {
                "stage": stage.name,
                "kind": stage.kind,
                "seconds": record["seconds"],
                "cached": cached,
                **record["eval"],
            }
        )
        if record["eval"]:
            log.say(f"  {stage.name}: " + _one_line(record["eval"]))
    write_report(pipeline, report, out, problems=len(task.held_out_rows()))
    return report


STAGE_REFERENCES = ("model", "same_time_as", "teacher")
"""Stage settings that name an earlier stage."""


def check_stages(pipeline: Pipeline, task: TaskSpec) -> None:
    """Before the first stage runs (and before anything is written): every stage named by a
    `model`, `same_time_as` or `teacher` setting is an earlier stage, every GRPO stage's
    switches hold (`check_grpo_config`, through `grpo_stage_config`) and every base stage's
    settings (`check_base`); a ConfigError names the stage."""
    for index, stage in enumerate(pipeline.stages):
        earlier = [s.name for s in pipeline.stages[:index]]
        for key in STAGE_REFERENCES:
            named = getattr(stage.settings, key, None)
            if named is not None and named not in earlier:
                raise ConfigError(
                    f"stages[{index}] ({stage.name}).{key}: {named!r} is not an earlier stage; "
                    f"earlier stages: {', '.join(earlier) or 'none'}"
                )
        try:
            if isinstance(stage.settings, stages.GRPOStage):
                stages.grpo_stage_config(stage.settings, task)
            elif isinstance(stage.settings, stages.BaseStage):
                check_base(task, stage.settings, prefix="")
        except ConfigError as exc:
            raise ConfigError(f"stages[{index}] ({stage.name}).{exc}") from None


def write_report(
    pipeline: Pipeline, report: list[dict[str, Any]], out: Path, problems: int | None = None
) -> None:
    """report.json, report.md (one table) and report.png (a panel per measure). With the
    number of held-out `problems`, every accuracy cell (`accuracy*`, `sampled*`) of report.md
    carries its 95% Wilson interval over the problems (conservative for sampled accuracy)."""
    (out / "report.json").write_text(json.dumps(report, indent=2))
    measures = [
        k for k in report_columns(report) if k not in ("stage", "kind", "seconds", "cached")
    ]
    lines = [
        f"# {pipeline.name}",
        "",
        pipeline.description.strip(),
        "",
        "| stage | kind | " + " | ".join(measures) + " | wall s |",
        "| --- | --- | " + " | ".join("---" for _ in measures) + " | --- |",
    ]
    for row in report:
        cells = [_cell(row.get(m), problems if _is_accuracy(m) else None) for m in measures]
        seconds = "cached" if row["cached"] else f"{row['seconds']:.0f}"
        lines.append(f"| {row['stage']} | {row['kind']} | " + " | ".join(cells) + f" | {seconds} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    plot_pipeline(report, measures, out / "report.png", title=f"rlvr pipeline {pipeline.name}")


def report_columns(report: list[dict[str, Any]]) -> list[str]:
    """Every key of the report's rows, in first-seen order."""
    columns: list[str] = []
    for row in report:
        columns += [k for k in row if k not in columns]
    return columns


def _is_accuracy(measure: str) -> bool:
    """Whether a report column is an accuracy over the held-out problems."""
    return measure.startswith(("accuracy", "sampled"))


def _cell(value: Any, problems: int | None = None) -> str:
    """A report table cell: blank, 3 decimals for a share, 1 for a larger number; an accuracy
    over `problems` with its 95% interval."""
    if value is None:
        return ""
    if problems and isinstance(value, float) and 0.0 <= value <= 1.0:
        return format_interval(value, problems)
    return f"{value:.3f}" if isinstance(value, float) and value <= 1 else f"{value:.1f}"


def _one_line(evaluation: dict[str, float]) -> str:
    """A stage's evaluation on one line."""
    return ", ".join(f"{k} {v:.3f}" for k, v in evaluation.items())
