"""Helpers shared by the benchmarks: the lab's task and base model, the machine's matmul
ceiling, the arithmetic (FLOP) counts of a step, peak memory, medians and markdown tables.

FLOP conventions (model FLOPs, as in MFU figures):
- a forward pass costs 2 x parameters per token, a forward + backward 6 x parameters;
- attention adds, per layer and token with `c` tokens of context, 4 x hidden x c in the
  forward (QK^T and AV), three times that for forward + backward; causal, so a sequence of
  length L costs sum_{c=1..L} c = L (L + 1) / 2 token-contexts.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

# rlvr's CLI sets this before torch loads; every benchmark process gets it too (with two
# threads and OpenMP's default busy-wait, a step on a shared CPU ran ten times slower)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


def lab_setup(digits: int):
    """(LabConfig, TaskSpec) of the lab's arithmetic task with `digits`-digit operands, every
    other setting (base model, shape, seeds) the lab's default."""
    from rlvr.config import RunPlace
    from rlvr.pipelines.lab import LabConfig, lab_task
    from rlvr.tasks.arithmetic import ArithmeticTaskConfig
    from rlvr.tasks.registry import TaskChoice

    task = TaskChoice(arithmetic=ArithmeticTaskConfig(digits=digits))
    config = LabConfig(task=task, place=RunPlace(progress=False))
    return config, lab_task(config)


def digit_credit_reward(prompts, completions, answer, **_) -> list[float]:
    """Partial credit (TRL's signature): the share of the reference's digits that the final
    answer (`#### X`, as the strict verifier extracts it) has in the same place, counted from
    the right. The `long` setting's base solves nothing, so the strict reward is 0 everywhere;
    this one still differs within groups, so both frameworks do a real update."""
    from rlvr.verifiers.math import extract_final_answer

    out = []
    for completion, reference in zip(completions, answer):
        final = extract_final_answer(completion) or ""
        pairs = zip(reversed(final.strip()), reversed(reference))
        out.append(sum(a == b for a, b in pairs) / len(reference))
    return out


def reward_fn(spec: dict, task):
    """The training reward of a setting: the task's strict verifier, or digit credit."""
    return digit_credit_reward if spec.get("reward") == "digits" else task.reward_fn


def base_model_dir(config, task, random_init: bool = False) -> tuple[Path, str]:
    """(directory, how it was made) of the base model: the lab's own cached base, built by the
    lab's function when missing, or (random_init) a freshly initialised model of the same
    shape, saved to a temporary directory."""
    from rlvr.models.tiny import build_char_tokenizer, build_tiny_model, save_model
    from rlvr.pipelines.base_model import cache_root
    from rlvr.pipelines.lab import build_base_model

    if random_init:
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(config.tiny, tokenizer, seed=config.base.seed)
        directory = Path(tempfile.mkdtemp(prefix="rlvr-bench-random-"))
        save_model(model, tokenizer, directory)
        return directory, "randomly initialised (same weights for every framework)"
    start = time.perf_counter()
    directory, cached = build_base_model(config, task)
    if cached:
        how = f"lab base ({config.base.steps} steps), cached in {cache_root(config.cache_dir)}"
    else:
        seconds = time.perf_counter() - start
        how = f"lab base ({config.base.steps} steps), trained now in {seconds:.0f} s"
    return directory, how


def base_is_cached(config) -> bool:
    from rlvr.pipelines.lab import lab_base_dir

    return (lab_base_dir(config) / "config.json").exists()


def matmul_gflops(n: int = 2048, threads: int = 2, repeats: int = 5) -> float:
    """The machine's large-matmul rate: fp32 n x n @ n x n on `threads` threads, the median of
    `repeats` timings after one warm-up (GFLOP/s)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    torch.set_num_threads(previous)
    return 2 * n**3 / statistics.median(times) / 1e9


def model_shape(model) -> dict[str, int]:
    """Parameters (tied embeddings once), layers and hidden size of a Hugging Face causal LM."""
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "layers": model.config.num_hidden_layers,
        "hidden": model.config.hidden_size,
    }


def _causal_contexts(start: float, length: float) -> float:
    """sum of c for c = start+1 .. start+length: token-contexts of `length` tokens appended
    after `start` tokens."""
    return length * (2 * start + length + 1) / 2


def update_flops(shape: dict[str, int], rows: int, seq_len: float) -> float:
    """Forward + backward over `rows` sequences of `seq_len` tokens (prompt + completion).
    Callers pass the mean length actually run: padding, which rlvr trims, and prompt copies,
    which it runs once per group, earn no credit."""
    dense = 6 * shape["params"] * rows * seq_len
    attention = 3 * 4 * shape["layers"] * shape["hidden"] * rows * _causal_contexts(0, seq_len)
    return dense + attention


def generation_flops(
    shape: dict[str, int], rows: int, prompt_len: float, completion_len: float
) -> float:
    """Forward passes that produce `completion_len` tokens (mean) for each of `rows` rows after
    a `prompt_len`-token prompt: 2 x params per completion token plus its attention."""
    dense = 2 * shape["params"] * rows * completion_len
    contexts = _causal_contexts(prompt_len, completion_len)
    return dense + 4 * shape["layers"] * shape["hidden"] * rows * contexts


def current_rss_mb() -> float:
    """Resident memory of this process now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (the kernel's high-water mark)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
