"""Episodes over several turns (`rlvr.rollout.episodes`): the action mask keeps the environment's
tokens out of the loss, the token loop is exact (ids and log-probs), budgets and faults end an
episode without stalling the batch, groups start from one state, and chat templates render
turn by turn or are refused."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch

from rlvr.models.logprobs import completion_logprobs
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.timer import StepTimer
from rlvr.rollout.engine import HFEngine
from rlvr.rollout.episodes import (
    ChatTemplateTurns,
    EpisodeError,
    EpisodeLimits,
    EpisodeSpec,
    PlainTurns,
    TemplateError,
    episode_batch,
    episode_metrics,
    run_episodes,
    turn_reward_tokens,
)
from rlvr.rollout.sampler import RolloutBatch
from rlvr.train import loss_checks, update
from rlvr.train.config import GRPOConfig, build_plan
from rlvr.train.rollouts import AsyncRollout, EpisodeRollout
from tests.helpers import ScriptedEngine, close

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
SHAPE = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def tiny_model(seed: int = 0) -> torch.nn.Module:
    return build_tiny_model(SHAPE, TOKENIZER, seed=seed)


def ids(text: str) -> list[int]:
    return list(TOKENIZER(text, add_special_tokens=False)["input_ids"])


class CountEnv:
    """Opens with the row's prompt; answers each reply with "ok<k>\\n" until `turns` replies,
    then ends with reward 1 for a reply that holds a digit, else 0. Records its seeds."""

    seeds: list[int] = []

    def __init__(self, turns: int = 3, message: str = "ok{k}\n") -> None:
        self.turns, self.message, self.k = turns, message, 0

    def reset(self, row, *, seed):
        CountEnv.seeds.append(seed)
        self.row = row
        return [{"role": "user", "content": row["prompt"]}], [], {"opened": 1}

    def step(self, reply):
        self.k += 1
        if self.k >= self.turns:
            reward = float(any(c.isdigit() for c in reply))
            return [], reward, True, {"tool_calls": 1}
        return [{"role": "user", "content": self.message.format(k=self.k)}], 0.5, False, {}

    def close(self):
        pass


class RecordingEngine(HFEngine):
    """The in-process engine, recording each call's prompts and what it returned."""

    def __init__(self, model) -> None:
        super().__init__(model, TOKENIZER)
        self.seen: list[tuple[list[list[int]], list[tuple[list[int], list[float]]]]] = []

    def generate_tokens(self, prompts, max_new_tokens, temperature, generator=None, **kwargs):
        out = super().generate_tokens(prompts, max_new_tokens, temperature, generator, **kwargs)
        self.seen.append(([list(p) for p in prompts], out))
        return out


def run(engine, factory, rows, limits=None, group_size=2, seeds=None, temperature=1.0):
    limits = limits or EpisodeLimits(max_turns=4, max_tokens=60, max_reply_tokens=8)
    return run_episodes(
        engine,
        PlainTurns(TOKENIZER),
        factory,
        rows,
        seeds if seeds is not None else list(range(len(rows))),
        group_size,
        limits,
        temperature,
        torch.Generator().manual_seed(0),
        TOKENIZER.decode,
        EOS,
    )


# --- the token loop ------------------------------------------------------------------------


def test_scripted_episode_tokens_masks_and_return():
    engine = ScriptedEngine(TOKENIZER, ["a1", "b", "c7"])
    (e,) = run(engine, CountEnv, [{"prompt": "Q:"}], group_size=1)
    assert e.status == "done" and e.replies == ["a1", "b", "c7"]
    assert e.prompt_ids == ids("Q:")
    expected = ids("a1") + [EOS] + ids("ok1\n") + ids("b") + [EOS] + ids("ok2\n")
    expected += ids("c7") + [EOS]
    assert e.ids == expected
    assert e.action == [1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1]
    assert [math.isnan(x) for x in e.logprobs] == [a == 0 for a in e.action]
    assert e.turn_ends == [2, 8, 15] and e.turn_rewards == [0.5, 0.5, 1.0]
    assert e.episode_return(1.0) == 2.0
    assert e.episode_return(0.5) == 0.5 + 0.25 + 0.25  # 0.5 + 0.5 * 0.5 + 0.25 * 1
    assert e.counts["tool_calls"] == 1.0
    # the engine was prompted with everything so far, turn by turn
    assert engine.prompts[1] == [e.prompt_ids + e.ids[:7]]
    assert engine.prompts[2] == [e.prompt_ids + e.ids[:13]]


def test_batch_marks_env_tokens_and_pads():
    engine = ScriptedEngine(TOKENIZER, ["a1", "b", "c7"])
    episodes = run(engine, CountEnv, [{"prompt": "Q:"}, {"prompt": "QQ:"}], group_size=1)
    short = dataclasses.replace(episodes[1])
    short.ids, short.action, short.logprobs = short.ids[:3], short.action[:3], short.logprobs[:3]
    batch = episode_batch([episodes[0], short], 1, TOKENIZER.pad_token_id)
    assert batch.prompt_ids.shape == (2, 3) and batch.prompt_mask.tolist() == [[0, 1, 1]] + [
        [1, 1, 1]
    ]
    assert batch.completion_mask.sum(1).tolist() == [16.0, 3.0]
    assert batch.action_mask[0].tolist() == [float(a) for a in episodes[0].action]
    assert batch.action_mask[1].tolist() == [1.0] * 3 + [0.0] * 13
    assert torch.isnan(batch.logprobs[0]).sum() == 8  # the env's tokens, never 0
    assert not torch.isnan(batch.logprobs[1]).any()  # padding is 0
    assert torch.equal(batch.policy_mask, batch.action_mask)
    assert batch.completions == ["c7", "c7"] and batch.group_ids.tolist() == [0, 1]


def test_turn_rewards_land_on_their_turns_last_token():
    (e,) = run(
        ScriptedEngine(TOKENIZER, ["a1", "b", "c7"]), CountEnv, [{"prompt": "Q:"}], group_size=1
    )
    rewards = turn_reward_tokens([e], 18)
    expected = torch.zeros(1, 18)
    expected[0, 2], expected[0, 8], expected[0, 15] = 0.5, 0.5, 1.0
    assert torch.equal(rewards, expected)


def test_groups_share_row_and_seed():
    CountEnv.seeds = []
    rows = [{"prompt": "A:"}, {"prompt": "B:"}]
    episodes = run(ScriptedEngine(TOKENIZER, ["x"]), CountEnv, rows, group_size=3, seeds=[11, 22])
    assert sorted(CountEnv.seeds) == [11, 11, 11, 22, 22, 22]
    assert [e.prompt_ids for e in episodes] == [ids("A:")] * 3 + [ids("B:")] * 3


def test_rollout_draws_one_seed_per_group():
    """`EpisodeRollout`: the G episodes of a group get one row and one seed, from the loop's
    generator; different groups get different seeds."""
    CountEnv.seeds = []
    model = tiny_model()
    rollout = episode_rollout(model, CountEnv, group_size=3, prompts=2)
    batch, rewards, metrics = rollout.collect(torch.Generator().manual_seed(3), StepTimer())
    seeds = CountEnv.seeds
    assert len(seeds) == 6 and len(set(seeds)) == 2 and seeds.count(seeds[0]) == 3
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1] and len(rewards) == 6
    assert metrics["env/turns_mean"] >= 1.0


# --- token exactness -----------------------------------------------------------------------


def test_training_ids_are_the_engines_and_learner_logprobs_match():
    """A replayed episode's training ids equal, turn by turn, what the engine was prompted with
    and sampled; the learner's log-probs on the sampled tokens equal the sampler's (ratio 1)."""
    torch.manual_seed(0)
    model = tiny_model(seed=1)
    engine = RecordingEngine(model)
    limits = EpisodeLimits(max_turns=3, max_tokens=40, max_reply_tokens=6)
    rows = [{"prompt": "12+34="}, {"prompt": "7*8="}]
    episodes = run(engine, lambda: CountEnv(3), rows, limits=limits)
    for i, e in enumerate(episodes):
        cursor = 0
        for call, (prompts, outputs) in enumerate(engine.seen):
            running = [j for j, other in enumerate(episodes) if len(other.replies) > call]
            if i not in running:
                continue
            k = running.index(i)  # the loop prompts the running episodes in order
            assert prompts[k] == e.prompt_ids + e.ids[:cursor], f"episode {i}, turn {call}"
            sampled = outputs[k][0][: len(e.ids) - cursor]
            assert e.ids[cursor : cursor + len(sampled)] == sampled
            assert all(a == 1 for a in e.action[cursor : cursor + len(sampled)])
            cursor += len(sampled)
            while cursor < len(e.ids) and e.action[cursor] == 0:
                cursor += 1
        assert cursor == len(e.ids), f"episode {i}: not every token came from the engine"
    batch = episode_batch(episodes, 2, TOKENIZER.pad_token_id)
    with torch.no_grad():
        learner = completion_logprobs(model.eval(), *batch.model_inputs(), 1.0)
    sampled = batch.policy_mask.bool()
    close(learner[sampled], batch.logprobs[sampled], atol=1e-5)


# --- the mask in the loss ------------------------------------------------------------------


def step_inputs(config: GRPOConfig, batch: RolloutBatch, rewards: torch.Tensor, ref=None):
    plan = build_plan(config)
    probe = loss_checks._Probe(batch, rewards.double(), ref, None, batch.logprobs)
    return plan, loss_checks._prepare(plan, probe)


def gradient(model, plan, inputs):
    result = loss_checks._step_gradient(model, plan, inputs, micro_batch_tokens=0)
    return result.loss, result.grad


def sampled_batch(model) -> tuple[RolloutBatch, torch.Tensor]:
    engine = HFEngine(model, TOKENIZER)
    limits = EpisodeLimits(max_turns=3, max_tokens=40, max_reply_tokens=6)
    episodes = run(engine, lambda: CountEnv(3), [{"prompt": "1+2="}, {"prompt": "3+4="}], limits)
    batch = episode_batch(episodes, 2, TOKENIZER.pad_token_id)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return batch, rewards


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_env_token_logprobs_and_logits_change_neither_loss_nor_gradient(beta, monkeypatch):
    torch.manual_seed(0)
    model = tiny_model(seed=2).train()
    batch, rewards = sampled_batch(model)
    env = (batch.completion_mask - batch.policy_mask).bool()
    assert env.any(), "the batch must hold environment tokens"
    behaviour = torch.where(env, 0.0, batch.logprobs)  # finite everywhere for the reference
    ref = behaviour - 0.1 if beta else None
    config = GRPOConfig(beta=beta, max_new_tokens=40, mu=1)
    plan, inputs = step_inputs(config, dataclasses.replace(batch, logprobs=behaviour), rewards, ref)
    loss, grad = gradient(model, plan, inputs)
    assert grad.abs().sum() > 0

    # the env tokens' behaviour (and reference) log-probs: NaN, or any numbers
    for value in (float("nan"), 3.0):
        perturbed = torch.where(env, value, behaviour)
        ref_p = torch.where(env, value, ref) if ref is not None else None
        p_plan, p_inputs = step_inputs(
            config, dataclasses.replace(batch, logprobs=perturbed), rewards, ref_p
        )
        p_loss, p_grad = gradient(model, p_plan, p_inputs)
        assert p_loss == pytest.approx(loss, abs=1e-7) and torch.equal(p_grad, grad)

    # the learner's log-probs (its logits) at env positions: scaled and shifted
    original = update.completion_logprobs

    def skewed(policy, prompt_ids, prompt_mask, completion_ids, *rest):
        logp, entropy = original(policy, prompt_ids, prompt_mask, completion_ids, *rest)
        t = completion_ids.shape[1]  # the micro-batch's rows, found in the batch by their ids
        rows = [int((batch.completion_ids[:, :t] == r).all(1).nonzero()[0]) for r in completion_ids]
        at_env = env[rows, :t]
        return torch.where(at_env, 3.0 * logp + 1.0, logp), entropy + at_env

    monkeypatch.setattr(update, "completion_logprobs", skewed)
    no_share = dataclasses.replace(plan, forwards=("padded",))
    s_loss, s_grad = gradient(model, no_share, inputs)
    monkeypatch.undo()
    base_loss, base_grad = gradient(model, no_share, inputs)
    assert s_loss == pytest.approx(base_loss, abs=1e-7)
    close(s_grad, base_grad, atol=1e-7)
    close(base_grad, grad, atol=1e-6)  # the shared-prompt forward gives the same


def test_one_turn_episodes_equal_the_single_turn_step():
    """With one turn and no environment tokens, an episode batch is the single-turn batch the
    one-turn sampler gives from the same draws, and the step's loss and gradient are equal."""
    model = tiny_model(seed=3).train()
    prompts = ["12+34=", "5+6="]
    single = HFEngine(model, TOKENIZER).generate(
        prompts, 2, 8, 1.0, torch.Generator().manual_seed(5)
    )

    class OneTurn(CountEnv):
        def __init__(self):
            super().__init__(turns=1)

    limits = EpisodeLimits(max_turns=1, max_tokens=8, max_reply_tokens=8)
    episodes = run_episodes(
        HFEngine(model, TOKENIZER),
        PlainTurns(TOKENIZER),
        OneTurn,
        [{"prompt": p} for p in prompts],
        [0, 1],
        2,
        limits,
        1.0,
        torch.Generator().manual_seed(5),
        TOKENIZER.decode,
        EOS,
    )
    batch = episode_batch(episodes, 2, TOKENIZER.pad_token_id)
    width = single.completion_ids.shape[1]
    assert torch.equal(batch.prompt_ids, single.prompt_ids)
    assert torch.equal(batch.completion_ids[:, :width], single.completion_ids)
    assert torch.equal(batch.action_mask[:, :width], single.completion_mask)
    close(batch.logprobs[:, :width], single.logprobs, atol=1e-6)
    assert batch.completions == single.completions
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    config = GRPOConfig(max_new_tokens=8)
    loss_a, grad_a = gradient(model, *step_inputs(config, batch, rewards))
    loss_b, grad_b = gradient(model, *step_inputs(config, single, rewards))
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    close(grad_a, grad_b, atol=1e-6)


# --- budgets and faults --------------------------------------------------------------------


def test_token_budget_cuts_an_overflowing_env_message():
    factory = lambda: CountEnv(5, message="a long message {k}\n")  # noqa: E731
    limits = EpisodeLimits(max_turns=5, max_tokens=20, max_reply_tokens=4)
    (e,) = run(
        ScriptedEngine(TOKENIZER, ["ab"]), factory, [{"prompt": "Q:"}], limits=limits, group_size=1
    )
    assert e.status == "truncated" and len(e.ids) == 19  # room left for no reply token
    assert e.action[:3] == [1, 1, 1] and e.action[3:] == [0] * 16
    batch = episode_batch([e], 1, TOKENIZER.pad_token_id)
    assert batch.truncated.tolist() == [True]
    plan = build_plan(GRPOConfig(max_new_tokens=20, mask_truncated=True))
    assert plan.loss_mask(batch.policy_mask, batch.truncated).sum() == 0  # masked everywhere


def test_reply_budget_across_turns():
    limits = EpisodeLimits(max_turns=9, max_tokens=12, max_reply_tokens=3)
    (e,) = run(
        ScriptedEngine(TOKENIZER, ["abcdef"]),
        lambda: CountEnv(9, "k\n"),
        [{"prompt": "Q"}],
        limits,
        1,
    )
    # each reply is cut at 3 tokens without EOS: the first one ends the episode truncated
    assert e.status == "truncated" and e.ids == ids("abc") and e.turn_rewards == [0.0]
    limits = EpisodeLimits(max_turns=9, max_tokens=11, max_reply_tokens=3)
    (e,) = run(
        ScriptedEngine(TOKENIZER, ["a"]), lambda: CountEnv(9, "k\n"), [{"prompt": "Q"}], limits, 1
    )
    assert len(e.ids) <= 11 and e.status == "truncated"


class HangingEnv(CountEnv):
    def step(self, reply):
        if self.row["prompt"] == "hang":
            time.sleep(60)
        if self.row["prompt"] == "raise":
            raise RuntimeError("the tool broke")
        return super().step(reply)


def test_a_hung_step_times_out_and_a_raising_one_errors_without_stalling_the_batch():
    limits = EpisodeLimits(max_turns=3, max_tokens=40, max_reply_tokens=4, step_timeout_s=0.3)
    rows = [{"prompt": "hang"}, {"prompt": "raise"}, {"prompt": "fine"}]
    start = time.monotonic()
    episodes = run(ScriptedEngine(TOKENIZER, ["7"]), HangingEnv, rows, limits=limits, group_size=1)
    assert time.monotonic() - start < 5
    hung, raised, fine = episodes
    assert hung.status == "timeout" and hung.episode_return(1.0) == 0.0
    assert raised.status == "error" and "RuntimeError: the tool broke" in raised.info["error"]
    assert raised.episode_return(1.0) == 0.0
    assert fine.status == "done" and fine.episode_return(1.0) == 2.0
    metrics = episode_metrics(episodes)
    assert metrics["env/timeout_frac"] == pytest.approx(1 / 3)
    assert metrics["env/error_frac"] == pytest.approx(1 / 3)


class HangingCloseEnv(CountEnv):
    """Closing never returns."""

    def close(self) -> None:
        time.sleep(3600)


def test_closes_that_hang_cost_one_timeout_not_one_per_episode():
    limits = EpisodeLimits(max_turns=1, max_tokens=20, max_reply_tokens=4, step_timeout_s=0.5)
    rows = [{"prompt": f"{i}"} for i in range(8)]
    start = time.monotonic()
    episodes = run(
        ScriptedEngine(TOKENIZER, ["7"]), lambda: HangingCloseEnv(1), rows, limits, group_size=2
    )
    assert time.monotonic() - start < 3  # 16 episodes: closed side by side, not 16 x 0.5 s
    assert len(episodes) == 16 and all(e.done for e in episodes)


def test_episode_clock_bounds_all_calls():
    class Slow(CountEnv):
        def step(self, reply):
            time.sleep(0.15)
            return super().step(reply)

    limits = EpisodeLimits(
        max_turns=9, max_tokens=99, max_reply_tokens=3, step_timeout_s=5, episode_timeout_s=0.4
    )
    (e,) = run(
        ScriptedEngine(TOKENIZER, ["1"]), lambda: Slow(9, "k\n"), [{"prompt": "Q"}], limits, 1
    )
    assert e.status == "timeout" and 2 <= len(e.replies) <= 4


@pytest.mark.parametrize(
    "reset, message",
    [
        (lambda row, seed: 1 / 0, "reset raised ZeroDivisionError"),
        (lambda row, seed: ("not messages", [], {}), "reset must return a list of messages"),
        (lambda row, seed: [{"role": "user"}], "reset raised"),
    ],
)
def test_a_bad_reset_scores_zero_and_says_why(reset, message):
    class Bad(CountEnv):
        def reset(self, row, *, seed):
            return reset(row, seed)

    (e,) = run(ScriptedEngine(TOKENIZER, ["x"]), Bad, [{"prompt": "Q"}], group_size=1)
    assert e.status == "error" and message in e.info["error"] and e.episode_return(1) == 0.0


def test_a_step_returning_garbage_is_an_error():
    class Bad(CountEnv):
        def step(self, reply):
            return "a string", 1.0, False, {}

    (e,) = run(ScriptedEngine(TOKENIZER, ["x"]), Bad, [{"prompt": "Q"}], group_size=1)
    assert e.status == "error" and "step must return a list of messages" in e.info["error"]


# --- sync and async rollouts ---------------------------------------------------------------


def episode_rollout(model, factory, group_size=2, prompts=2, limits=None):
    limits = limits or EpisodeLimits(max_turns=3, max_tokens=30, max_reply_tokens=6)
    plan = build_plan(
        GRPOConfig(prompts_per_step=prompts, group_size=group_size, max_new_tokens=6)
    ).sampling
    rows = iter([{"prompt": f"{i}+{i}="} for i in range(1000)])
    spec = EpisodeSpec(factory, limits, PlainTurns(TOKENIZER))
    return EpisodeRollout(
        HFEngine(model, TOKENIZER), rows, [], [], plan, TOKENIZER.pad_token_id, spec
    )


def test_sync_and_async_episode_rollouts_are_identical():
    """The same truncating budget gives the same batch (ids, masks, truncation, rewards) on the
    sync path and through `AsyncRollout` (its engine samples with a copy of the weights)."""
    limits = EpisodeLimits(max_turns=3, max_tokens=14, max_reply_tokens=5)
    factory = lambda: CountEnv(3, "again\n")  # noqa: E731
    sync = episode_rollout(tiny_model(seed=4), factory, limits=limits)
    a_batch, a_rewards, _ = sync.collect(torch.Generator().manual_seed(9), StepTimer())
    inner = episode_rollout(tiny_model(seed=4), factory, limits=limits)
    asynchronous = AsyncRollout(inner, ahead=1, timeout_s=60)
    try:
        b_batch, b_rewards, metrics = asynchronous.collect(
            torch.Generator().manual_seed(9), StepTimer()
        )
    finally:
        asynchronous.close()
    assert a_batch.truncated.any(), "the budget must truncate some episode"
    for name in ("prompt_ids", "completion_ids", "completion_mask", "action_mask", "truncated"):
        assert torch.equal(getattr(a_batch, name), getattr(b_batch, name)), name
    assert torch.equal(a_rewards, b_rewards) and metrics["async/staleness"] == 0.0


# --- chat templates ------------------------------------------------------------------------

CHATML = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
DROPS_THINKING = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['role'] == 'assistant' and not loop.last %}"
    "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}"
    "<|endoftext|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def templated(template: str):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def test_chat_template_turns_are_a_fixed_base_difference():
    tokenizer = templated(CHATML)
    renderer = ChatTemplateTurns(tokenizer)
    opening = [{"role": "user", "content": "hi"}]
    first = renderer.opening(opening, [])
    reply = ids("yo") + [EOS]
    tool = [{"role": "tool", "content": "42"}]
    after = renderer.after_reply(tool)
    assert tokenizer.decode(after) == "\n<|tool|>42<|endoftext|>\n<|assistant|>"
    conversation = [*opening, {"role": "assistant", "content": "yo"}, *tool]
    whole = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert first + reply + after == ids(whole)  # turn by turn = the whole conversation rendered


def test_a_template_that_rewrites_history_is_refused():
    with pytest.raises(TemplateError, match="not prefix-preserving"):
        ChatTemplateTurns(templated(DROPS_THINKING))


def test_a_template_without_the_eos_turn_end_is_refused():
    template = CHATML.replace("<|endoftext|>", "<|end|>")
    with pytest.raises(TemplateError, match="EOS token"):
        ChatTemplateTurns(templated(template))


def test_a_group_must_open_from_one_state():
    class Random(CountEnv):
        count = 0

        def reset(self, row, *, seed):
            Random.count += 1
            return [{"role": "user", "content": f"{Random.count}"}], [], {}

    episodes = run(ScriptedEngine(TOKENIZER, ["x"]), Random, [{"prompt": "Q"}], group_size=2)
    with pytest.raises(EpisodeError, match="must start from one state"):
        episode_batch(episodes, 2, TOKENIZER.pad_token_id)


def test_a_failed_reset_takes_its_groups_opening():
    class Flaky(CountEnv):
        count = 0

        def reset(self, row, *, seed):
            Flaky.count += 1
            if Flaky.count == 1:
                raise OSError("no connection")
            return super().reset(row, seed=seed)

    episodes = run(ScriptedEngine(TOKENIZER, ["x"]), Flaky, [{"prompt": "Q:"}], group_size=2)
    assert [e.status for e in episodes] == ["error", "done"]
    batch = episode_batch(episodes, 2, TOKENIZER.pad_token_id)
    assert batch.prompt_ids[0].tolist() == batch.prompt_ids[1].tolist() == ids("Q:")
    assert batch.policy_mask[0].sum() == 0


@pytest.mark.parametrize("ranks", [0, 2])
def test_a_multi_turn_step_splits_across_micro_batches_and_ranks(ranks):
    """The loss-split identities of `rlvr check-loss` on an episode batch: micro-batches, two
    worker threads (ranks 0) and two simulated torch.distributed ranks give the one-pass
    gradient (the divisors count the policy's tokens of the whole step)."""
    torch.manual_seed(0)
    model = tiny_model(seed=5).train()
    batch, rewards = sampled_batch(model)
    for aggregation in ("token-mean", "seq-mean-token-mean"):
        config = GRPOConfig(max_new_tokens=40, aggregation=aggregation)
        plan, inputs = step_inputs(config, batch, rewards)
        reference = loss_checks._step_gradient(model, plan, inputs, micro_batch_tokens=0)
        result = loss_checks._check_split(model, config, plan, inputs, reference, ranks=ranks)
        assert result.applicable and result.passed, result.detail


def test_the_token_mean_divides_by_the_policys_tokens_only():
    """On-policy (ratio 1) the token-mean step's gradient is that of
    -sum(A_i * logp_it * action_it) / sum(action_it): environment tokens neither add terms nor
    count in the divisor."""
    torch.manual_seed(0)
    model = tiny_model(seed=6).train()
    batch, rewards = sampled_batch(model)
    mask = batch.policy_mask
    assert mask.sum() < batch.completion_mask.sum()
    logp = completion_logprobs(model, *batch.model_inputs(), 1.0)
    on_policy = dataclasses.replace(batch, logprobs=torch.where(mask.bool(), logp.detach(), 0.0))
    config = GRPOConfig(max_new_tokens=40, aggregation="token-mean")
    plan, inputs = step_inputs(config, on_policy, rewards)
    _, grad = gradient(model, plan, inputs)
    model.zero_grad()
    advantages = inputs.advantages.float()
    expected = -(advantages[:, None] * logp * mask).sum() / mask.sum()
    expected.backward()
    want = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
    close(grad, want, atol=1e-6)


def test_the_corpora_end_replies_with_the_tiny_tokenizers_eos():
    from rlvr.models.tiny import EOS_TOKEN
    from rlvr.tasks.spec import REPLY_END

    assert REPLY_END == EOS_TOKEN and ids(REPLY_END) == [EOS]
