"""What Ray rollout workers cost on this machine: start-up, per-call overhead, weight sync.

    python benchmarks/ray_overhead.py                 # tiny model, then SmolLM2-135M's sync
    python benchmarks/ray_overhead.py --skip-135m     # tiny model only

Starts a local Ray on 127.0.0.1 (`start_ray`, 2 CPUs), then times: Ray's start; the start of
a `RayEngine` of 2 actors over the lab-sized tiny model (actor processes importing torch and
transformers, building the model, first weights); `generate` on the lab's rollout shape (8
prompts x 4 samples, 24 new tokens, T = 1) through the 2 actors against the in-process
`HFEngine` with one worker and with one worker thread per core (rlvr's CPU default), rounds
interleaved so that machine load hits each alike, plus a one-token call (the round trip
alone); and `load_weights` at the tiny model's ~1.2 M parameters and at SmolLM2-135M's
(the checkpoint `rlvr models prepare smollm2-135m-instruct` writes), against loading the same
state dict into an in-process copy. Medians over `--rounds`; a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import tempfile
import time
from pathlib import Path

import _common as common
import torch

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, load_model
from rlvr.rollout.engine import HFEngine
from rlvr.rollout.ray_cluster import start_ray
from rlvr.rollout.ray_engine import RayEngine

SMOLLM = Path(os.environ.get("RLVR_CACHE", "/tmp/rlvrcache")) / "models/smollm2-135m-instruct"


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def lab_prompts(count: int, seed: int = 0) -> list[str]:
    """Arithmetic prompts shaped like the lab's ("123+45=")."""
    rng = random.Random(seed)
    return [f"{rng.randint(0, 999)}+{rng.randint(0, 999)}=" for _ in range(count)]


def generate_rows(engine: RayEngine, model, tokenizer, rounds: int) -> list[list]:
    """Median seconds per `generate` call, Ray's 2 actors against in process."""
    prompts = lab_prompts(8)
    threaded = HFEngine(model, tokenizer, workers=torch.get_num_threads())
    modes = {  # name: (engine, samples per prompt, new tokens), for 8 prompts
        "in process, 1 worker": (HFEngine(model, tokenizer), 4, 24),
        f"in process, {threaded.workers} worker threads (default)": (threaded, 4, 24),
        "RayEngine, 2 actors": (engine, 4, 24),
        "RayEngine, 2 actors, round trip (8x1, 1 token)": (engine, 1, 1),
    }
    times: dict[str, list[float]] = {name: [] for name in modes}
    for r in range(rounds):
        for name, (e, n, t) in modes.items():
            g = torch.Generator().manual_seed(r)
            times[name].append(timed(lambda e=e, n=n, t=t, g=g: e.generate(prompts, n, t, 1.0, g)))
    base = common.median(times["in process, 1 worker"])
    rows = []
    for name, t in times.items():
        seconds = common.median(t)
        rows.append([f"generate: {name}", f"{seconds:.3f}", f"{seconds / base:.2f}x"])
    return rows


def weight_rows(label: str, model, tokenizer, rounds: int) -> list[list]:
    """Actor start and `load_weights` for `model`, against an in-process copy's load."""
    params = sum(p.numel() for p in model.parameters()) / 1e6
    start = time.perf_counter()
    with RayEngine(model, tokenizer, 2, timeout_s=900) as engine:
        started = time.perf_counter() - start
        state_dict = model.state_dict()
        ray_s = [timed(lambda: engine.load_weights(state_dict)) for _ in range(rounds)]
    local = HFEngine(copy.deepcopy(model), tokenizer)
    local_s = [timed(lambda: local.load_weights(state_dict)) for _ in range(rounds)]
    base = common.median(local_s)
    return [
        [f"RayEngine start, 2 actors, {label} ({params:.1f} M params)", f"{started:.2f}", ""],
        [f"load_weights {label}: in-process copy", f"{base:.3f}", "1.00x"],
        [
            f"load_weights {label}: 2 actors, object store",
            f"{common.median(ray_s):.3f}",
            f"{common.median(ray_s) / base:.2f}x",
        ],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-135m", action="store_true")
    parser.add_argument("--model-dir", type=Path, default=SMOLLM)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    tiny = build_tiny_model(TinyModelConfig(), tokenizer, seed=0)
    with tempfile.TemporaryDirectory(prefix="rlvr-ray-", dir="/tmp") as temp_dir:
        ray_start = timed(lambda: start_ray(None, num_cpus=2, temp_dir=temp_dir))
        rows = [["local Ray start (127.0.0.1, 2 CPUs)", f"{ray_start:.2f}", ""]]
        common.say("timing the tiny model's actors and generate ...")
        rows += weight_rows("tiny", tiny, tokenizer, args.rounds)
        with RayEngine(tiny, tokenizer, 2) as engine:
            rows += generate_rows(engine, tiny, tokenizer, args.rounds)
        if not args.skip_135m:
            if not args.model_dir.is_dir():
                raise SystemExit(
                    f"{args.model_dir} is missing: `rlvr models prepare smollm2-135m-instruct` "
                    "(offline), or --skip-135m"
                )
            common.say("timing SmolLM2-135M's actors and weight sync ...")
            model, smol_tokenizer = load_model(args.model_dir)
            rows += weight_rows("SmolLM2-135M", model, smol_tokenizer, args.rounds)
        import ray

        ray.shutdown()
    print(common.markdown_table(["what", "median s", "vs in process"], rows))


if __name__ == "__main__":
    main()
