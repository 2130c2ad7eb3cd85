"""Peak memory and seconds of one GRPO loss forward + backward at real size: whole logits,
chunked log-probs, gradient checkpointing, and both.

    python benchmarks/bench_memory.py                          # SmolLM2-135M, 16x256 and 8x1024
    python benchmarks/bench_memory.py --settings 8x256,2x1024 --rounds 2
    python benchmarks/bench_memory.py --model DIR --device cuda --random-init

The model is the directory `rlvr models prepare smollm2-135m-instruct` writes (under
$RLVR_CACHE/models, default ~/.cache/rlvr/models), or `--model DIR` (`--random-init` builds it
from DIR's config.json alone: memory and time do not depend on the weights). A setting
`ROWSxTOKENS` is that many rows of that many completion tokens (every row full length, the
worst case), after left-padded prompts of up to `--prompt-tokens` tokens, in groups of 4 rows.

Each (round, setting, mode) runs in a fresh process, the modes taking turns within a setting
so machine load falls on all alike. The process loads the model, computes the sampling
log-probs (no grad, chunked), resets the kernel's peak-RSS mark (`/proc/self/clear_refs`) and
runs `accumulate_gradients` once: the loss forward (`completion_logprobs`, a prompt per row in
every mode, since a KV cache cannot be checkpointed) and its backward into `.grad`. Reported:
the peak RSS during that call (model, gradients, activations, logits), the part of it above the
RSS before the call, its wall and CPU seconds (medians over rounds; CPU time is the steadier
on a shared machine), and the peak and CPU time relative to baseline. On CUDA the peak is
`torch.cuda.max_memory_allocated` (and CPU time means little). Children run with a fixed
glibc mmap threshold (`MALLOC_MMAP_THRESHOLD`), so the RSS peak is that of the live tensors.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _common as common

MODES = {
    "baseline": {"chunk": 0, "checkpointing": False},
    "chunked": {"chunk": None, "checkpointing": False},  # None: --chunk
    "gc": {"chunk": 0, "checkpointing": True},
    "chunked+gc": {"chunk": None, "checkpointing": True},
}
MALLOC_MMAP_THRESHOLD = "131072"
"""glibc's mmap threshold, fixed in every child (unless set): a freed tensor is then given back
to the kernel at once, so RSS follows the live tensors instead of glibc's raised threshold
keeping freed activations in its arenas (which made the modes' peaks differ by noise)."""
GROUP_SIZE = 4


def default_model_dir() -> Path:
    """Where `rlvr models prepare smollm2-135m-instruct` puts the converted model."""
    from rlvr.pipelines.base_model import cache_root

    return cache_root(None) / "models" / "smollm2-135m-instruct"


def reset_peak_rss() -> bool:
    """Set the kernel's peak-RSS mark (VmHWM) to the current RSS; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_since_reset_mb() -> float:
    """VmHWM (the peak since `reset_peak_rss`), else getrusage's lifetime peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return common.peak_rss_mb()


def child(spec: dict) -> dict:
    """One measurement in this process: see the module docstring."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr.models.logprobs import completion_logprobs
    from rlvr.models.tiny import load_model
    from rlvr.rollout.sampler import RolloutBatch
    from rlvr.train.config import GRPOConfig, build_plan
    from rlvr.train.grpo import enable_gradient_checkpointing
    from rlvr.train.update import accumulate_gradients, plan_update_work

    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    if spec["random_init"]:
        config = AutoConfig.from_pretrained(spec["model"], local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model, _ = load_model(spec["model"])
    model.to(device).train()
    if spec["checkpointing"]:
        enable_gradient_checkpointing(model)
    rows, tokens, width = spec["rows"], spec["tokens"], spec["prompt_tokens"]
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    groups = -(-rows // GROUP_SIZE)
    prompt_ids = torch.randint(0, vocab, (groups, width), generator=g)
    prompt_mask = torch.ones(groups, width, dtype=torch.long)
    for i in range(groups):  # prompts of unequal length: left padding
        prompt_mask[i, : (i % 4) * width // 8] = 0
    group_ids = torch.arange(rows) // GROUP_SIZE
    prompt_ids, prompt_mask = prompt_ids[group_ids], prompt_mask[group_ids]
    completion_ids = torch.randint(0, vocab, (rows, tokens), generator=g)
    completion_mask = torch.ones(rows, tokens)
    cols = [t.to(device) for t in (prompt_ids, prompt_mask, completion_ids, completion_mask)]
    with torch.no_grad():  # the sampling log-probs: the update's first pass is on-policy
        old = completion_logprobs(model, *cols, 1.0, 1024)
    batch = RolloutBatch(
        *cols,
        logprobs=old,
        truncated=torch.zeros(rows, dtype=torch.bool, device=device),
        group_ids=group_ids.to(device),
        completions=[""] * rows,
    )
    advantages = torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0).to(device)
    plan = build_plan(GRPOConfig(max_new_tokens=tokens))
    work = plan_update_work(
        batch,
        advantages,
        batch.completion_mask,
        skip_zero_advantage=True,
        workers=1,
        micro_batch_tokens=0,
        forwards=("padded",),
    )
    before = common.current_rss_mb()
    reset = reset_peak_rss()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_before = torch.cuda.memory_allocated() / 2**20
    t0, c0 = time.perf_counter(), time.process_time()
    result = accumulate_gradients(
        model,
        batch,
        work,
        advantages,
        batch.completion_mask,
        None,
        plan.loss_fn,
        1.0,
        1,
        logprob_chunk_tokens=spec["chunk"],
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    out = {
        "peak_mb": peak_rss_since_reset_mb() if reset else common.peak_rss_mb(),
        "before_mb": before,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "loss": result.loss,
        "peak_reset": reset,
    }
    if device.type == "cuda":
        out["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["before_mb"] = cuda_before
    return out


def run_child(spec: dict, timeout: float) -> dict:
    env = {"MALLOC_MMAP_THRESHOLD_": MALLOC_MMAP_THRESHOLD, **os.environ}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if proc.returncode != 0:
        common.say(proc.stderr[-3000:])
        raise SystemExit(f"child {spec['mode']} {spec['rows']}x{spec['tokens']} failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face model dir")
    parser.add_argument("--random-init", action="store_true", help="only DIR's config.json")
    parser.add_argument("--settings", default="16x256,8x1024", help="ROWSxTOKENS,...")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--chunk", type=int, default=None, help="default: 1024")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return

    from rlvr.train.config import LOGPROB_CHUNK_TOKENS

    model_dir = args.model or default_model_dir()
    if not (model_dir / "config.json").is_file():
        raise SystemExit(
            f"no model at {model_dir}: run `rlvr models prepare smollm2-135m-instruct` "
            "or pass --model DIR"
        )
    chunk = args.chunk if args.chunk is not None else LOGPROB_CHUNK_TOKENS
    settings = [tuple(int(x) for x in s.split("x")) for s in args.settings.split(",")]
    modes = args.modes.split(",")
    results: dict[tuple, list[dict]] = {}
    for round_ in range(args.rounds):
        for rows, tokens in settings:
            for mode in modes:
                spec = {
                    "mode": mode,
                    "model": str(model_dir),
                    "random_init": args.random_init,
                    "rows": rows,
                    "tokens": tokens,
                    "prompt_tokens": args.prompt_tokens,
                    "chunk": MODES[mode]["chunk"] if MODES[mode]["chunk"] is not None else chunk,
                    "checkpointing": MODES[mode]["checkpointing"],
                    "threads": args.threads,
                    "device": args.device,
                }
                r = run_child(spec, args.timeout)
                common.say(f"round {round_ + 1} {mode} {rows}x{tokens}: {r}")
                results.setdefault((rows, tokens, mode), []).append(r)

    memory = "peak CUDA MB" if args.device.startswith("cuda") else "peak RSS MB"
    header = ["mode", "rows", "tokens", memory, "above model MB", "seconds", "CPU s"]
    header += ["memory ratio", "CPU time ratio"]
    table = []
    for rows, tokens in settings:
        base = results.get((rows, tokens, "baseline"))
        base_peak = common.median(r["peak_mb"] for r in base) if base else float("nan")
        base_cpu = common.median(r["cpu_seconds"] for r in base) if base else float("nan")
        for mode in modes:
            rs = results[(rows, tokens, mode)]
            peak = common.median(r["peak_mb"] for r in rs)
            above = common.median(r["peak_mb"] - r["before_mb"] for r in rs)
            seconds = common.median(r["seconds"] for r in rs)
            cpu = common.median(r["cpu_seconds"] for r in rs)
            table.append(
                [mode, rows, tokens, f"{peak:.0f}", f"{above:.0f}", f"{seconds:.1f}", f"{cpu:.1f}"]
                + [f"{peak / base_peak:.2f}", f"{cpu / base_cpu:.2f}"]
            )
    print(
        f"model {model_dir.name}, chunk {chunk} tokens, prompts up to {args.prompt_tokens} "
        f"tokens, {args.threads} threads, {args.device}, median of {args.rounds} round(s)\n"
    )
    print(common.markdown_table(header, table))


if __name__ == "__main__":
    main()
