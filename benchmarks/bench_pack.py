"""Each forward of the loss side by side: padded rows, a prompt per group, packed sequences.

    python benchmarks/bench_pack.py                     # every setting, 5 rounds
    python benchmarks/bench_pack.py --settings lab episodes --rounds 3
    python benchmarks/bench_pack.py --quick             # 2 rounds, smoke test

One sampled batch per setting (seeded), then the update's forward and backward over it with
each forward (`--grpo.forward padded | shared-prompt | packed`, and `auto` to show which the
cost model takes), run as the trainer runs it (`update.plan_update_work` and
`accumulate_gradients`, the lab's worker threads and micro-batch budget), the modes taking
turns round by round so that machine load falls on all alike. Settings:

- `lab`: the lab's base model on its task (3-digit addition), 16 prompts x 8;
- `long`: 12-digit addition (~125-token solutions), 16 prompts x 8, the lab's base when cached
  (`benchmarks/bench_trl.py --setting long` builds it), else a random model of its shape;
- `episodes`: `retry_arith` episodes (up to three tries, the environment's turns between),
  16 prompts x 8, the lab's base for it;
- `smollm2`: SmolLM2-135M-Instruct (when `rlvr models prepare smollm2-135m-instruct` has run)
  on 2-digit questions through its chat template, 8 prompts x 4, the head chunked by 1024;
- `random135m`: a randomly initialised model of SmolLM2-135M's shape (no checkpoint needed:
  the one that runs on a GPU machine), 64 rows of random tokens, prompts of 40 to 80 and
  completions of 8 to 200 tokens, the head chunked by 1024.

`--device cuda` (with `--dtype bfloat16` or `float32`) runs the updates on a GPU, timed with
`torch.cuda.synchronize` and the peak taken from `torch.cuda.max_memory_allocated`.

Per setting and forward: the share of the computed tokens that is padding, median seconds per
update, the policy's completion tokens per second, the peak resident memory the update added
(sampled every 5 ms, after handing freed memory back), and the speed against the padded
forward.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import threading
import time

import _common
import torch

FORWARDS = ("padded", "shared-prompt", "packed", "auto")


class PeakRSS:
    """The highest resident memory above the starting level while the block runs (MB). Freed
    memory is handed back to the system first (`malloc_trim`), so what an earlier mode left in
    the allocator's free lists does not hide this one's peak."""

    def __enter__(self) -> PeakRSS:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        self.start = self.peak = _common.current_rss_mb()
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        while self.running:
            self.peak = max(self.peak, _common.current_rss_mb())
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        self.running = False
        self.thread.join()
        self.added = max(0.0, self.peak - self.start)


def lab_batch(digits: int, prompts: int, group: int):
    """(model, batch, config) for the lab's arithmetic at `digits` digits."""
    from rlvr.models.tiny import load_model
    from rlvr.rollout.engine import HFEngine
    from rlvr.train.config import GRPOConfig

    config, task = _common.lab_setup(digits)
    cached = digits == 3 or _common.base_is_cached(config)
    directory, how = _common.base_model_dir(config, task, random_init=not cached)
    model, tokenizer = load_model(directory)
    rows = task.held_out_rows()[:prompts]
    generator = torch.Generator().manual_seed(0)
    batch = HFEngine(model, tokenizer).generate(
        [r["prompt"] for r in rows], group, task.max_new_tokens, 1.0, generator
    )
    return model, batch, GRPOConfig(max_new_tokens=task.max_new_tokens), how


def episode_batch(prompts: int, group: int):
    from rlvr.config import RunPlace
    from rlvr.models.tiny import load_model
    from rlvr.pipelines.lab import LabConfig, build_base_model, lab_task
    from rlvr.rollout.engine import HFEngine
    from rlvr.rollout.episodes import EpisodeLimits, PlainTurns, episode_batch, run_episodes
    from rlvr.tasks.registry import EnvChoice
    from rlvr.train.config import GRPOConfig

    config = LabConfig(env=EnvChoice(name="retry_arith"), place=RunPlace(progress=False))
    task = lab_task(config)
    directory, _ = build_base_model(config, task)
    model, tokenizer = load_model(directory)
    rows = task.held_out_rows()[:prompts]
    limits = EpisodeLimits(task.max_turns, task.episode_tokens, task.max_new_tokens)
    episodes = run_episodes(
        HFEngine(model, tokenizer),
        PlainTurns(tokenizer),
        task.environment,
        rows,
        list(range(len(rows))),
        group,
        limits,
        1.0,
        torch.Generator().manual_seed(0),
        tokenizer.decode,
        tokenizer.eos_token_id,
    )
    batch = episode_batch(episodes, group, tokenizer.pad_token_id)
    return model, batch, GRPOConfig(max_new_tokens=task.episode_tokens), "retry_arith lab base"


def smollm2_batch(prompts: int, group: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr.pipelines.base_model import prepared_model_dir
    from rlvr.rollout.engine import HFEngine
    from rlvr.tasks import arithmetic
    from rlvr.tasks.arithmetic import ArithmeticTaskConfig
    from rlvr.train.config import LOGPROB_CHUNK_TOKENS, GRPOConfig

    directory = prepared_model_dir("smollm2-135m-instruct")
    if not (directory / "config.json").exists():
        return None
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    config = ArithmeticTaskConfig(digits=2, style="question")
    questions = [r["prompt"] for r in arithmetic.rows(arithmetic.held_out_problems(config))]
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in questions[:prompts]
    ]
    generator = torch.Generator().manual_seed(0)
    batch = HFEngine(model, tokenizer).generate(texts, group, 24, 1.0, generator)
    plan = GRPOConfig(max_new_tokens=24, logprob_chunk_tokens=LOGPROB_CHUNK_TOKENS)
    return model, batch, plan, "SmolLM2-135M-Instruct, chat template"


def random135m_batch(rows: int = 64):
    """A SmolLM2-135M-shaped random Llama and a batch of random tokens of uneven lengths."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.rollout.sampler import RolloutBatch
    from rlvr.train.config import LOGPROB_CHUNK_TOKENS, GRPOConfig

    torch.manual_seed(0)
    shape = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(shape)
    g = torch.Generator().manual_seed(0)
    prompt_lengths = torch.randint(40, 81, (rows,), generator=g)
    completion_lengths = torch.randint(8, 201, (rows,), generator=g)
    p, t = int(prompt_lengths.max()), int(completion_lengths.max())
    prompt_mask = (torch.arange(p)[None, :] >= p - prompt_lengths[:, None]).long()
    completion_mask = (torch.arange(t)[None, :] < completion_lengths[:, None]).float()
    batch = RolloutBatch(
        prompt_ids=torch.randint(0, 49152, (rows, p), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        completion_ids=torch.randint(0, 49152, (rows, t), generator=g) * completion_mask.long(),
        completion_mask=completion_mask,
        logprobs=torch.zeros((rows, t)),
        truncated=torch.zeros(rows, dtype=torch.bool),
        group_ids=torch.arange(rows // 4).repeat_interleave(4),
        completions=[""] * rows,
    )
    plan = GRPOConfig(
        max_new_tokens=t, logprob_chunk_tokens=LOGPROB_CHUNK_TOKENS, micro_batch_tokens=4096
    )
    return model, batch, plan, "random SmolLM2-135M shape, random tokens"


DEVICE = {"device": "cpu", "dtype": "float32"}


def time_update(model, batch, plan, forwards: tuple[str, ...]):
    """(seconds, work, peak MB added) of one update over `batch` with `forwards`."""
    from rlvr.devices import resolve_precision
    from rlvr.train.update import accumulate_gradients, plan_update_work

    precision = resolve_precision(DEVICE["device"], DEVICE["dtype"])
    if precision.device.type == "cuda":
        return _time_cuda_update(model, batch, plan, forwards, precision)

    advantages = torch.linspace(-1.0, 1.0, len(batch.group_ids))  # every row carries
    loss_mask = batch.policy_mask
    work = plan_update_work(
        batch,
        advantages,
        loss_mask,
        skip_zero_advantage=False,
        workers=plan.workers,
        micro_batch_tokens=plan.micro_batch_tokens,
        forwards=forwards,
    )
    model.train()
    with PeakRSS() as memory:
        start = time.perf_counter()
        accumulate_gradients(
            model,
            batch,
            work,
            advantages,
            loss_mask,
            None,
            plan.loss_fn,
            1.0,
            plan.workers,
            plan.logprob_chunk_tokens,
        )
        seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds, work, memory.added


def _time_cuda_update(model, batch, plan, forwards, precision):
    from rlvr.rollout.episodes import to_device
    from rlvr.train.update import accumulate_gradients, plan_update_work

    batch = to_device(batch, precision.device)
    model.to(precision.device).train()
    advantages = torch.linspace(-1.0, 1.0, len(batch.group_ids), device=precision.device)
    work = plan_update_work(
        batch,
        advantages,
        batch.policy_mask,
        skip_zero_advantage=False,
        workers=1,
        micro_batch_tokens=plan.micro_batch_tokens,
        forwards=forwards,
    )
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    with precision.autocast():
        accumulate_gradients(
            model,
            batch,
            work,
            advantages,
            batch.policy_mask,
            None,
            plan.loss_fn,
            1.0,
            1,
            plan.logprob_chunk_tokens,
        )
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    added = (torch.cuda.max_memory_allocated() - base) / 2**20
    model.zero_grad(set_to_none=True)
    return seconds, work, added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--settings",
        nargs="+",
        default=["lab", "long", "episodes", "smollm2"],
        choices=["lab", "long", "episodes", "smollm2", "random135m"],
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 rounds, smoke test")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    DEVICE.update(device=args.device, dtype=args.dtype)
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(2)

    from rlvr.train.config import build_plan

    makers = {
        "lab": lambda: lab_batch(3, 16, 8),
        "long": lambda: lab_batch(12, 16, 8),
        "episodes": lambda: episode_batch(16, 8),
        "smollm2": lambda: smollm2_batch(8, 4),
        "random135m": random135m_batch,
    }
    table = []
    for setting in args.settings:
        made = makers[setting]()
        if made is None:
            _common.say(f"{setting}: skipped (rlvr models prepare smollm2-135m-instruct first)")
            continue
        model, batch, config, how = made
        plan = build_plan(config)
        modes = {f: (f,) if f != "auto" else plan.forwards for f in FORWARDS}
        _common.say(f"{setting}: {how}, {len(batch.group_ids)} rows, {rounds} rounds")
        time_update(model, batch, plan, modes["padded"])  # warm-up
        seconds: dict[str, list[float]] = {f: [] for f in modes}
        memory: dict[str, float] = dict.fromkeys(modes, 0.0)
        works = {}
        for r in range(rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for f in order:
                s, work, added = time_update(model, batch, plan, modes[f])
                seconds[f].append(s)
                memory[f] = max(memory[f], added)
                works[f] = work
        tokens = float(batch.policy_mask.sum())
        padded = _common.median(seconds["padded"])
        for f in modes:
            s = _common.median(seconds[f])
            name = f"auto ({works[f].forward})" if f == "auto" else f
            table.append(
                [
                    setting,
                    name,
                    f"{works[f].padding_frac:.2f}",
                    f"{s:.3f}",
                    f"{tokens / s:,.0f}",
                    f"{memory[f]:.0f}",
                    f"{padded / s:.2f}x",
                ]
            )
    header = ["setting", "forward", "padding", "s / update", "tokens/s", "peak MB", "vs padded"]
    print(_common.markdown_table(header, table))


if __name__ == "__main__":
    main()
