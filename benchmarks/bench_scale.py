"""What running past one process costs on this machine, per part: the one-step-off overlap, the
per-step overhead of Ray rollout workers and of FSDP2, and weight sync by transport.

    python benchmarks/bench_scale.py                   # every part, 5 rounds (8-11 min here)
    python benchmarks/bench_scale.py --quick           # smoke run (< 2 min)
    python benchmarks/bench_scale.py --skip-135m --no-torchrun --no-vllm
    python benchmarks/bench_scale.py --forwards-only --rounds 3   # the no-grad forwards' split

Steps: on the lab's task (3-digit addition) and base model, 16 prompts x 8 samples at the
task's budget (48 tokens), `build_trainer` + `grpo_step` as `train_grpo` runs them (the real
reward, the lab's lr, `_update_threads` around the loop). Each round builds every mode afresh
from the base (seed = the round) and runs `--steps` steps; the first is dropped (warm-up, and
in one-step-off mode the pipeline filling), the rest are steady-state steps. The modes take
turns within each round, in an order rotated by one every round, so load from the machine's
other jobs falls on all alike. A mode's s/step is the median over all its steady steps; its
ratio to its baseline is the median over rounds of the per-round ratio of medians.

- overlap: sync (`async_steps=0`), sync with the rollout correction (`rollout_correction.mode=tis`:
  the pi_old forward pass alone), one-step-off (`async_steps=1`, tis: sampling in a background
  thread with its own copy of the policy, the update on one thread fewer), one-step-off with
  `rollout_correction.mode=none` (the overlap without the pi_old pass), and sync + tis on one
  thread (sampling and the update each on one core: the halves one-step-off overlaps,
  measured without each other, from which the check table predicts it: max(G1, U1));
- Ray: `RayEngine` (local Ray on 127.0.0.1, actors colocated on the learner's 2 cores, one
  torch thread each, weights through the object store every step) with 2 actors against
  in-process sampling by 2 worker threads (the default), 1 actor against one in-process
  sampling worker, and one-step-off on 1 actor (sampling in another process) against
  one-step-off in a thread;
- FSDP2: torchrun's code path at one rank (a gloo process group of size 1 on 127.0.0.1 and a
  `DistContext` that counts as sharded, so `build_trainer` takes the path `torchrun
  --nproc-per-node 1` would if world size 1 sharded: FSDP2 policy, whole rollout copy synced
  by `full_state_dict` every step, `BroadcastRollout`, the all-reduces) against one process
  with the same switches that path forces (one update worker, a prompt per row); and a real
  `torchrun --nproc-per-node 2` (2 ranks x 1 thread, launched once per round: its start is
  not in the step time) against the same.

Weight sync, at the lab's ~1.2 M parameters and SmolLM2-135M's (`--model-dir`, as `rlvr
models prepare smollm2-135m-instruct` writes it), the transports interleaved per round: a
state-dict copy into an in-process engine's own model (`HFEngine.load_weights`), the
one-step-off sync (snapshot clone + that copy), Ray's object store to 2 actors
(`RayEngine.load_weights`), FSDP2's full-state-dict gather (`full_state_dict`) at 1 rank in
this process and at 2 ranks under torchrun (rank 0's time, both ranks gathering); and vLLM's
reload (`vllm_sync_time.py` run in vLLM's CPU venv, `--vllm-python`, when it exists).

The no-grad forwards (`--forwards-only`, or last in a full run with torchrun): at 2 torchrun
ranks (x 1 thread), the per-rank seconds of each forward part of a step (`time/ref_logprobs_s`,
`time/teacher_logprobs_s`, `time/old_logprobs_s`, and PPO's `time/advantage_s`, which holds the
critic's values) with every rank scoring the whole batch (the layout before the row split,
`RLVR_WHOLE_BATCH_FORWARDS=1`) against each rank scoring its own rows (all-gathered), the two
layouts alternating within one launch; the ratio split / whole per rank (about 1/2 is the
target at 2 ranks).

Markdown tables on stdout (the steps, the one-step-off check, one-off costs such as Ray's and
torchrun's start, weight sync), the load average at the start and the end; progress on
stderr. Results and the cost model built on them: `docs/scaling.md`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _common as common
import torch
import torch.distributed as dist
from ray_overhead import SMOLLM, timed

from rlvr.models.tiny import load_model
from rlvr.report.timer import StepTimer
from rlvr.rollout.engine import HFEngine
from rlvr.rollout.ray_cluster import start_ray
from rlvr.rollout.ray_engine import RayEngine
from rlvr.rollout.weight_transport import listening_socket
from rlvr.train.config import Critic, Distill, Monitor, RolloutCorrection
from rlvr.train.distributed import (
    DistContext,
    barrier,
    destroy,
    full_state_dict,
    init_distributed,
    shard_model,
)
from rlvr.train.grpo import _update_threads, build_trainer, grpo_step
from rlvr.train.strategy import WHOLE_BATCH_FORWARDS_ENV

VLLM_PYTHON = Path.home() / ".cache/rlvr/vllm-venv/bin/python"
HERE = Path(__file__).resolve().parent
ONE_OFF: dict[str, list[float]] = {}  # seconds of what a run pays once, not per step
PARTS = ("generate", "verify", "old_logprobs", "update", "forward", "backward", "optimizer")


class OneRankSharded(DistContext):
    """One rank of a real gloo process group that counts as sharded: `build_trainer` then takes
    torchrun's code path at world size 1 (which `DistContext.sharded` otherwise skips)."""

    @property
    def sharded(self) -> bool:
        return True


ONE_RANK = OneRankSharded(0, 1, 0, torch.device("cpu"), "gloo")


@dataclasses.dataclass
class Mode:
    """One way to run the step: GRPOConfig switches, torch threads, an engine, a DistContext."""

    part: str
    name: str
    baseline: str | None = None  # the mode this one is compared with
    switches: dict = dataclasses.field(default_factory=dict)
    threads: int = 2
    engine: str | None = None  # "inproc1", "ray1", "ray2": see `make_engine`; None: default
    dist: bool = False  # torchrun's path at one rank (ONE_RANK)
    torchrun: int = 0  # ranks of a torchrun launch (0: in this process)


TIS = {"rollout_correction": RolloutCorrection(mode="tis")}
ASYNC = {"async_steps": 1, "rollout_correction": RolloutCorrection(mode="tis")}
ASYNC_NONE = {"async_steps": 1, "rollout_correction": RolloutCorrection(mode="none")}
SHARDED_SWITCHES = {"cpu_workers": 1, "forward": "padded"}


def modes(torchrun: bool) -> list[Mode]:
    out = [
        Mode("overlap", "sync"),
        Mode("overlap", "sync + tis (pi_old pass)", "sync", TIS),
        Mode("overlap", "one-step-off + tis (thread)", "sync + tis (pi_old pass)", ASYNC),
        Mode("overlap", "one-step-off, no correction (thread)", "sync", ASYNC_NONE),
        Mode("overlap", "sync + tis, 1 thread (a half per core)", "sync", TIS, threads=1),
        Mode("ray", "Ray, 2 actors", "sync", engine="ray2"),
        Mode("ray", "in process, 1 sampling worker", engine="inproc1"),
        Mode("ray", "Ray, 1 actor", "in process, 1 sampling worker", engine="ray1"),
        Mode(
            "ray",
            "one-step-off + tis, Ray 1 actor",
            "one-step-off + tis (thread)",
            ASYNC,
            engine="ray1",
        ),
        Mode("fsdp", "one process, the sharded path's switches", "sync", SHARDED_SWITCHES),
        Mode(
            "fsdp",
            "FSDP2, 1 rank (torchrun's path)",
            "one process, the sharded path's switches",
            dist=True,
        ),
    ]
    if torchrun:
        out.append(
            Mode(
                "fsdp",
                "torchrun, 2 ranks x 1 thread",
                "one process, the sharded path's switches",
                torchrun=2,
            ),
        )
    return out


def grpo_config(config, task, prompts: int, switches: dict):
    return dataclasses.replace(
        config.grpo,
        prompts_per_step=prompts,
        max_new_tokens=task.max_new_tokens,
        monitor=Monitor(every=0),
        **switches,
    )


def run_steps(
    model, tokenizer, task, config, grpo, seed, steps, engine=None, ctx=None, every_rank=False
):
    """`steps` steps of a fresh trainer over `model`, as train_grpo's loop runs them; each
    step's `time/*` and `async/*` metrics (rank 0's; [] on the other ranks unless
    `every_rank`)."""
    t = build_trainer(
        model,
        tokenizer,
        task.train_rows(seed),
        [task.reward_fn],
        grpo,
        seed,
        engine=engine,
        dist_ctx=ctx,
    )
    out = []
    try:
        with _update_threads(t.plan):
            for _ in range(steps):
                result = grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())
                out.append({k: v for k, v in result.metrics.items() if k[:5] in ("time/", "async")})
    finally:
        t.rollout.close()  # waits for sampling still running: nothing spills into the next mode
    return out if ctx is None or ctx.is_main or every_rank else []


def one_off(what: str, seconds: float) -> None:
    ONE_OFF.setdefault(what, []).append(seconds)


def ray_engine(model, tokenizer, workers: int, label: str) -> RayEngine:
    """A `RayEngine` of `workers` actors colocated on this machine's cores; its start (actor
    processes, model built in each, first weights) is a one-off cost."""
    start = time.perf_counter()
    engine = RayEngine(model, tokenizer, workers, placement="colocated", timeout_s=900)
    one_off(f"RayEngine start, {workers} actor(s), {label}", time.perf_counter() - start)
    return engine


def make_engine(kind: str, model, tokenizer):
    if kind == "inproc1":
        return HFEngine(model, tokenizer, 1)
    return ray_engine(model, tokenizer, {"ray1": 1, "ray2": 2}[kind], "lab tiny")


def run_mode(mode: Mode, base, tokenizer, task, config, args, seed, ray_engines) -> list[dict]:
    if mode.torchrun:
        return torchrun_steps(mode.torchrun, args, seed)
    grpo = grpo_config(config, task, args.prompts, mode.switches)
    model = copy.deepcopy(base)
    engine = None
    if mode.engine == "inproc1":
        engine = make_engine("inproc1", model, tokenizer)
    elif mode.engine is not None:
        if mode.engine not in ray_engines:
            ray_engines[mode.engine] = make_engine(mode.engine, base, tokenizer)
        engine = ray_engines[mode.engine]
        engine.load_weights(model.state_dict())  # this round's fresh weights, untimed
    previous = torch.get_num_threads()
    torch.set_num_threads(mode.threads)
    try:
        return run_steps(
            model,
            tokenizer,
            task,
            config,
            grpo,
            seed,
            args.steps,
            engine,
            ONE_RANK if mode.dist else None,
        )
    finally:
        torch.set_num_threads(previous)


# --- torchrun ---------------------------------------------------------------------------------


def free_port() -> int:
    with listening_socket("127.0.0.1") as s:
        return s.getsockname()[1]


def torchrun(ranks: int, worker_args: list[str]) -> tuple[dict, float]:
    """This file's `--rank-worker` under `torchrun --nproc-per-node ranks` on 127.0.0.1: rank
    0's JSON result and the launch's wall seconds."""
    with tempfile.TemporaryDirectory(prefix="rlvr-scale-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
        argv += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
        argv += [__file__, "--rank-worker", str(out), *worker_args]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=HERE)
        wall = time.perf_counter() - start
        if done.returncode != 0 or not out.exists():
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            raise SystemExit(f"torchrun --nproc-per-node {ranks} failed (exit {done.returncode})")
        return json.loads(out.read_text()), wall


def torchrun_steps(ranks: int, args, seed: int) -> list[dict]:
    worker = ["--steps", str(args.steps), "--prompts", str(args.prompts), "--seed", str(seed)]
    result, wall = torchrun(ranks, worker)
    steps = result["steps"]
    what = f"torchrun {ranks} ranks: launch, load, build, exit (the launch less its steps)"
    one_off(what, wall - sum(s["time/step_s"] for s in steps))
    return steps


def rank_worker(args) -> None:
    """One torchrun rank: the lab's steps with every rank training (`--steps`), or the
    full-state-dict gather timed (`--gather-model`, one or more model directories)."""
    ctx = init_distributed(torch.device("cpu"), timeout_s=900)
    torch.set_num_threads(max(1, args.threads // ctx.world_size))  # as the lab does
    try:
        result: dict = {"world_size": ctx.world_size}
        if args.forward_split:
            mine = forward_split_steps(ctx, args)
            every = [None] * ctx.world_size
            dist.all_gather_object(every, mine)
            result["forwards"] = {name: [r[name] for r in every] for name in mine}
        elif args.gather_model:
            result["gather"] = {
                str(d): gather_times(Path(d), ctx, args.rounds) for d in args.gather_model
            }
        else:
            config, task = common.lab_setup(3)
            base, tokenizer = load_model(common.base_model_dir(config, task)[0])
            grpo = grpo_config(config, task, args.prompts, {})
            result["steps"] = run_steps(
                base, tokenizer, task, config, grpo, args.seed, args.steps, ctx=ctx
            )
        if ctx.is_main:
            Path(args.rank_worker).write_text(json.dumps(result))
        barrier(ctx, "the end of the benchmark")
    finally:
        destroy()


FORWARD_PARTS = {
    "ref_logprobs": "reference (beta 0.04)",
    "teacher_logprobs": "teacher",
    "old_logprobs": "pi_old (tis)",
    "advantage": "advantage (PPO: the critic's values)",
}
"""The step parts (`time/PART_s`) that are no-grad forwards, or hold one (the advantage part
holds the critic's values forward under PPO), with their table names."""


def forward_configs(config, task, prompts: int, teacher: Path) -> dict[str, object]:
    """The two configs whose steps run every no-grad forward: GRPO with a reference, the
    rollout correction's pi_old and a teacher (the base model itself: the same tokenizer);
    PPO (gae) with tis: the critic's values."""
    return {
        "grpo": grpo_config(
            config,
            task,
            prompts,
            {
                "beta": 0.04,
                "rollout_correction": RolloutCorrection(mode="tis"),
                "distill": Distill(teacher=str(teacher)),
            },
        ),
        "ppo": grpo_config(
            config,
            task,
            prompts,
            {
                "advantage_estimator": "gae",
                "critic": Critic(lr=1e-4),
                "rollout_correction": RolloutCorrection(mode="tis"),
            },
        ),
    }


def forward_split_steps(ctx, args) -> dict[str, dict[str, list[dict]]]:
    """On every rank: `--rounds` rounds of `--steps` steps (the first dropped) of each config
    of `forward_configs`, each with the no-grad forwards on the whole batch on every rank (the
    layout before the row split, `RLVR_WHOLE_BATCH_FORWARDS=1`) and split by rows, the two
    taking turns in an order rotated every round. {config: {"whole" | "split": this rank's
    steady steps' `time/*`}}."""
    config, task = common.lab_setup(3)
    base_dir = common.base_model_dir(config, task)[0]
    base, tokenizer = load_model(base_dir)
    out: dict[str, dict[str, list[dict]]] = {}
    for name, grpo in forward_configs(config, task, args.prompts, base_dir).items():
        out[name] = {"whole": [], "split": []}
        for r in range(args.rounds):
            for layout in ["whole", "split"][r % 2 :] + ["whole", "split"][: r % 2]:
                os.environ[WHOLE_BATCH_FORWARDS_ENV] = "1" if layout == "whole" else "0"
                model = copy.deepcopy(base)
                steps = run_steps(
                    model, tokenizer, task, config, grpo, args.seed + r, args.steps, ctx=ctx,
                    every_rank=True,
                )  # fmt: skip
                out[name][layout] += steps[1:]
    os.environ.pop(WHOLE_BATCH_FORWARDS_ENV, None)
    return out


def forward_split_table(args) -> str:
    """The per-rank seconds of a step's no-grad forwards at 2 ranks under torchrun, whole batch
    on every rank against split by rows, and their ratio (median over the steady steps of each
    layout, per rank)."""
    worker = ["--forward-split", "--steps", str(args.steps), "--rounds", str(args.rounds)]
    worker += ["--prompts", str(args.prompts), "--seed", str(args.seed)]
    result, wall = torchrun(2, worker)
    one_off("torchrun 2 ranks: the no-grad forward split runs (whole launch)", wall)
    rows = []
    for name, by_rank in result["forwards"].items():
        for part, label in FORWARD_PARTS.items():
            key = f"time/{part}_s"
            if key not in by_rank[0]["whole"][0] or (part == "advantage") != (name == "ppo"):
                continue
            cells = []
            for layouts in by_rank:
                whole = common.median(s[key] for s in layouts["whole"])
                split_s = common.median(s[key] for s in layouts["split"])
                cells += [f"{whole:.4f}", f"{split_s:.4f}", f"{split_s / whole:.2f}"]
            rows.append([name, label, *cells, str(len(by_rank[0]["split"]))])
    header = ["config", "forward"]
    for rank in range(2):
        header += [f"rank {rank} whole s", f"rank {rank} split s", f"rank {rank} split / whole"]
    return common.markdown_table(header + ["steps"], rows)


def gather_times(model_dir: Path, ctx, rounds: int) -> list[float]:
    model, _ = load_model(model_dir)
    shard_model(model, ctx)
    times = []
    for _ in range(rounds + 1):  # the first is a warm-up
        barrier(ctx, "a gather")
        times.append(timed(lambda: full_state_dict(model)))
    return times[1:]


# --- weight sync ------------------------------------------------------------------------------


def sync_times(model, tokenizer, rounds: int, label: str) -> dict[str, list[float]]:
    """Seconds of each in-process transport's sync of `model`'s weights, interleaved."""
    state_dict = model.state_dict()
    local = HFEngine(copy.deepcopy(model), tokenizer)
    sharded = shard_model(copy.deepcopy(model), ONE_RANK)
    with ray_engine(model, tokenizer, 2, label) as ray2:
        transports: dict[str, Callable[[], object]] = {
            "in-process copy (HFEngine.load_weights)": lambda: local.load_weights(state_dict),
            "snapshot + copy (the one-step-off sync)": lambda: local.load_weights(
                {k: v.detach().clone() for k, v in state_dict.items()}
            ),
            "Ray object store, 2 actors": lambda: ray2.load_weights(state_dict),
            "FSDP2 full-state-dict gather, 1 rank": lambda: full_state_dict(sharded),
        }
        for fn in transports.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {name: [] for name in transports}
        for _ in range(rounds):
            for name, fn in transports.items():
                times[name].append(timed(fn))
    return times


def vllm_sync(python: Path, names: list[str], syncs: int) -> dict[str, dict]:
    """`vllm_sync_time.py`'s measurement of each model, run in vLLM's venv (its own process)."""
    import vllm_sync_time

    env = os.environ | {"RLVR_CACHE": str(SMOLLM.parent.parent)}
    out = {}
    for name in names:
        common.say(f"[bench] vLLM: {name}")
        argv = [str(python), str(HERE / "vllm_sync_time.py"), "--child", name]
        done = subprocess.run(
            [*argv, "--syncs", str(syncs)], capture_output=True, text=True, env=env
        )
        lines = [x for x in done.stdout.splitlines() if x.startswith(vllm_sync_time.RESULT)]
        if done.returncode == 0 and lines and lines[-1] != vllm_sync_time.RESULT + "null":
            out[name] = json.loads(lines[-1].removeprefix(vllm_sync_time.RESULT))
        else:
            common.say(f"[bench] vLLM {name} failed: {done.stderr[-1500:]}")
    return out


def weight_table(args, tokenizer, base, base_dir: Path) -> str:
    models = [("lab tiny", base, tokenizer, base_dir)]
    if not args.skip_135m:
        if not args.model_dir.is_dir():
            raise SystemExit(
                f"{args.model_dir} is missing: `RLVR_CACHE=/tmp/rlvrcache rlvr models prepare "
                "smollm2-135m-instruct` (offline), or --skip-135m"
            )
        smol, smol_tokenizer = load_model(args.model_dir)
        models.append(("SmolLM2-135M", smol, smol_tokenizer, args.model_dir))
    rows = []
    for label, model, tok, directory in models:
        common.say(f"[bench] weight sync: {label}")
        params = sum(p.numel() for p in model.parameters()) / 1e6
        times = sync_times(model, tok, args.rounds, label)
        if args.torchrun and not args.quick:  # a launch of its own: ~15 s
            worker = ["--gather-model", str(directory), "--rounds", str(args.rounds)]
            gathered = torchrun(2, worker)[0]["gather"][str(directory)]
            times["FSDP2 full-state-dict gather, 2 ranks (torchrun)"] = gathered
        base_s = common.median(times["in-process copy (HFEngine.load_weights)"])
        rows += [sync_row(label, params, name, t, base_s) for name, t in times.items()]
    if args.vllm and args.vllm_python.exists():
        names = ["tiny"] + ([] if args.skip_135m else ["smollm2"])
        for name, r in vllm_sync(args.vllm_python, names, args.rounds).items():
            label = {"tiny": "vLLM's tiny (128 wide)", "smollm2": "SmolLM2-135M"}[name]
            seconds = [ms / 1e3 for ms in r["sync_ms"]]
            one_off(f"vLLM engine start (CPU build), {label}", r["start_s"])
            rows.append(sync_row(label, r["params_m"], "vLLM reload (CPU build)", seconds, None))
    header = ["model", "params", "transport", "median ms", "range ms", "x in-process copy"]
    return common.markdown_table(header, rows)


def sync_row(label, params, name, seconds, base_s) -> list[str]:
    ms = [s * 1e3 for s in seconds]
    ratio = f"{common.median(seconds) / base_s:.1f}x" if base_s else ""
    spread = f"{min(ms):.1f}-{max(ms):.1f}"
    return [label, f"{params:.1f} M", name, f"{common.median(ms):.1f}", spread, ratio]


# --- the step table ---------------------------------------------------------------------------


def split(step: dict) -> dict[str, float]:
    """A step's seconds by part: generate (in one-step-off: the learner's wait), sampling in
    the background, verify, pi_old, update (forward + backward + optimizer), sync + planning
    (the rest of the update span: the weight sync), other."""
    part = {p: step.get(f"time/{p}_s", 0.0) for p in PARTS}
    compute = part["forward"] + part["backward"] + part["optimizer"]
    out = {
        "step": step["time/step_s"],
        "generate": part["generate"],
        "background": step.get("async/generate_s", 0.0) + step.get("async/verify_s", 0.0),
        "verify": part["verify"],
        "old_logprobs": part["old_logprobs"],
        "update": compute,
        "sync": part["update"] - compute,
    }
    spent = out["generate"] + out["verify"] + out["old_logprobs"] + part["update"]
    return out | {"other": out["step"] - spent}


def step_table(mode_list: list[Mode], results: dict[str, list[list[dict]]]) -> str:
    """results[mode][round] = that round's steady steps."""

    def per_round(name):
        return [common.median(split(s)["step"] for s in steps) for steps in results[name]]

    rows = []
    for mode in mode_list:
        steps = [split(s) for r in results[mode.name] for s in r]
        med = {k: common.median(s[k] for s in steps) for k in steps[0]}
        ratio = ""
        if mode.baseline:
            pairs = zip(per_round(mode.name), per_round(mode.baseline))
            ratio = f"{common.median(a / b for a, b in pairs):.2f} ({mode.baseline})"
        cols = ["generate", "background", "verify", "old_logprobs", "update", "sync", "other"]
        rows.append(
            [mode.part, mode.name, f"{med['step']:.3f}", ratio]
            + [f"{med[c]:.3f}" for c in cols]
            + [str(len(steps))]
        )
    header = [
        "part",
        "mode",
        "s/step",
        "x baseline (per-round median)",
        "generate / wait s",
        "sampling in background s",
        "verify s",
        "pi_old s",
        "fwd+bwd+opt s",
        "sync + plan s",
        "other s",
        "steps",
    ]
    return common.markdown_table(header, rows)


def overlap_check(results: dict[str, list[list[dict]]]) -> str:
    """One-step-off predicted from the halves measured one at a time (sync + tis on one thread:
    sampling + verifying G1, the learner's rest U1 of which pi_old O1, each half on one core):
    max(G1, U1) with the correction, max(G1, U1 - O1) without; against the measured modes."""

    def med(name: str, key: str = "step") -> float:
        return common.median(split(s)[key] for r in results[name] for s in r)

    halves = "sync + tis, 1 thread (a half per core)"
    g1 = med(halves, "generate") + med(halves, "verify")
    o1 = med(halves, "old_logprobs")
    u1 = med(halves) - g1
    rows = [
        [
            "halves on one core each: G1 (sample + verify) / U1 (the rest) / O1 (pi_old, in U1)",
            f"{g1:.3f} / {u1:.3f} / {o1:.3f}",
            "",
            "",
            "",
        ]
    ]
    checks = (
        (
            "tis",
            max(g1, u1),
            "sync + tis (pi_old pass)",
            ["one-step-off + tis (thread)", "one-step-off + tis, Ray 1 actor"],
        ),
        ("none", max(g1, u1 - o1), "sync", ["one-step-off, no correction (thread)"]),
    )
    for label, predicted, baseline, measured_modes in checks:
        base = med(baseline)
        formula = "max(G1, U1)" if label == "tis" else "max(G1, U1 - O1)"
        rows.append(
            [
                f"predicted, {label}: {formula}",
                f"{predicted:.3f}",
                baseline,
                f"{base / predicted:.2f}",
                "",
            ]
        )
        for name in measured_modes:
            measured = med(name)
            rows.append(
                [
                    f"measured: {name}",
                    f"{measured:.3f}",
                    baseline,
                    f"{base / measured:.2f}",
                    f"{measured / predicted:.2f}",
                ]
            )
    header = ["", "s/step", "against (2 cores)", "speed-up", "measured / predicted"]
    return common.markdown_table(header, rows)


def one_off_table() -> str:
    rows = [[what, f"{common.median(t):.2f}", str(len(t))] for what, t in ONE_OFF.items()]
    return common.markdown_table(["one-off cost", "median s", "times"], rows)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="per mode and round; 1st dropped")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="cores to use")
    parser.add_argument("--skip-135m", action="store_true")
    parser.add_argument("--model-dir", type=Path, default=SMOLLM)
    parser.add_argument("--no-torchrun", dest="torchrun", action="store_false")
    parser.add_argument("--no-vllm", dest="vllm", action="store_false")
    parser.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds x 3 steps, 4 prompts, the tiny model's sync"
    )
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rank-worker", help=argparse.SUPPRESS)
    parser.add_argument("--gather-model", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--forward-split", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--forwards-only",
        action="store_true",
        help="only the no-grad forwards at 2 torchrun ranks, whole batch against split by rows",
    )
    args = parser.parse_args()
    if args.rank_worker:
        rank_worker(args)
        return
    if args.forwards_only:
        if args.quick:
            args.rounds, args.steps, args.prompts = 2, 3, 4
        start_load, start = load(), time.perf_counter()
        table = forward_split_table(args)
        minutes = (time.perf_counter() - start) / 60
        print(f"load average at the start {start_load}, at the end {load()}; {minutes:.1f} min")
        print(f"{args.rounds} rounds x {args.steps - 1} steady steps per layout and config\n")
        print(table + "\n")
        print(one_off_table())
        return
    if args.quick:
        args.rounds, args.steps, args.prompts = 2, 3, 4
        args.skip_135m, args.vllm = True, False
    start_load, start = load(), time.perf_counter()
    torch.set_num_threads(args.threads)
    config, task = common.lab_setup(3)
    base_dir, how = common.base_model_dir(config, task)
    base, tokenizer = load_model(base_dir)
    mode_list = modes(args.torchrun)
    results: dict[str, list[list[dict]]] = {m.name: [] for m in mode_list}
    ray_engines: dict[str, RayEngine] = {}
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=900),
    )
    import ray

    with tempfile.TemporaryDirectory(prefix="rlvr-ray-", dir="/tmp") as ray_dir:
        try:
            began = time.perf_counter()
            start_ray(None, num_cpus=args.threads, temp_dir=ray_dir)
            one_off("local Ray start (127.0.0.1)", time.perf_counter() - began)
            for r in range(args.rounds):
                shift = r % len(mode_list)
                for mode in itertools.chain(mode_list[shift:], mode_list[:shift]):
                    steps = run_mode(mode, base, tokenizer, task, config, args, r, ray_engines)
                    results[mode.name].append(steps[1:])
                common.say(f"[bench] round {r + 1}/{args.rounds} ({load()})")
            for engine in ray_engines.values():
                engine.close()
            weights = weight_table(args, tokenizer, base, base_dir)
            forwards = forward_split_table(args) if args.torchrun else ""
        finally:
            ray.shutdown()
            destroy()
    minutes = (time.perf_counter() - start) / 60
    print(f"base: {how}; {args.prompts} prompts x 8 samples, {task.max_new_tokens}-token budget")
    print(
        f"load average (1/5/15 min) at the start {start_load}, at the end {load()}; "
        f"{minutes:.1f} min; {args.rounds} rounds x {args.steps - 1} steady steps per mode\n"
    )
    print(step_table(mode_list, results) + "\n")
    print(overlap_check(results) + "\n")
    print(one_off_table() + "\n")
    print(weights)
    if forwards:
        print("\nno-grad forwards per rank at 2 torchrun ranks, whole batch vs split by rows\n")
        print(forwards)


if __name__ == "__main__":
    main()
