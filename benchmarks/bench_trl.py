"""rlvr against TRL's GRPOTrainer: one model, one task, one configuration, alternating.

    pip install -e ".[bench]"                       # trl==1.16.0 (the library never imports it)
    python benchmarks/bench_trl.py                  # both settings, 20 steps each, 10 rounds
    python benchmarks/bench_trl.py --setting lab --steps 40 --rounds 8 --out bench.json
    python benchmarks/bench_trl.py --quick          # smoke test, under a minute
    python benchmarks/bench_trl.py --trl-generation-threads 0 1   # also TRL sampling on 1 thread

Settings: `lab` is the lab's task (3-digit addition, worked solutions of about 37 tokens);
`long` is the same task with 12-digit operands (worked solutions of about 125 tokens). Each
starts from the lab's base model for that task, built by the lab's own function and cached
(`rlvr.pipelines.lab.build_base_model`; the 12-digit one takes about 7 minutes the first time).
The 12-digit base writes well-formed ~126-token solutions but solves nothing (held-out accuracy
0): under the strict reward every group would have zero variance and rlvr, which leaves
zero-advantage rows out of the update, would skip it entirely. So `long` trains both
frameworks on a partial-credit reward (`_common.digit_credit_reward`: the share of the
answer's digits in the right place), whose groups do differ: both do a real update. It measures
throughput, not learning. `--quick` uses a randomly initialised model where a base is not
cached yet.

Both frameworks train the same weights with the same tokenizer (the base directory's, loaded by
`rlvr.models.tiny.load_model`), on the same prompt sequence, with the lab's strict math
reward (`task.reward_fn`, TRL's signature; digit credit in `long`): 16 prompts x 8 completions
per step, the task's completion budget, temperature 1, AdamW at a constant lr (1e-4), gradient
clip 1, beta = 0, mu = 1, token-mean loss, group-std-scaled advantages, clip epsilon 0.2.

TRL's configuration, choice by choice: `use_cpu`, `bf16=False`, `gradient_checkpointing=False`,
`max_completion_length` = the budget, `learning_rate` set (its GPU defaults are bf16, gradient
checkpointing, a 512-token budget and lr 1e-6); `per_device_train_batch_size=128` (it counts
completions) with `num_generations=8` and no accumulation: one generation and one optimizer step
per step, as rlvr; `lr_scheduler_type="constant"` (its default decays linearly to 0; rlvr's lr
is constant); `loss_type="dapo"` (its default: the token-mean over the batch, as rlvr's
`aggregation="token-mean"`), `scale_rewards="group"`, `epsilon=0.2`, `beta=0`,
`num_iterations=1`, `weight_decay=0`, `max_grad_norm=1`, `top_k=0`, `top_p=1`;
`shuffle_dataset=False` so it sees rlvr's prompt order. In TRL's favour: `logging_strategy="no"`
(its default logs every 10 steps), no checkpoints (rlvr writes one at the end, its default, and
logs metrics, samples and the hacking monitor every step), and its own default optimizer, the
fused AdamW (rlvr uses `torch.optim.AdamW` as it comes). TRL also computes token entropies in
its loss pass, as it always does. Its step time is the wall time between the ends of
consecutive optimizer steps (data loading, generation, rewards, loss, backward, optimizer);
rlvr's is the wall time between the starts of consecutive steps of `train_grpo` (the same, plus
its logging).

Each framework runs in its own child process (its own peak memory), and they take turns: round
1 runs rlvr for steps/rounds steps while TRL's process waits (blocked on a pipe, no CPU), then
TRL for as many; round 2 starts with TRL, and so on; so load from other jobs on the machine
falls on both alike. The parent measures the machine's large-matmul rate (2048^2 fp32, 2
threads) between rounds.

Threads, each framework's own default on this machine: rlvr runs two worker threads (one per
core, one torch thread each) that split the prompts while sampling and the micro-batches of
the update (`GRPOConfig.cpu_workers`); TRL runs on torch's default, 2 threads (one per core).
`--trl-generation-threads 0 1` adds a third run, TRL sampling on 1 thread, to separate that
choice from the rest. Every process gets
OMP_WAIT_POLICY=PASSIVE (rlvr's CLI sets it; TRL gets it too: with OpenMP's default busy-wait
and other jobs on the CPU, a 2-thread greedy evaluation here took 52 s instead of 4.7 s).

Reported per framework: median seconds per step; completion tokens per second end to end and
in generation alone (median over steps of tokens / seconds; TRL's generation is timed around
its `model.generate` call, rlvr's is its `time/generate_s`); peak RSS; held-out accuracy after
the last step, greedy and sampled (T = 1), measured for both by rlvr's `held_out_accuracy` on the
task's held-out problems; and rlvr/TRL ratios. Also the arithmetic rate rlvr's update and each
framework's generation reach, as a fraction of the measured matmul rate (FLOP conventions in
`benchmarks/_common.py`); the update's twice: the arithmetic it does (each group's prompt
once, as rlvr runs it) and model FLOPs (every row's prompt, as MFU figures count), padding in
neither.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as common
from memory import current_rss_mb

MARK = "@@bench "
SETTINGS = {"lab": 3, "long": 12}  # setting -> operand digits
LONG_BASE_NOTE = "lab base trained by build_base_model on 12-digit problems"


# --------------------------------------------------------------------------------------------
# children: one framework each; they run `schedule[i]` steps when the parent writes "go"
# --------------------------------------------------------------------------------------------


def _send(payload: dict) -> None:
    sys.stdout.write(MARK + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _wait(expected: str) -> None:
    line = sys.stdin.readline().strip()
    if line != expected:
        raise SystemExit(f"child expected {expected!r} from the parent, got {line!r}")


def _round_ends(schedule: list[int]) -> set[int]:
    return set(itertools.accumulate(schedule))


def _evaluate(model, tokenizer, spec: dict, task) -> dict[str, float]:
    import torch

    from rlvr.train.evaluate import held_out_accuracy

    torch.set_num_threads(2)
    rows = task.held_out_rows()[: spec["held_out"]]
    budget = spec["budget"]
    return {
        "greedy_acc": held_out_accuracy(model, tokenizer, rows, task.score, budget),
        "sampled_acc": held_out_accuracy(
            model,
            tokenizer,
            rows,
            task.score,
            budget,
            temperature=1.0,
            num_samples=spec["eval_samples"],
            seed=1,
        ),
    }


def child_rlvr(spec: dict) -> None:
    """rlvr's `train_grpo`, paused between rounds by the row stream it reads from."""
    import torch

    from rlvr.models.tiny import load_model
    from rlvr.report.run_dir import RunDirectory, read_jsonl
    from rlvr.train.config import GRPOConfig
    from rlvr.train.grpo import train_grpo

    torch.set_num_threads(2)  # the lab's `threads`: the update's thread count
    _, task = common.lab_setup(spec["digits"])
    imports_mb = current_rss_mb()
    model, tokenizer = load_model(spec["base_dir"])
    base_eval = _evaluate(model, tokenizer, spec, task) if spec["eval_base"] else {}
    config = GRPOConfig(
        steps=spec["steps"],
        prompts_per_step=spec["prompts"],
        group_size=spec["group"],
        max_new_tokens=spec["budget"],
        temperature=1.0,
        lr=spec["lr"],
        beta=0.0,
        mu=1,
        checkpoint_every=0,  # only the final checkpoint, as a short run writes
    )
    ends = _round_ends(spec["schedule"])
    starts: list[float] = []  # wall-clock start of each step (when it asks for its rows)
    run = RunDirectory(tempfile.mkdtemp(prefix="rlvr-bench-"), "rlvr")

    def report(upto: int, end: float) -> None:
        """Send steps (previous round end, upto]; step s ends when step s+1 starts."""
        records = [r for r in read_jsonl(run.metrics_path) if "time/step_s" in r]
        first = max([e for e in ends if e < upto], default=0) + 1
        steps = []
        for s in range(first, upto + 1):
            stop = starts[s] if s < upto else end
            steps.append(_rlvr_step(records[s - 1], stop - starts[s - 1], spec))
        _send({"round_end": upto, "steps": steps, "threads_update": torch.get_num_threads()})

    def rows():
        stream = task.train_rows(spec["seed"] + 10_000)  # the lab's training stream
        done = 0
        while True:
            if done in ends:
                report(done, time.perf_counter())
            if done == 0 or done in ends:
                _wait("go")
            starts.append(time.perf_counter())
            done += 1
            for _ in range(spec["prompts"]):
                yield next(stream)

    _send(
        {
            "ready": True,
            "base_eval": base_eval,
            "shape": common.model_shape(model),
            "imports_rss_mb": imports_mb,
        }
    )
    train_grpo(
        model,
        tokenizer,
        rows(),
        [common.reward_fn(spec, task)],
        config,
        run,
        evaluate=lambda m: {},  # held-out accuracy is measured once, after the last step
        seed=spec["seed"],
        progress=False,
        strict_reward_fn=task.reward_fn,
    )
    end = time.perf_counter()
    peak = common.peak_rss_mb()
    report(spec["steps"], end)
    _wait("finish")
    _send({"final": _evaluate(model, tokenizer, spec, task), "peak_rss_mb": peak})


def _rlvr_step(record: dict, wall: float, spec: dict) -> dict:
    n = spec["prompts"] * spec["group"]
    return {
        "wall_s": wall,
        "completions": n,
        "generate_s": record["time/generate_s"],
        "update_s": record["time/update_s"],
        "completion_tokens": record["completion/len_mean"] * n,
        "completion_width": record["completion/len_max"],
        "reward": record["reward/mean"],
        "rows_updated_frac": 1.0 - record.get("update/rows_skipped_frac", 0.0),
    }


def child_trl(spec: dict) -> None:
    """TRL's GRPOTrainer, paused between rounds by a callback at the end of a step."""
    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    from rlvr.models.tiny import load_model

    _, task = common.lab_setup(spec["digits"])
    imports_mb = current_rss_mb()
    model, tokenizer = load_model(spec["base_dir"])  # the same weights and tokenizer object
    stream = task.train_rows(spec["seed"] + 10_000)  # rlvr's prompt sequence, in order
    rows = list(itertools.islice(stream, spec["steps"] * spec["prompts"]))
    dataset = datasets.Dataset.from_list(rows)
    generate_s = [0.0]
    threads_seen = set()
    tokens = [0.0, 0.0]  # completion tokens, reward sum of the current step

    original_generate = model.generate

    def timed_generate(*args, **kwargs):
        threads = torch.get_num_threads()
        if spec["trl_generation_threads"]:  # not TRL's default: --trl-generation-threads
            torch.set_num_threads(spec["trl_generation_threads"])
        threads_seen.add(torch.get_num_threads())
        t0 = time.perf_counter()
        out = original_generate(*args, **kwargs)
        generate_s[0] += time.perf_counter() - t0
        torch.set_num_threads(threads)
        return out

    model.generate = timed_generate

    def strict_math(prompts, completions, completion_ids, **columns):
        rewards = common.reward_fn(spec, task)(prompts, completions, **columns)
        tokens[0] += sum(len(ids) for ids in completion_ids)  # EOS included, as in rlvr
        tokens[1] += sum(rewards)
        return rewards

    ends = _round_ends(spec["schedule"])
    steps: list[dict] = []

    class Pace(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            _wait("go")
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            n = spec["prompts"] * spec["group"]
            steps.append(
                {
                    "wall_s": now - self.t,
                    "completions": n,
                    "generate_s": generate_s[0],
                    "completion_tokens": tokens[0],
                    "reward": tokens[1] / n,
                }
            )
            generate_s[0], tokens[0], tokens[1] = 0.0, 0.0, 0.0
            if state.global_step in ends and state.global_step < spec["steps"]:
                _report(state.global_step)
                _wait("go")
            self.t = time.perf_counter()

    def _report(upto: int) -> None:
        first = max([e for e in ends if e < upto], default=0)
        _send({"round_end": upto, "steps": steps[first:upto], "threads": sorted(threads_seen)})

    args = TRLConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        # the CPU settings TRL's GPU defaults need (bf16, gradient checkpointing, lr 1e-6 and a
        # 512-token budget are its defaults)
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        # the same update as rlvr's
        per_device_train_batch_size=spec["prompts"] * spec["group"],  # completions, not prompts
        gradient_accumulation_steps=1,
        num_generations=spec["group"],
        max_completion_length=spec["budget"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        epsilon=0.2,
        loss_type="dapo",  # token-mean over the batch: rlvr's `aggregation="token-mean"`
        scale_rewards="group",
        max_steps=spec["steps"],
        seed=spec["seed"],
        shuffle_dataset=False,  # the prompts in rlvr's order
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[strict_math],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Pace()],
    )
    _send({"ready": True, "optim": str(args.optim), "imports_rss_mb": imports_mb})
    trainer.train()
    peak = common.peak_rss_mb()
    _report(spec["steps"])
    _wait("finish")
    _send({"final": _evaluate(trainer.model, tokenizer, spec, task), "peak_rss_mb": peak})


# --------------------------------------------------------------------------------------------
# parent: start both children, alternate rounds, summarise
# --------------------------------------------------------------------------------------------


class Child:
    def __init__(self, framework: str, spec: dict):
        self.framework = framework
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench-{framework}-", suffix=".log")
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", framework, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )

    def receive(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        self.log.seek(0)
        tail = self.log.read()[-4000:]
        raise RuntimeError(f"{self.framework} child exited ({self.proc.wait()}):\n{tail}")

    def send(self, word: str) -> None:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()


def trl_label(threads: int) -> str:
    """The child's name: TRL as it comes (0: torch's thread count) or with N threads in
    `generate`."""
    return "trl" if threads == 0 else f"trl-gen{threads}"


def display_name(key: str) -> str:
    if key == "rlvr":
        return "rlvr"
    return "TRL 1.16" + ("" if key == "trl" else f", {key[7:]}-thread generate")


def run_setting(name: str, args) -> dict:
    digits = SETTINGS[name]
    config, task = common.lab_setup(digits)
    random_init = args.quick and not common.base_is_cached(config)
    if not random_init and not common.base_is_cached(config):
        common.say(f"[bench] {name}: building the lab's {digits}-digit base model (cached after)")
    base_dir, base_how = common.base_model_dir(config, task, random_init=random_init)
    steps, rounds = args.steps, min(args.rounds, args.steps)
    schedule = [steps // rounds + (i < steps % rounds) for i in range(rounds)]
    spec = {
        "digits": digits,
        "base_dir": str(base_dir),
        "steps": steps,
        "schedule": schedule,
        "prompts": args.prompts,
        "group": 8,
        "budget": task.max_new_tokens,
        "lr": args.lr,
        "seed": args.seed,
        "held_out": args.held_out,
        "eval_samples": args.eval_samples,
        "eval_base": False,
        "trl_generation_threads": 0,
        "reward": "digits" if name == "long" else "strict",
    }
    common.say(f"[bench] {name}: {task.describe}, base {base_how}, schedule {schedule}")
    children = {"rlvr": Child("rlvr", {**spec, "eval_base": True})}
    for threads in args.trl_generation_threads:
        spec_trl = {**spec, "trl_generation_threads": threads}
        children[trl_label(threads)] = Child("trl", spec_trl)
    ready = {k: c.receive() for k, c in children.items()}
    matmul, steps_of = [], {k: [] for k in children}
    info = {k: {} for k in children}
    keys = list(children)
    for i in range(rounds):
        matmul.append(common.matmul_gflops())
        # each round starts with the next framework: everyone goes first equally often
        for k in keys[i % len(keys) :] + keys[: i % len(keys)]:
            children[k].send("go")
            msg = children[k].receive()
            steps_of[k].extend(msg["steps"])
            info[k].update({x: msg[x] for x in ("threads", "threads_update") if x in msg})
            common.say(f"[bench] {name} round {i + 1}/{rounds} {k}: {_brief(msg['steps'])}")
    matmul.append(common.matmul_gflops())
    finals = {}
    for k, c in children.items():
        c.send("finish")
        finals[k] = c.receive()
        c.proc.wait()
    shape = ready["rlvr"]["shape"]
    prompt_len = len(task.held_out_rows()[0]["prompt"])  # fixed-width problems, one char each
    result = {
        "setting": name,
        "task": task.describe,
        "base": base_how,
        "base_dir": str(base_dir),
        "spec": spec,
        "shape": shape,
        "prompt_tokens": prompt_len,
        "matmul_gflops": matmul,
        "base_eval": ready["rlvr"]["base_eval"],
        "trl_optim": ready[keys[1]]["optim"],
        "threads": info,
        "frameworks": {
            k: {
                "steps": steps_of[k],
                **finals[k],
                **_summary(steps_of[k]),
                "imports_rss_mb": ready[k]["imports_rss_mb"],
            }
            for k in children
        },
    }
    result["rates"] = _rates(result)
    return result


def _brief(steps: list[dict]) -> str:
    s = common.median(x["wall_s"] for x in steps)
    r = sum(x["reward"] for x in steps) / len(steps)
    return f"{len(steps)} steps, median {s:.2f} s/step, reward {r:.2f}"


def _summary(steps: list[dict]) -> dict:
    # the first step of each process carries one-time warm-up; medians keep it out
    return {
        "median_step_s": common.median(x["wall_s"] for x in steps),
        "median_generate_s": common.median(x["generate_s"] for x in steps),
        "tokens_per_s": common.median(x["completion_tokens"] / x["wall_s"] for x in steps),
        "generate_tokens_per_s": common.median(
            x["completion_tokens"] / x["generate_s"] for x in steps
        ),
        "mean_completion_tokens": sum(x["completion_tokens"] for x in steps) / len(steps),
        "completions_per_step": steps[0]["completions"],
        "mean_train_reward": sum(x["reward"] for x in steps) / len(steps),
    }


def _rates(result: dict) -> dict:
    """Achieved GFLOP/s of rlvr's update and of each framework's generation, and their
    fractions of the median matmul rate."""
    shape, spec, p = result["shape"], result["spec"], result["prompt_tokens"]
    n = spec["prompts"] * spec["group"]
    ceiling = common.median(result["matmul_gflops"])
    out = {"matmul_gflops": ceiling}
    rl = result["frameworks"]["rlvr"]["steps"]
    # two counts of the update's arithmetic, over the rows it updated on (zero-advantage rows
    # get no forward or backward) at their mean completion length, padding never counted:
    # `rlvr_update` counts each group's prompt once, as rlvr runs it (the arithmetic done);
    # `rlvr_update_model` counts every row's prompt, as model-FLOPs (MFU) figures do
    for key, per_row in (("rlvr_update", p / spec["group"]), ("rlvr_update_model", p)):
        out[f"{key}_gflops"] = (
            common.median(
                common.update_flops(
                    shape,
                    n * s["rows_updated_frac"],
                    per_row + s["completion_tokens"] / s["completions"],
                )
                / s["update_s"]
                for s in rl
                if s["rows_updated_frac"] > 0
            )
            / 1e9
        )
    for k, fw in result["frameworks"].items():
        gen = common.median(
            common.generation_flops(shape, n, p, s["completion_tokens"] / n) / s["generate_s"]
            for s in fw["steps"]
        )
        out[f"{k}_generate_gflops"] = gen / 1e9
    for key in list(out):
        if key != "matmul_gflops":
            out[key.replace("gflops", "fraction")] = out[key] / ceiling
    return out


def print_tables(results: list[dict]) -> None:
    header = [
        "setting",
        "framework",
        "s/step (median)",
        "completion tok/s",
        "generation tok/s",
        "generate share",
        "peak RSS MB (after imports)",
        "greedy acc",
        "sampled acc",
        "train reward",
    ]
    rows = []
    for res in results:
        fws = res["frameworks"]
        for k, f in fws.items():
            length = f["mean_completion_tokens"] / f["completions_per_step"]
            rows.append(
                [
                    f"{res['setting']} ({res['task']}, ~{length:.0f} tok)",
                    display_name(k),
                    f"{f['median_step_s']:.2f}",
                    f"{f['tokens_per_s']:,.0f}",
                    f"{f['generate_tokens_per_s']:,.0f}",
                    f"{f['median_generate_s'] / f['median_step_s']:.0%}",
                    f"{f['peak_rss_mb']:.0f} ({f['imports_rss_mb']:.0f})",
                    f"{f['final']['greedy_acc']:.3f}",
                    f"{f['final']['sampled_acc']:.3f}",
                    f"{f['mean_train_reward']:.2f}",
                ]
            )
        r = fws["rlvr"]
        for k, t in fws.items():
            if k == "rlvr":
                continue
            rows.append(
                [
                    res["setting"],
                    f"**rlvr / {display_name(k)}**",
                    f"{r['median_step_s'] / t['median_step_s']:.2f}",
                    f"**{r['tokens_per_s'] / t['tokens_per_s']:.2f}**",
                    f"{r['generate_tokens_per_s'] / t['generate_tokens_per_s']:.2f}",
                    "",
                    f"{r['peak_rss_mb'] / t['peak_rss_mb']:.2f}",
                    f"{r['final']['greedy_acc'] - t['final']['greedy_acc']:+.3f}",
                    f"{r['final']['sampled_acc'] - t['final']['sampled_acc']:+.3f}",
                    "",
                ]
            )
    print(common.markdown_table(header, rows))
    print()
    trl_keys = [k for k in results[0]["frameworks"] if k != "rlvr"]
    header = [
        "setting",
        "params",
        "base greedy / sampled",
        "matmul GFLOP/s (2048², 2 thr)",
        "rlvr update GFLOP/s (arithmetic done)",
        "rlvr update, model FLOPs (MFU count)",
        "rlvr generation GFLOP/s",
        *[f"{display_name(k)} generation GFLOP/s" for k in trl_keys],
    ]
    rows = []
    for res in results:
        q, b = res["rates"], res["base_eval"]
        rows.append(
            [
                res["setting"],
                f"{res['shape']['params']:,}",
                f"{b['greedy_acc']:.3f} / {b['sampled_acc']:.3f}",
                f"{q['matmul_gflops']:.1f}",
                f"{q['rlvr_update_gflops']:.1f} ({q['rlvr_update_fraction']:.0%})",
                f"{q['rlvr_update_model_gflops']:.1f} ({q['rlvr_update_model_fraction']:.0%})",
                *[
                    f"{q[f'{k}_generate_gflops']:.1f} ({q[f'{k}_generate_fraction']:.0%})"
                    for k in ["rlvr", *trl_keys]
                ],
            ]
        )
    print(common.markdown_table(header, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=[*SETTINGS, "both"], default="both")
    parser.add_argument("--steps", type=int, default=20, help="steps per framework per setting")
    parser.add_argument("--rounds", type=int, default=10, help="alternations per setting")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (x 8)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0, help="seeds sampling and the prompts")
    parser.add_argument("--held-out", type=int, default=200, help="held-out problems")
    parser.add_argument("--eval-samples", type=int, default=4, help="samples per problem")
    parser.add_argument(
        "--trl-generation-threads",
        type=int,
        nargs="+",
        default=[0],
        metavar="N",
        help="one TRL run per value: threads in its `generate` (0: torch's default, 2 here, "
        "TRL as it comes; rlvr samples on 1). E.g. `0 1` adds TRL given rlvr's thread policy",
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: 2 steps, 4 prompts")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        framework, spec = args.child
        (child_rlvr if framework == "rlvr" else child_trl)(json.loads(spec))
        return
    if args.quick:
        args.steps, args.rounds, args.prompts, args.held_out, args.eval_samples = 2, 2, 4, 16, 1
    settings = list(SETTINGS) if args.setting == "both" else [args.setting]
    start = time.perf_counter()
    results = [run_setting(s, args) for s in settings]
    print_tables(results)
    common.say(f"[bench] {time.perf_counter() - start:.0f} s in all")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=_json_default))


def _json_default(x):
    return None if isinstance(x, float) and math.isnan(x) else str(x)


if __name__ == "__main__":
    main()
