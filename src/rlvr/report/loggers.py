"""Experiment trackers beside the run directory: `--report-to none|tensorboard|wandb|trackio`.

metrics.jsonl and samples.jsonl stay the record of a run; a tracker gets a copy of what
`RunDirectory` writes (`RunDirectory.attach`): the config, each step's scalar metrics under the
same names as metrics.jsonl (`reward/mean`, `eval/greedy_acc`, ...) and the step's sample
completions as a table. A tracker that fails while logging is dropped with one warning; the
run and its JSONL files go on (`LoggerFanOut`).

Resuming (`resume_step`, the step of the checkpoint a run continues from): the steps after
it are trained again, and each tracker keeps one value per step as far as it can:
- TensorBoard: the new writer purges the events of steps after the checkpoint
  (`purge_step=resume_step + 1`), so the re-run steps replace them;
- wandb: the run resumes under the id kept in the run directory (`wandb-run-id.txt`); wandb
  itself keeps a run's steps increasing, so online it keeps the first values of steps it had
  already and the logger skips those (offline, each session is its own offline-run directory,
  merged by id on `wandb sync`);
- trackio: the run of the same name resumes (`resume="allow"`); trackio cannot delete logged
  steps, so steps it stored already keep their first values and the logger skips them.
A fresh run (no `resume_step`) starts a new wandb id, a new trackio run (trackio names need
not be unique) and clears the TensorBoard events an overwritten run left.

Optional packages are imported only when their tracker is opened; a missing one is a
one-line ConfigError with the pip command.
"""

from __future__ import annotations

import html
import importlib
import json
import math
import numbers
import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from rlvr.config import ConfigError, warn

REPORT_TO_CHOICES = ("none", "tensorboard", "wandb", "trackio")
"""The values of --report-to (comma-separated; `none` alone)."""

DEFAULT_PROJECT = "rlvr"
"""The wandb/trackio project of every run (wandb: $WANDB_PROJECT overrides it)."""

WANDB_ID_FILE = "wandb-run-id.txt"
"""The file of the run directory that keeps the wandb run id, to resume the same run."""

TENSORBOARD_DIR = "tensorboard"
"""The subdirectory of the run directory holding TensorBoard's event files."""


class Logger(Protocol):
    """One experiment tracker. `log_scalars` gets finite floats only (`scalars_of`)."""

    name: str

    def log_config(self, config: dict[str, Any]) -> None: ...

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None: ...

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


# --- choosing and opening -------------------------------------------------------------------


def parse_report_to(text: str) -> tuple[str, ...]:
    """The tracker names of a --report-to value, in order, duplicates removed; () for `none`
    or an empty value. Raises a one-line ConfigError for an unknown name or `none` combined
    with others."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    choices = ", ".join(REPORT_TO_CHOICES)
    for name in names:
        if name not in REPORT_TO_CHOICES:
            raise ConfigError(
                f"--report-to: unknown tracker {name!r}; choose from {choices} "
                "(comma-separated, e.g. --report-to tensorboard,wandb)"
            )
    if "none" in names and len(names) > 1:
        raise ConfigError(f"--report-to: 'none' cannot be combined with {text!r}; drop it")
    return () if names == ("none",) else names


def open_loggers(
    names: Iterable[str],
    run_dir: Path,
    run_name: str,
    config: dict[str, Any],
    resume_step: int | None,
    project: str = DEFAULT_PROJECT,
) -> list[Logger]:
    """One opened tracker per name of `parse_report_to`, for the run in `run_dir`. `config`
    goes to trackers that take it at the start (wandb, trackio); `resume_step` is the step of
    the checkpoint a resumed run continues from (None: a fresh run). If one cannot be opened
    (a missing package, a refused init), those opened already are closed and a one-line
    ConfigError is raised."""
    opened: list[Logger] = []
    try:
        for name in parse_report_to(",".join(names)):  # checked again: `none` opens nothing
            opened.append(_OPENERS[name](Path(run_dir), run_name, config, resume_step, project))
    except BaseException:
        LoggerFanOut(opened).close()
        raise
    return opened


def check_installed(names: Iterable[str]) -> None:
    """Refuse (a one-line ConfigError with the pip command) a tracker of `names` whose
    package is missing, without opening anything: for runs that open their trackers late."""
    for name in names:
        _require(name, name)


def _require(module: str, extra: str) -> ModuleType:
    """`module` imported, or a ConfigError naming the pip command of the extra `extra`."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"--report-to {extra} needs the {extra} package: pip install 'rlvr[{extra}]'"
        ) from None


def _init_failed(name: str, exc: Exception, hint: str) -> ConfigError:
    """A one-line ConfigError for a tracker whose start raised `exc`."""
    return ConfigError(f"--report-to {name}: could not start ({_describe(exc)}); {hint}")


# --- what the trackers get -------------------------------------------------------------------


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics record as floats (bools as 0/1), without its `step`;
    None, strings, lists and NaN/Inf are left out."""
    out = {}
    for key, value in record.items():
        if key == "step" or not isinstance(value, numbers.Real):
            continue
        value = float(value)
        if math.isfinite(value):
            out[key] = value
    return out


def sample_table(records: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of sample records: every key but `step`, in first-seen order; a key a
    record lacks is None; values other than str, numbers and None become JSON text."""
    columns = list(dict.fromkeys(k for r in records for k in r if k != "step"))
    rows = [[_cell(r.get(c)) for c in columns] for r in records]
    return columns, rows


def samples_payload(table: Callable[..., Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """`{"samples": table(columns=..., data=...)}` of `sample_table(records)`: what wandb's and
    trackio's `run.log` take, `table` being their Table class."""
    columns, rows = sample_table(records)
    return {"samples": table(columns=columns, data=rows)}


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, str | bool | int | float):
        return value
    return json.dumps(value, ensure_ascii=True, default=str)


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, str | float | int | bool]:
    """`config` with nested dicts flattened to dotted keys (`grpo.lr`), each value a str, int,
    float or bool (None is 'none', lists JSON text): what TensorBoard's hparams accept."""
    out: dict[str, str | float | int | bool] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= flat_config(value, f"{name}.")
        elif isinstance(value, str | bool | int | float):
            out[name] = value
        else:
            out[name] = "none" if value is None else json.dumps(value, default=str)
    return out


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table of (columns, rows) for TensorBoard's text tab: cell text HTML-escaped
    (completions may hold tags like <think>), pipes escaped, newlines as <br>."""

    def text(value: Any) -> str:
        return html.escape(str(value)).replace("|", "&#124;").replace("\n", "<br>")

    lines = ["| " + " | ".join(text(c) for c in columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(text(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


# --- TensorBoard -----------------------------------------------------------------------------


class TensorBoardLogger:
    """Event files in `run_dir/tensorboard/` (torch's SummaryWriter): scalars under the
    metrics.jsonl names, samples as a Markdown table (text tag `samples`) per step, the config
    as hparams and as YAML text (tag `config`)."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        log_dir = run_dir / TENSORBOARD_DIR
        if resume_step is None:  # a fresh run: an overwritten run's events are not its own
            for old in log_dir.glob("events.out.tfevents.*"):
                old.unlink()
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)

    def log_config(self, config: dict[str, Any]) -> None:
        import yaml
        from torch.utils.tensorboard.summary import hparams

        text = yaml.safe_dump(config, sort_keys=False)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)
        for summary in hparams(flat_config(config), {}):
            self.writer.file_writer.add_summary(summary)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        self.writer.add_text("samples", markdown_table(*sample_table(records)), step)

    def close(self) -> None:
        self.writer.close()


# --- Weights & Biases ------------------------------------------------------------------------


class WandbLogger:
    """A wandb run with its files under `run_dir/wandb/` (WANDB_MODE=offline works without an
    account): scalars via `run.log(..., step=step)`, samples as a wandb.Table `samples`, the
    config as the run's config. The run id is kept in `run_dir/wandb-run-id.txt`; a resumed
    run continues that id."""

    name = "wandb"

    def __init__(
        self,
        run_dir: Path,
        run_name: str,
        config: dict[str, Any],
        resume_step: int | None = None,
        project: str = DEFAULT_PROJECT,
    ):
        self.wandb = _require("wandb", "wandb")
        id_file = run_dir / WANDB_ID_FILE
        if resume_step is not None and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = uuid.uuid4().hex[:12]  # wandb's ids: letters and digits
            id_file.write_text(run_id + "\n")
        try:
            self.run = self.wandb.init(
                project=os.environ.get("WANDB_PROJECT") or project,
                name=run_name,
                dir=str(run_dir),
                config=config,
                id=run_id,
                resume="allow",
            )
        except Exception as exc:  # no account, no network: say so before any compute
            hint = "log in with `wandb login`, or set WANDB_MODE=offline to log locally"
            raise _init_failed(self.name, exc, hint) from None
        self.first_step = self.run.step  # a resumed online run's next step; else 0

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config, allow_val_change=True)

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        if step >= self.first_step:  # wandb refuses earlier steps of a resumed run anyway
            self.run.log(scalars, step=step)

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        if step >= self.first_step:
            self.run.log(samples_payload(self.wandb.Table, records), step=step)

    def close(self) -> None:
        self.run.finish()


# --- trackio ---------------------------------------------------------------------------------

_TRACKIO_REMOTE = ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL")


class TrackioLogger:
    """A local trackio run (its SQLite database under $TRACKIO_DIR, default
    $HF_HOME/trackio; `trackio show` opens the dashboard): scalars via `run.log`, samples as
    a trackio.Table `samples`, the config as the run's config. Never a Space or a server:
    with TRACKIO_SPACE_ID or TRACKIO_SERVER_URL set it refuses to start. A resumed run
    continues the trackio run of the same name and skips the steps it holds already."""

    name = "trackio"

    def __init__(
        self,
        run_name: str,
        config: dict[str, Any],
        resume_step: int | None = None,
        project: str = DEFAULT_PROJECT,
    ):
        remote = [v for v in _TRACKIO_REMOTE if os.environ.get(v)]
        if remote:
            raise ConfigError(
                f"--report-to trackio logs locally only; unset {' and '.join(remote)} "
                "(rlvr never sends a run to a Space or server)"
            )
        self.trackio = _require("trackio", "trackio")
        try:
            self.run = self.trackio.init(
                project=project,
                name=run_name,
                config=config,
                resume="never" if resume_step is None else "allow",
                embed=False,
                auto_log_cpu=False,  # no background system-metrics threads
                auto_log_gpu=False,
            )
            last = self.trackio.SQLiteStorage.get_last_step(project, run_name, run_id=self.run.id)
        except Exception as exc:
            raise _init_failed(self.name, exc, "check $TRACKIO_DIR is writable") from None
        self.first_step = 0 if last is None else last + 1

    def log_config(self, config: dict[str, Any]) -> None:
        self.run.config.update(config)  # stored with the run's first logged step

    def log_scalars(self, step: int, scalars: dict[str, float]) -> None:
        if step >= self.first_step:
            self.run.log(scalars, step=step)

    def log_samples(self, step: int, records: list[dict[str, Any]]) -> None:
        if step >= self.first_step:
            self.run.log(samples_payload(self.trackio.Table, records), step=step)

    def close(self) -> None:
        if self.trackio.context_vars.current_run.get() is self.run:
            self.trackio.finish()  # also forgets it, or trackio's exit hook finishes it again
        else:
            self.run.finish()


_OPENERS = {
    "tensorboard": lambda d, name, config, resume, project: TensorBoardLogger(d, resume),
    "wandb": WandbLogger,
    "trackio": lambda d, name, config, resume, project: TrackioLogger(
        name, config, resume, project
    ),
}


# --- fan-out ---------------------------------------------------------------------------------


class LoggerFanOut:
    """The attached trackers of a run directory, called in turn; with none it does nothing.
    A tracker that raises is closed (its own errors ignored) and dropped after one warning:
    a tracker never stops a run."""

    def __init__(self, loggers: Iterable[Logger] = ()):
        self.loggers: list[Logger] = list(loggers)

    def extend(self, loggers: Iterable[Logger]) -> None:
        self.loggers.extend(loggers)

    def log_config(self, config: dict[str, Any]) -> None:
        self._each("log_config", config)

    def log_metrics(self, record: dict[str, Any]) -> None:
        """A metrics.jsonl record's finite scalars at its `step` (a record without an int
        step is not sent)."""
        step = record.get("step")
        if isinstance(step, int):
            self._each("log_scalars", step, scalars_of(record))

    def log_samples(self, records: list[dict[str, Any]]) -> None:
        """Sample records, one call per step (records without an int step are not sent)."""
        by_step: dict[int, list[dict[str, Any]]] = {}
        for record in records:
            if isinstance(step := record.get("step"), int):
                by_step.setdefault(step, []).append(record)
        for step, group in by_step.items():
            self._each("log_samples", step, group)

    def close(self) -> None:
        """Close every tracker (a failing close is warned about), and forget them."""
        loggers, self.loggers = self.loggers, []
        for logger in loggers:
            try:
                logger.close()
            except Exception as exc:
                warn(f"--report-to {logger.name}: closing failed ({_describe(exc)})")

    def _each(self, method: str, *args: Any) -> None:
        for logger in list(self.loggers):
            try:
                getattr(logger, method)(*args)
            except Exception as exc:
                self.loggers.remove(logger)
                warn(
                    f"--report-to {logger.name}: {method} failed ({_describe(exc)}); "
                    "that tracker is dropped, metrics.jsonl is still written"
                )
                try:
                    logger.close()
                except Exception:
                    pass  # already failing: the warning above is the one said


def _describe(exc: BaseException) -> str:
    """`TypeName: the first line of its message`, for one-line messages."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first_line}"
