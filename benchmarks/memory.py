"""Peak memory of one update step: PPO (policy + critic + reference) against GRPO.

    python benchmarks/memory.py            # two model sizes, three setups each
    python benchmarks/memory.py --json memory.json   # the same table, also as a JSON dict

Each (size, setup) runs in its own process: it imports everything, notes its resident memory,
builds the models the setup needs, runs one full step (sample, verify, advantages, update; a
reward that alternates 0, 1 within each group, so that every row is updated) and reports its
peak resident memory. rlvr's defaults hold: two worker threads, so two micro-batches'
activations and two copies of the gradients are alive at once during the update (the last
setup runs one worker, to show what that costs). The table
shows the peak above the post-import baseline, which is what the models, optimizer states and
activations cost, and its ratio to PPO's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

SIZES = {
    "1.2M (lab)": {"hidden_size": 160, "num_layers": 3, "num_heads": 4, "intermediate_size": 640},
    "57M": {"hidden_size": 768, "num_layers": 8, "num_heads": 12, "intermediate_size": 3072},
}
# short names of the sizes and setups in the --json file (keys a dotted path can name)
SIZE_KEYS = {"1.2M (lab)": "lab", "57M": "m57"}
SETUP_KEYS = {
    "PPO (policy, critic, reference)": "ppo",
    "GRPO, beta > 0 (policy, reference)": "grpo_ref",
    "GRPO, beta = 0 (policy only)": "grpo",
    "GRPO, beta = 0, one worker thread": "grpo_one_worker",
}
SETUPS = {
    "PPO (policy, critic, reference)": {
        "advantage_estimator": "gae",
        "beta": 0.01,
        "kl_in_reward": True,
        "kl_estimator": "k1",
    },
    "GRPO, beta > 0 (policy, reference)": {"beta": 0.04},
    "GRPO, beta = 0 (policy only)": {"beta": 0.0},
    "GRPO, beta = 0, one worker thread": {"beta": 0.0, "cpu_workers": 1},
}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(size: str, setup: str) -> None:

    import torch

    from rlvr.config import apply_overrides
    from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
    from rlvr.report.timer import StepTimer
    from rlvr.tasks.arithmetic import ArithmeticTaskConfig, train_problems
    from rlvr.train.config import GRPOConfig
    from rlvr.train.grpo import build_trainer, grpo_step

    torch.set_num_threads(2)
    tokenizer = build_char_tokenizer()
    problems = train_problems(ArithmeticTaskConfig(), seed=0)
    config = apply_overrides(
        GRPOConfig(prompts_per_step=8, group_size=4, max_new_tokens=48), SETUPS[setup]
    )
    baseline = current_rss_mb()
    policy = build_tiny_model(TinyModelConfig(**SIZES[size]), tokenizer, seed=0)
    rows = ({"prompt": p.prompt, "answer": p.answer} for p in problems)

    def alternating_reward(prompts, completions, **_):
        # every group has reward variance, so every setup updates on every row (a fresh model
        # solves nothing: under the math reward, GRPO would leave every row out of the update)
        return [float(i % 2) for i in range(len(completions))]

    t = build_trainer(policy, tokenizer, rows, [alternating_reward], config, seed=0)
    grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())
    params = sum(p.numel() for p in policy.parameters())
    print(json.dumps({"baseline_mb": baseline, "peak_mb": rss_mb(), "params": params}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("SIZE", "SETUP"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the table's numbers as a JSON dict: sizes.<lab|m57>.<setup> with "
        "peak_above_baseline_mb, ratio_to_ppo, params, baseline_mb, peak_mb",
    )
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    report: dict = {"sizes": {}}
    print("| model | setup | peak above baseline (MB) | ratio to PPO |")
    print("| --- | --- | --- | --- |")
    for size in SIZES:
        results = {}
        raw = {}
        for setup in SETUPS:
            out = subprocess.run(
                [sys.executable, __file__, "--child", size, setup],
                check=True,
                capture_output=True,
                text=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[setup] = r["peak_mb"] - r["baseline_mb"]
            raw[setup] = r
        ppo = results[next(iter(SETUPS))]
        setups = {}
        for setup, mb in results.items():
            print(f"| {size} | {setup} | {mb:.0f} | {mb / ppo:.2f} |")
            setups[SETUP_KEYS[setup]] = {
                "setup": setup,
                "peak_above_baseline_mb": mb,
                "ratio_to_ppo": mb / ppo,
                **raw[setup],
            }
        report["sizes"][SIZE_KEYS[size]] = {"model": size, **SIZES[size], "setups": setups}
    if args.json:
        from rlvr.report.environment import environment

        report["environment"] = environment()
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
