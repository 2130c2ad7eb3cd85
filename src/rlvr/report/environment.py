"""What a run ran on: the library versions, the CPU and the accelerator.

A seeded run is bit-identical on one machine with one set of versions; on another CPU or
another release its floating-point results, and at the lab's size its trajectory, differ.
Every run directory records these beside its numbers (summary.json's `environment`, the
comment at the top of config.yaml), so two runs can be compared knowing whether they should
agree exactly.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
from pathlib import Path

import torch


@functools.cache
def environment() -> dict[str, str | int | None]:
    """Versions (python, rlvr, torch, transformers), the CPU's model name and core count, torch's
    thread count, and the CUDA device's name (None without one)."""
    return {
        "python": platform.python_version(),
        "rlvr": _version("rlvr"),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def environment_line() -> str:
    """`environment()` on one line, `key value` pairs joined by commas."""
    return ", ".join(f"{k} {v}" for k, v in environment().items())


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; `platform.processor()` elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
