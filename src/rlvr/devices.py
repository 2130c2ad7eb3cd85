"""Where a command's model runs and in what precision, decided once per command.

`--device auto|cpu|cuda|cuda:N` and `--dtype auto|float32|bfloat16` resolve to a `Precision`
before any model loads: `--device cuda` on a machine without CUDA is a one-line `DeviceError`.

Weights and optimizer state stay float32 ("master" weights); `bfloat16` runs the forward
passes (sampling, log-probs, the loss) under `torch.autocast`, so matmuls run in bf16 while
reductions, softmax and the optimizer keep float32. That is the default on CUDA; the CPU
defaults to float32 (bf16 autocast on a CPU without native bf16 is slower, not faster: asked
for explicitly there, it warns and falls back). One switch, one place: `Precision.autocast()`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from rlvr.config import UserError, warn

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
DTYPE_CHOICES = ("auto", "float32", "bfloat16")


class DeviceError(UserError, ValueError):
    """A `--device` or `--dtype` this machine cannot honour."""


@dataclass(frozen=True)
class Precision:
    """A resolved device and compute dtype (weights stay float32)."""

    device: torch.device
    dtype: torch.dtype

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    def autocast(self) -> contextlib.AbstractContextManager:
        """The compute-precision context for forward passes: bf16 autocast, or nothing."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def dtype_name(self) -> str:
        """ "float32" or "bfloat16": the `--dtype` value that resolves to this precision."""
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        """e.g. "cuda:0, bfloat16 autocast (float32 weights)" or "cpu, float32"."""
        if self.dtype == torch.float32:
            return f"{self.device}, float32"
        return f"{self.device}, {self.dtype_name} autocast (float32 weights)"


def resolve_device(spec: str) -> torch.device:
    """`auto` (CUDA when present, else the CPU), `cpu`, `cuda` or `cuda:N`, checked against this
    machine: a `DeviceError` naming what is missing when it cannot run there."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        index = spec.removeprefix("cuda").removeprefix(":") or "0"
        if not index.isdigit():
            raise DeviceError(f"--device {spec}: expected {DEVICE_CHOICES}")
        if not torch.cuda.is_available():
            raise DeviceError(
                f"--device {spec}: this machine has no CUDA device (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'no'}); use --device cpu"
            )
        if int(index) >= torch.cuda.device_count():
            raise DeviceError(
                f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here "
                f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})"
            )
        return torch.device(f"cuda:{index}")
    raise DeviceError(f"--device {spec}: expected {DEVICE_CHOICES}")


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """`auto` (bfloat16 on CUDA, float32 on the CPU), `float32` or `bfloat16`. bf16 where the
    device lacks it warns on stderr and gives float32."""
    spec = spec.strip().lower()
    if spec not in DTYPE_CHOICES:
        raise DeviceError(f"--dtype {spec}: expected one of {', '.join(DTYPE_CHOICES)}")
    if spec == "float32":
        return torch.float32
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16
        if spec == "bfloat16":
            warn(f"--dtype bfloat16: {device} has no bf16 support; running in float32")
        return torch.float32
    if spec == "bfloat16":
        if cpu_has_bf16():
            return torch.bfloat16
        warn("--dtype bfloat16: this CPU has no native bf16 (AVX512-BF16/AMX); running in float32")
    return torch.float32


def resolve_precision(device: str = "auto", dtype: str = "auto") -> Precision:
    """`resolve_device` then `resolve_dtype`: what a command does first, before loading."""
    resolved = resolve_device(device)
    return Precision(resolved, resolve_dtype(dtype, resolved))


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX, as torch detects them)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def generator_on(generator: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """`generator` itself when it lives on `device` (or is None); otherwise a generator on
    `device` seeded by one draw from `generator`: sampling then draws on the device with no
    host round trip per token, and the run stays reproducible from the (checkpointed)
    host generator."""
    if generator is None or generator.device == torch.device(device):
        return generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    return torch.Generator(device).manual_seed(seed)


@contextlib.contextmanager
def on_device(precision: Precision) -> Iterator[None]:
    """`precision.autocast()` around a block, and the current CUDA device set for it."""
    if precision.device.type == "cuda":
        with torch.cuda.device(precision.device), precision.autocast():
            yield
    else:
        with precision.autocast():
            yield
