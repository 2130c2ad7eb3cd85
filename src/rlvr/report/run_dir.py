"""A run is a directory: config.yaml, metrics.jsonl, samples.jsonl, plots, summary.json, model/.

Experiment trackers (`rlvr.report.loggers`, --report-to) attached to it get a copy of the
config, metrics and samples it writes; the JSONL files are written whatever they do.

Model-written text is only ever stored as JSON data, never used as a path or a command.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from rlvr.config import ConfigError, RunExistsError, UserError
from rlvr.report.environment import environment, environment_line
from rlvr.report.loggers import Logger, LoggerFanOut

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


LOCK_FILE = ".lock"
"""The file of a run directory that the process writing it holds locked (`claim`)."""


class RunDirectoryError(UserError, PermissionError):
    """A run directory that cannot be created or written."""


class RunInUseError(UserError, RuntimeError):
    """A run directory that another live process is writing (`RunDirectory.claim`)."""


class RunDirectory:
    """Paths and writers of one run directory. Its refusals are user errors (the CLI prints
    one line): a bad name (`ConfigError`), an existing directory without `overwrite` or
    `resume` (`RunExistsError`, a FileExistsError), an unwritable place (`RunDirectoryError`).

    `attach(loggers)` sends what `write_config`, `log_metrics` and `log_samples` write to
    trackers too; `close()` (or leaving a `with` block) closes them. With `claim` the process
    holds the directory until then (`claim()`, before `overwrite` deletes anything): a second
    live run there is refused (`RunInUseError`)."""

    def __init__(
        self,
        root: str | Path,
        name: str,
        overwrite: bool = False,
        resume: bool = False,
        claim: bool = False,
    ):
        if not _SAFE_NAME.match(name):
            raise ConfigError(
                f"run name {name!r} must be 1-100 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        self.path = Path(root) / name
        if self.path.exists() and any(self.path.iterdir()) and not (overwrite or resume):
            raise RunExistsError(
                f"run directory {self.path} already exists; pass --overwrite to replace it "
                "or choose another --run-name"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:  # refuse before any compute is spent, not at the first log line
            raise RunDirectoryError(f"cannot write the run directory {self.path}: {exc}") from None
        self.loggers = LoggerFanOut()
        self._lock: int | None = None  # the descriptor holding LOCK_FILE (`claim`)
        if claim:
            self.claim()
        if overwrite:
            for f in ("metrics.jsonl", "samples.jsonl", "summary.json"):
                (self.path / f).unlink(missing_ok=True)

    def claim(self) -> None:
        """Hold the directory for this process until `close()`, or its exit however it ends
        (an advisory `flock` of LOCK_FILE, which the kernel drops with the process, SIGKILL
        included). Another live process holding it, say the run a `--resume` would continue
        (or its orphaned ranks), is a `RunInUseError` naming its pid: two writers of one run
        mix their checkpoints, logs and weights. Nothing is held where `fcntl` is missing."""
        try:
            import fcntl
        except ImportError:  # not POSIX
            return
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunInUseError(
                f"run directory {self.path} is in use by a live process (pid {holder}); let "
                "it finish or stop it (under torchrun, its ranks too) before writing there"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock = fd

    def attach(self, loggers: Iterable[Logger]) -> None:
        """Send the config, metrics and samples written from now on to `loggers` as well (a
        failing one is dropped with a warning: `LoggerFanOut`)."""
        self.loggers.extend(loggers)

    def close(self) -> None:
        """Close the attached trackers (the JSONL files need no closing) and let the directory
        go (`claim`)."""
        self.loggers.close()
        if self._lock is not None:
            os.close(self._lock)  # the lock goes with the descriptor
            self._lock = None

    def __del__(self) -> None:  # a run dropped without close(), e.g. by an error
        if getattr(self, "_lock", None) is not None:
            os.close(self._lock)

    def __enter__(self) -> RunDirectory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def samples_path(self) -> Path:
        return self.path / "samples.jsonl"

    @property
    def model_path(self) -> Path:
        return self.path / "model"

    def write_config(self, config: Any) -> None:
        data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
        data = json.loads(json.dumps(data))
        ran_on = f"# written by {environment_line()}\n"  # a comment: --resume reads the rest
        (self.path / "config.yaml").write_text(ran_on + yaml.safe_dump(data, sort_keys=False))
        self.loggers.log_config(data)

    def log_metrics(self, record: dict[str, Any]) -> None:
        _append_jsonl(self.metrics_path, record)
        self.loggers.log_metrics(record)

    def log_samples(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            _append_jsonl(self.samples_path, record)
        self.loggers.log_samples(records)

    def truncate_logs(self, after_step: int) -> None:
        """Drop metric and sample lines of steps after `after_step` (those a resumed run will
        write again; -1: every line), rewriting each file atomically."""
        for path in (self.metrics_path, self.samples_path):
            kept = [r for r in read_jsonl(path) if r.get("step", 0) <= after_step]
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r, ensure_ascii=True) + "\n" for r in kept))
            tmp.replace(path)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """summary.json: `summary` and the `environment` it was measured in."""
        summary = {**summary, "environment": environment()}
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, ensure_ascii=True) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSONL file (an empty list if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
