"""What several turns cost: one GRPO step's rollout and update, one-turn against episodes.

    python benchmarks/bench_episodes.py            # 16 prompts x 8, 6 rounds
    python benchmarks/bench_episodes.py --quick

The `retry_arith` lab base (built by the lab's own function if it is not cached) samples the
same arithmetic prompts three ways, interleaved round by round so that machine load hits each
alike: the one-turn sampler (`HFEngine.generate`, what `--task arithmetic` runs), the episode
loop held to one turn (`run_episodes`, max_turns 1: the loop's own overhead), and whole
`retry_arith` episodes (up to three tries, "wrong, try again" between them). Each batch then
gets one update (the loss's forward and backward over its rows, `rlvr check-loss`'s
machinery). The table gives median seconds, sampled and environment tokens, turns per
episode, and each mode's step time against the one-turn step's. The fourth mode runs the same
episodes with every turn prefilling the whole conversation again (`keep_kv=False`), against
the default that keeps each episode's keys and values between its turns.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2 rounds, smoke test")
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(args.threads)

    from rlvr.config import RunPlace
    from rlvr.models.tiny import load_model
    from rlvr.pipelines.lab import LabConfig, build_base_model, lab_task
    from rlvr.rollout.engine import HFEngine
    from rlvr.rollout.episodes import EpisodeLimits, PlainTurns, episode_batch, run_episodes
    from rlvr.tasks import retry_arith
    from rlvr.tasks.registry import EnvChoice
    from rlvr.train import loss_checks
    from rlvr.train.config import GRPOConfig, build_plan

    config = LabConfig(env=EnvChoice(name="retry_arith"), place=RunPlace(progress=False))
    task = lab_task(config)
    base_dir, _ = build_base_model(config, task)
    model, tokenizer = load_model(base_dir)
    rows = task.held_out_rows()[: args.prompts]
    engine = HFEngine(model, tokenizer)
    budget = task.max_new_tokens
    renderer = PlainTurns(tokenizer)
    tries = retry_arith.MAX_TRIES
    turns = {
        "one turn": 1,
        "episodes, 1 turn": 1,
        "episodes, 3 tries": tries,
        "episodes, 3 tries, re-prefill": tries,
    }
    plan = build_plan(GRPOConfig(max_new_tokens=task.episode_tokens))

    def sample(mode: str, seed: int):
        generator = torch.Generator().manual_seed(seed)
        if mode == "one turn":
            batch = engine.generate(
                [r["prompt"] for r in rows], args.group_size, budget, 1.0, generator
            )
            return batch, None
        limits = EpisodeLimits(turns[mode], task.episode_tokens, budget)
        episodes = run_episodes(
            engine,
            renderer,
            task.environment,
            rows,
            list(range(len(rows))),
            args.group_size,
            limits,
            1.0,
            generator,
            tokenizer.decode,
            tokenizer.eos_token_id,
            keep_kv=not mode.endswith("re-prefill"),
        )
        return episode_batch(episodes, args.group_size, tokenizer.pad_token_id), episodes

    def learn(batch) -> None:
        rewards = torch.rand(len(batch.group_ids), generator=torch.Generator().manual_seed(0))
        logp = torch.where(batch.policy_mask.bool(), batch.logprobs, 0.0)
        batch = dataclasses.replace(batch, logprobs=logp)
        probe = loss_checks._Probe(batch, rewards.double(), None, None, logp)
        inputs = loss_checks._prepare(plan, probe)
        model.train()
        loss_checks._step_gradient(model, plan, inputs, micro_batch_tokens=0)

    times: dict[str, list[tuple[float, float]]] = {m: [] for m in turns}
    shape: dict[str, tuple[float, float, float]] = {}
    for r in range(rounds):
        for mode in turns:
            start = time.perf_counter()
            batch, episodes = sample(mode, r)
            sampled = time.perf_counter()
            learn(batch)
            times[mode].append((sampled - start, time.perf_counter() - sampled))
            policy = float(batch.policy_mask.sum())
            env = float(batch.completion_mask.sum()) - policy
            replies = statistics.mean(len(e.replies) for e in episodes) if episodes else 1.0
            shape[mode] = (policy, env, replies)

    one = statistics.median(a + b for a, b in times["one turn"])
    print(f"{args.prompts} prompts x {args.group_size}, {rounds} rounds, retry_arith lab base\n")
    columns = "rollout s | update s | step s | vs one turn | sampled tokens | env tokens | turns"
    print(f"| mode | {columns} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode in turns:
        roll = statistics.median(a for a, _ in times[mode])
        upd = statistics.median(b for _, b in times[mode])
        step = statistics.median(a + b for a, b in times[mode])
        policy, env, replies = shape[mode]
        print(
            f"| {mode} | {roll:.2f} | {upd:.2f} | {step:.2f} | {step / one:.2f}x "
            f"| {policy:.0f} | {env:.0f} | {replies:.2f} |"
        )


if __name__ == "__main__":
    main()
