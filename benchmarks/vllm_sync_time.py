"""How long `VLLMEngine.load_weights` takes: the weight sync after every update, on vLLM's CPU.

    RLVR_CACHE=/tmp/rlvrcache python benchmarks/vllm_sync_time.py     # in the vLLM venv
    python benchmarks/vllm_sync_time.py --syncs 9 --models tiny

Run it with the venv `scripts/vllm_check.sh` builds (vLLM's CPU build). Models: `tiny`, the
tiny Llama model at a width vLLM's CPU attention accepts (128 wide, 4 heads: head_dim 32),
built here; `smollm2`, SmolLM2-135M-Instruct as `rlvr models prepare smollm2-135m-instruct`
converts it (skipped, with the command, when missing). Each model runs in a process of its own
(one vLLM engine per process). Per model: parameters, engine start-up, the median of `--syncs`
`load_weights(state_dict)` calls in ms (alternating between the weights and a perturbed copy,
so every sync moves new values), and, as a check that the last sync took, the largest gap
between vLLM's sampling log-probs and `completion_logprobs` of the loaded weights.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as common
import torch

RESULT = "RESULT "  # prefix of the child's one line of results on stdout
TINY = {"hidden_size": 128, "num_layers": 4, "num_heads": 4, "intermediate_size": 512}


def model_dir_and_tokenizer(name: str, workdir: Path):
    """(directory, tokenizer) of model `name`; None when its checkpoint is not prepared."""
    if name == "tiny":
        from rlvr.models.tiny import (
            TinyModelConfig,
            build_char_tokenizer,
            build_tiny_model,
            save_model,
        )

        tokenizer = build_char_tokenizer()
        model = build_tiny_model(TinyModelConfig(**TINY), tokenizer, seed=0)
        return save_model(model, tokenizer, workdir / "tiny"), tokenizer
    from transformers import AutoTokenizer

    from rlvr.pipelines.base_model import prepared_model_dir

    directory = prepared_model_dir("smollm2-135m-instruct")
    if not (directory / "config.json").exists():
        return None
    return directory, AutoTokenizer.from_pretrained(directory)


def perturbed(model: torch.nn.Module, scale: float = 1e-3) -> dict[str, torch.Tensor]:
    """A seeded copy of `model`'s state dict with every weight moved by `scale` x N(0, 1)."""
    generator = torch.Generator().manual_seed(0)
    return {
        k: v + scale * torch.randn(v.shape, generator=generator)
        for k, v in model.state_dict().items()
    }


def measure(name: str, syncs: int) -> dict | None:
    """One model's row (run in a child process): parameters, start-up, sync times, check."""
    from transformers import AutoModelForCausalLM

    from rlvr.models.logprobs import completion_logprobs
    from rlvr.rollout.engine import VLLMEngine

    workdir = Path(tempfile.mkdtemp())
    found = model_dir_and_tokenizer(name, workdir)
    if found is None:
        return None
    directory, tokenizer = found
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    start = time.perf_counter()
    engine = VLLMEngine(directory, tokenizer, device="cpu", seed=0)
    start_s = time.perf_counter() - start
    weights = [model.state_dict(), perturbed(model)]
    times = []
    for i in range(syncs):
        begin = time.perf_counter()
        engine.load_weights(weights[i % 2])
        times.append(time.perf_counter() - begin)
    model.load_state_dict(weights[(syncs - 1) % 2])  # the weights vLLM holds now
    batch = engine.generate(["12+30=", "The capital of France is"], 2, 8, 1.0)
    with torch.no_grad():
        logp = completion_logprobs(model, *batch.model_inputs(), temperature=1.0)
    gap = float(((logp - batch.logprobs) * batch.completion_mask).abs().max())
    return {
        "model": name,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "start_s": start_s,
        "sync_ms": [t * 1e3 for t in times],
        "logprob_gap": gap,
    }


def run_child(name: str, syncs: int) -> dict | None:
    """`measure(name)` in a fresh process; its vLLM log is shown only when it fails."""
    argv = [sys.executable, __file__, "--child", name, "--syncs", str(syncs)]
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"{name}: the measuring process failed (exit {done.returncode})")
    return json.loads(lines[-1].removeprefix(RESULT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"])
    parser.add_argument("--syncs", type=int, default=5, help="load_weights calls per model")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(RESULT + json.dumps(measure(args.child, args.syncs)), flush=True)
        return
    rows = []
    for name in args.models:
        common.say(f"{name}: starting vLLM and syncing {args.syncs} times")
        result = run_child(name, args.syncs)
        if result is None:
            common.say(
                f"{name}: not prepared; run `rlvr models prepare smollm2-135m-instruct` "
                "(set RLVR_CACHE to where it keeps models)"
            )
            continue
        sync = result["sync_ms"]
        rows.append(
            [
                name,
                f"{result['params_m']:.1f} M",
                f"{result['start_s']:.1f}",
                f"{common.median(sync):.1f}",
                f"{min(sync):.1f}-{max(sync):.1f}",
                f"{result['logprob_gap']:.1e}",
            ]
        )
    header = ["model", "params", "engine start s", "sync ms (median)", "range", "log-prob gap"]
    print(common.markdown_table(header, rows))


if __name__ == "__main__":
    main()
