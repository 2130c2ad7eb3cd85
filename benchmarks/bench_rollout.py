"""Rollout decode work: what each of the sampler's savings is worth, one added at a time.

    python benchmarks/bench_rollout.py            # lab base model, 16 prompts x 8 samples
    python benchmarks/bench_rollout.py --quick

The lab's cached base model (built by `rlvr lab`'s own function if missing) samples the same
prompts in five modes, interleaved round by round so that machine load hits each alike:
every row decoding until the longest ends, the prompt prefilled once per row and the KV cache
grown by concatenation (what `model.generate` does); then, cumulatively, the prompt's cache
shared by its G samples, finished rows dropped, the KV cache written in place, and the
prompts split between worker threads, one per core (rlvr's default on a CPU). The first four
run on `--threads` torch threads, the last on as many workers with one each. Two completion
budgets: the lab's (48 tokens, worked solutions of ~37) and 128 tokens, where sampled lengths
spread further. The table gives median seconds per sampling call, completion tokens per
second, and the ratio to the first mode.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

GENERATE_LIKE = dict(drop_finished=False, share_prompt_cache=False, preallocate_cache=False)
MODES = {
    "decode to longest, prefill per row, cache by concatenation": GENERATE_LIKE,
    "+ shared prompt cache": {**GENERATE_LIKE, "share_prompt_cache": True},
    "+ drop finished rows": {**GENERATE_LIKE, "share_prompt_cache": True, "drop_finished": True},
    "+ cache written in place": dict(preallocate_cache=True),
    "+ one worker thread per torch thread (rlvr default)": dict(workers=0),  # set to --threads
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="torch threads, single worker")
    parser.add_argument("--quick", action="store_true", help="2 rounds, smoke test")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(args.threads)

    from rlvr.config import RunPlace
    from rlvr.models.tiny import load_model
    from rlvr.pipelines.lab import LabConfig, build_base_model, lab_task
    from rlvr.rollout.sampler import sample_completions

    config = LabConfig(place=RunPlace(progress=False))
    task = lab_task(config)
    model_dir, _ = build_base_model(config, task)
    model, tokenizer = load_model(model_dir)
    rows = iter(task.train_rows(0))
    print("| budget | mode | s per call | completion tok/s | x first mode |")
    print("| --- | --- | --- | --- | --- |")
    for budget in (task.max_new_tokens, 128):
        seconds = {m: [] for m in MODES}
        tokens = {m: [] for m in MODES}
        for r in range(rounds):
            prompts = [next(rows)["prompt"] for _ in range(args.prompts)]
            for mode, switches in MODES.items():
                generator = torch.Generator().manual_seed(r)
                t0 = time.perf_counter()
                batch = sample_completions(
                    model,
                    tokenizer,
                    prompts,
                    args.group_size,
                    budget,
                    1.0,
                    generator,
                    **{**switches, **({"workers": args.threads} if "workers" in switches else {})},
                )
                seconds[mode].append(time.perf_counter() - t0)
                tokens[mode].append(batch.lengths.sum().item())
        first = None
        for mode in MODES:
            s = statistics.median(seconds[mode])
            rate = sum(tokens[mode]) / sum(seconds[mode])
            first = first or rate
            print(f"| {budget} | {mode} | {s:.3f} | {rate:,.0f} | {rate / first:.2f} |")


if __name__ == "__main__":
    main()
