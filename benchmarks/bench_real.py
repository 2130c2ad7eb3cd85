"""rlvr against TRL's GRPOTrainer on SmolLM2-135M-Instruct: full fine-tuning and LoRA.

    pip install -e ".[bench,lora]"                  # trl==1.16.0 and peft
    rlvr models prepare smollm2-135m-instruct       # once: the checkpoint (prints its directory)
    python benchmarks/bench_real.py                 # both modes, 2 steps each, 2 rounds (~11 min)
    python benchmarks/bench_real.py --mode lora --steps 10 --rounds 5 --out real.json
    python benchmarks/bench_real.py --model DIR     # another copy of the checkpoint
    python benchmarks/bench_real.py --quick         # smoke test: 2 x 4 completions, 16 tokens
    python benchmarks/bench_real.py --eval          # also held-out accuracy after the last step

The design is `benchmarks/bench_trl.py`'s, and so is most of the code: its two children (rlvr's
`train_grpo`, TRL's `GRPOTrainer`, each in its own process, with its own peak memory), its
parent-child protocol, its TRL configuration and its step summaries are imported from it. What
differs is the model, the task and the mode, which this file's `child` puts in place of the
lab's before handing over to bench_trl's child: the lab's task slot (`_common.lab_setup`)
returns the task below; with LoRA, rlvr's model gets its adapters as it loads
(`rlvr.models.lora.apply_lora`) and TRL's trainer is given `peft_config`; without `--eval`,
bench_trl's held-out evaluation after the last step is a no-op.

Model: the directory `rlvr models prepare smollm2-135m-instruct` writes (`--model`; by
default `cache_root(None) / "models" / "smollm2-135m-instruct"`), loaded by both frameworks with
`rlvr.models.tiny.load_model` (float32, the same weights and tokenizer). Task: rlvr's
arithmetic in question style, as `rlvr train --task arithmetic --arithmetic.digits 2
--arithmetic.style question --arithmetic.held-out-size 100 --few-shot 2` builds it: each
prompt ("What is 83+48?") in the model's chat template after 2 few-shot user/assistant turns
(`rlvr.models.chat.format_rows`, 107 tokens), the same plain-text prompts for both. TRL
tokenizes a plain-string prompt as it is (`processing_class(text=prompts)`: no second template)
and rlvr tokenizes it with the tokenizer's special tokens; SmolLM2's tokenizer adds none (no
BOS; the template writes `<|im_start|>` itself), so both feed identical token ids. Reward: the
task's strict verifier (`task.reward_fn`, TRL's signature, the `answer` column).

Settings, the same on both sides: 8 prompts x 4 completions per step, a 64-token completion
budget, temperature 1, AdamW at a constant lr (1e-5 full, 1e-4 LoRA), gradient clip 1, beta = 0,
mu = 1, token-mean loss, group-std-scaled advantages, clip epsilon 0.2. LoRA: rank 16, alpha 32,
no dropout, every linear layer but the output head (rlvr's `LoRAConfig(rank=16, alpha=32)`,
TRL's `peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")`); the adapters' B
matrices start at zero on both sides, so both start from the same policy (A is drawn from each
side's own RNG stream).

TRL's configuration, choice by choice (bench_trl's `child_trl`): `use_cpu`, `bf16=False`,
`gradient_checkpointing=False`, `max_completion_length` = the budget, `learning_rate` set;
`num_generations` = G, one generation and one optimizer step per step, as rlvr;
`lr_scheduler_type="constant"`; `loss_type="dapo"` (rlvr's `aggregation="token-mean"`),
`scale_rewards="group"`, `epsilon=0.2`, `beta=0`, `num_iterations=1`, `weight_decay=0`,
`max_grad_norm=1`, `top_k=0`, `top_p=1`; `shuffle_dataset=False` (rlvr's prompt order). In
TRL's favour: `logging_strategy="no"`, no checkpoints (rlvr writes one at the end, in its last
step's time), its fused AdamW. rlvr runs its defaults: `GRPOConfig` as it comes apart from the
settings above (`checkpoint_every=0`: only the final checkpoint), two CPU workers of one torch
thread each, shared prompt forwards, chunked log-probs.

One change from bench_trl, for memory: TRL's forward/backward runs in micro-batches of 8
completions (`per_device_train_batch_size=8`, `gradient_accumulation_steps` = prompts x G / 8;
its generation batch is still the step's prompts x G completions, and `loss_type="dapo"` still
divides by the whole batch's tokens: the same update), as rlvr's update runs in micro-batches
too. bench_trl's single pass over all 32 completions (`--trl-micro-batch 0`) peaked at 15.8 GB
(full fine-tuning) and over 17 GB (LoRA, then killed by the OOM killer) on this 24 GB machine
shared with other jobs; in micro-batches of 8, TRL's full fine-tuning peaks at about 7 GB.

Rounds: the children take turns, steps/rounds steps at a time, the other one blocked on a pipe;
each round starts with the framework that went second in the previous one, so load from other
jobs falls on both alike. Every process gets OMP_WAIT_POLICY=PASSIVE.

Reported per mode and framework: median seconds per step, completion tokens per second end to
end and in generation alone (medians over steps), peak RSS of the process (and its RSS after
imports), mean completion length and training reward; then rlvr/TRL: the throughput ratio
(completion tokens/s) and the memory ratio (peak RSS). With `--eval`, also held-out accuracy
after the last step, greedy and sampled, by rlvr's `held_out_accuracy`.

Time: on 2 shared cores a full fine-tuning step takes TRL about 140 s and rlvr about 25 s, so
the default is 2 steps per framework and mode (about 11 minutes in all). A median of 2 is their
mean: the first step of each process (one-time warm-up) and rlvr's last (its checkpoint) are in
it. `--steps 6 --rounds 3` gives medians that leave both out, in about half an hour.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import _common as common
import bench_trl

MODEL = "smollm2-135m-instruct"
MODES = {"full": 1e-5, "lora": 1e-4}  # mode -> learning rate
LORA_RANK, LORA_ALPHA = 16, 32
AIM = {"throughput": 1.5, "memory": 0.7}  # the aim for rlvr / TRL at 135M


def default_model_dir() -> Path:
    """Where `rlvr models prepare smollm2-135m-instruct` puts the checkpoint."""
    from rlvr.pipelines.base_model import prepared_model_dir

    return prepared_model_dir(MODEL)


# --------------------------------------------------------------------------------------------
# children: bench_trl's, with the real model, task and mode in place of the lab's
# --------------------------------------------------------------------------------------------


def real_task(spec: dict):
    """rlvr's 2-digit arithmetic in question style, its rows' prompts in the model's chat
    template after `few_shot` example turns, as rlvr's CLI builds them (train and held out)."""
    from transformers import AutoTokenizer

    from rlvr.models.chat import format_rows
    from rlvr.pipelines.common import few_shot_examples
    from rlvr.tasks.arithmetic import ArithmeticTaskConfig, task_spec

    tokenizer = AutoTokenizer.from_pretrained(spec["base_dir"], local_files_only=True)
    task = task_spec(ArithmeticTaskConfig(digits=2, style="question", held_out_size=100))
    template = (True, None, few_shot_examples(task, spec["few_shot"]))
    return dataclasses.replace(
        task,
        train_rows=lambda seed: format_rows(tokenizer, task.train_rows(seed), *template),
        held_out_rows=lambda: format_rows(tokenizer, task.held_out_rows(), *template),
    )


def trl_lora_config():
    """TRL's side of the LoRA mode: what `rlvr.models.lora.apply_lora` builds for
    `LoRAConfig(rank=16, alpha=32)` (every linear layer but the output head, no dropout)."""
    import peft

    return peft.LoraConfig(
        r=LORA_RANK,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def child(framework: str, spec: dict) -> None:
    """bench_trl's child for `framework`, reading the real task from the lab's task slot; in
    LoRA mode training adapters; TRL's update in micro-batches when `trl_micro_batch` is set."""
    task = real_task(spec)
    common.lab_setup = lambda digits: (None, task)  # bench_trl's children take their task here
    if not spec["eval"]:
        bench_trl._evaluate = lambda model, tokenizer, spec, task: {}
    if framework == "rlvr" and spec["mode"] == "lora":
        import rlvr.models.tiny
        from rlvr.models.lora import LoRAConfig, apply_lora

        load = rlvr.models.tiny.load_model

        def load_with_adapters(directory):  # child_rlvr's load_model, adapters added
            model, tokenizer = load(directory)
            config = LoRAConfig(rank=LORA_RANK, alpha=LORA_ALPHA)
            return apply_lora(model, config, seed=spec["seed"]), tokenizer

        rlvr.models.tiny.load_model = load_with_adapters
    if framework == "trl":
        import trl  # child_trl imports GRPOConfig and GRPOTrainer from here when it runs

        if spec["mode"] == "lora":
            trl.GRPOTrainer = functools.partial(trl.GRPOTrainer, peft_config=trl_lora_config())
        if spec["trl_micro_batch"]:
            completions = spec["prompts"] * spec["group"]
            micro = spec["trl_micro_batch"]
            trl.GRPOConfig = _with_micro_batches(trl.GRPOConfig, micro, completions)
    (bench_trl.child_rlvr if framework == "rlvr" else bench_trl.child_trl)(spec)


def _with_micro_batches(config_class, micro_batch: int, completions: int):
    """TRL's config class, its update split into `micro_batch`-completion forward/backward
    passes with gradients accumulated: `per_device_train_batch_size` = micro_batch,
    `gradient_accumulation_steps` = completions / micro_batch, so one generation batch of
    `completions` (TRL's default `steps_per_generation` is the accumulation) and one optimizer
    step still make a step, and `loss_type="dapo"` still divides by the whole batch's tokens."""

    def build(**kwargs):
        kwargs["per_device_train_batch_size"] = micro_batch
        kwargs["gradient_accumulation_steps"] = completions // micro_batch
        return config_class(**kwargs)

    return build


# --------------------------------------------------------------------------------------------
# parent: one mode at a time, the two children alternating
# --------------------------------------------------------------------------------------------


def start_child(framework: str, spec: dict) -> bench_trl.Child:
    """bench_trl's `Child`, which runs `python <bench_trl's __file__> --child ...`, started from
    this file instead, so that the child runs `child` above."""
    with mock.patch.object(bench_trl, "__file__", __file__):
        return bench_trl.Child(framework, spec)


def run_mode(mode: str, args) -> dict:
    steps, rounds = args.steps, min(args.rounds, args.steps)
    schedule = [steps // rounds + (i < steps % rounds) for i in range(rounds)]
    spec = {
        "mode": mode,
        "digits": 2,
        "base_dir": str(args.model),
        "few_shot": 2,
        "steps": steps,
        "schedule": schedule,
        "prompts": args.prompts,
        "group": 4,
        "budget": args.budget,
        "lr": MODES[mode],
        "seed": args.seed,
        "eval": args.eval,
        "held_out": args.held_out,
        "eval_samples": args.eval_samples,
        "eval_base": False,
        "trl_generation_threads": 0,
        "trl_micro_batch": args.trl_micro_batch,
        "reward": "strict",
    }
    common.say(f"[bench] {mode}: {args.model}, schedule {schedule}")
    children = {k: start_child(k, spec) for k in ("rlvr", "trl")}
    steps_of = {k: [] for k in children}
    try:
        ready = {k: c.receive() for k, c in children.items()}
        matmul, keys = [], list(children)
        for i in range(rounds):
            matmul.append(common.matmul_gflops())
            for k in keys[i % 2 :] + keys[: i % 2]:  # who goes first alternates
                children[k].send("go")
                msg = children[k].receive()
                steps_of[k].extend(msg["steps"])
                brief = bench_trl._brief(msg["steps"])
                common.say(f"[bench] {mode} round {i + 1}/{rounds} {k}: {brief}")
        matmul.append(common.matmul_gflops())
        finals = {}
        for k, c in children.items():
            c.send("finish")
            finals[k] = c.receive()
            c.proc.wait()
    except RuntimeError:
        for k, c in children.items():
            if c.proc.poll() == -9:  # SIGKILL: on this machine, the kernel's OOM killer
                raise SystemExit(
                    f"[bench] {mode}: the {k} child was killed (SIGKILL, out of memory?) after "
                    f"{len(steps_of[k])} steps; TRL needs less with a smaller --trl-micro-batch"
                ) from None
        raise
    return {
        "mode": mode,
        "spec": spec,
        "shape": ready["rlvr"]["shape"],
        "trl_optim": ready["trl"]["optim"],
        "matmul_gflops": matmul,
        "frameworks": {
            k: {
                "steps": steps_of[k],
                **finals[k],
                **bench_trl._summary(steps_of[k]),
                "imports_rss_mb": ready[k]["imports_rss_mb"],
            }
            for k in children
        },
    }


def print_table(results: list[dict], evaluated: bool) -> None:
    header = [
        "mode",
        "framework",
        "s/step (median)",
        "completion tok/s",
        "generation tok/s",
        "peak RSS MB (after imports)",
        "tokens/completion",
        "train reward",
        *(["greedy acc", "sampled acc"] if evaluated else []),
    ]
    rows = []
    for res in results:
        fws, mode = res["frameworks"], res["mode"]
        for k, f in fws.items():
            rows.append(
                [
                    f"{mode} (lr {res['spec']['lr']:g})",
                    _framework(k, res["spec"]),
                    f"{f['median_step_s']:.2f}",
                    f"{f['tokens_per_s']:,.0f}",
                    f"{f['generate_tokens_per_s']:,.0f}",
                    f"{f['peak_rss_mb']:,.0f} ({f['imports_rss_mb']:,.0f})",
                    f"{f['mean_completion_tokens'] / f['completions_per_step']:.1f}",
                    f"{f['mean_train_reward']:.2f}",
                    *(_accuracy(f["final"]) if evaluated else []),
                ]
            )
        r, t = fws["rlvr"], fws["trl"]
        rows.append(
            [
                mode,
                "**rlvr / TRL**",
                f"{r['median_step_s'] / t['median_step_s']:.2f}",
                f"**{r['tokens_per_s'] / t['tokens_per_s']:.2f}**",
                f"{r['generate_tokens_per_s'] / t['generate_tokens_per_s']:.2f}",
                f"**{r['peak_rss_mb'] / t['peak_rss_mb']:.2f}**",
                "",
                "",
                *(
                    [f"{r['final'][x] - t['final'][x]:+.3f}" for x in ("greedy_acc", "sampled_acc")]
                    if evaluated
                    else []
                ),
            ]
        )
    print(common.markdown_table(header, rows))
    print()
    for res in results:
        r, t = res["frameworks"]["rlvr"], res["frameworks"]["trl"]
        speed = r["tokens_per_s"] / t["tokens_per_s"]
        memory = r["peak_rss_mb"] / t["peak_rss_mb"]
        print(
            f"- {res['mode']}: throughput {speed:.2f}x TRL's (aim >= {AIM['throughput']}x: "
            f"{'met' if speed >= AIM['throughput'] else 'not met'}), peak memory {memory:.2f}x "
            f"(aim <= {AIM['memory']}x: {'met' if memory <= AIM['memory'] else 'not met'}); "
            f"matmul rate {common.median(res['matmul_gflops']):.0f} GFLOP/s (2048², 2 threads)"
        )


def _framework(key: str, spec: dict) -> str:
    name = bench_trl.display_name(key)
    micro, completions = spec["trl_micro_batch"], spec["prompts"] * spec["group"]
    if key == "trl" and micro and micro < completions:
        name += f" ({completions // micro} x {micro}-completion micro-batches)"
    return name


def _accuracy(final: dict) -> list[str]:
    return [f"{final['greedy_acc']:.3f}", f"{final['sampled_acc']:.3f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help=f"default: {default_model_dir()}")
    parser.add_argument("--mode", choices=[*MODES, "both"], default="both")
    parser.add_argument("--steps", type=int, default=2, help="steps per framework per mode")
    parser.add_argument("--rounds", type=int, default=2, help="alternations per mode")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (x 4)")
    parser.add_argument("--budget", type=int, default=64, help="completion budget (tokens)")
    parser.add_argument("--seed", type=int, default=0, help="seeds sampling and the prompts")
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        default=8,
        metavar="N",
        help="completions per TRL forward/backward pass: per_device_train_batch_size N, "
        "gradients accumulated over prompts x 4 / N, still one generation and one optimizer "
        "step a step (0: all in one pass, bench_trl's setting: full fine-tuning then peaks at "
        "about 16 GB, LoRA over 17)",
    )
    parser.add_argument("--eval", action="store_true", help="held-out accuracy after the run")
    parser.add_argument("--held-out", type=int, default=50, help="held-out problems (--eval)")
    parser.add_argument("--eval-samples", type=int, default=1, help="samples per problem (--eval)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 steps, 2 prompts")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]))
        return
    args.model = args.model or default_model_dir()
    if not (args.model / "config.json").exists():
        raise SystemExit(
            f"no model at {args.model}: run `rlvr models prepare {MODEL}` (or pass --model DIR)"
        )
    if args.quick:
        args.steps, args.rounds, args.prompts, args.budget, args.held_out = 2, 2, 2, 16, 8
    completions = args.prompts * 4
    if args.trl_micro_batch and (completions % args.trl_micro_batch or args.trl_micro_batch < 0):
        raise SystemExit(f"--trl-micro-batch must divide the {completions} completions of a step")
    modes = list(MODES) if args.mode == "both" else [args.mode]
    start = time.perf_counter()
    # the children's temporary files (rlvr's run directory and checkpoint, TRL's output
    # directory) go to a scratch directory removed at the end; the parent's stay where they are
    tempfile.gettempdir()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-real-") as scratch:
            with mock.patch.dict(os.environ, TMPDIR=scratch):
                for m in modes:
                    results.append(run_mode(m, args))
    finally:  # a mode whose child failed still leaves the modes before it
        if results:
            print_table(results, args.eval)
        common.say(f"[bench] {time.perf_counter() - start:.0f} s in all")
        if args.out and results:
            args.out.write_text(json.dumps(results, indent=1, default=bench_trl._json_default))


if __name__ == "__main__":
    sys.exit(main())
