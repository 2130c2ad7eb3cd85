"""Sampler and learner agree: every forward plan the update can take scores the sampled tokens
with the sampler's own log-probs, and a step whose first pass does not stops before the
optimizer steps (`rlvr.train.agreement`).

CI runs this file against the oldest transformers rlvr admits and the newest
(`scripts/check_versions.sh`): transformers < 5.24 names the forward's KV cache
`past_key_values`, later releases `cache`, and a wrong name is swallowed without a word.
"""

import dataclasses

import pytest
import torch

from rlvr.models.logprobs import completion_logprobs, completion_logprobs_shared_prompts
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model
from rlvr.report.timer import StepTimer
from rlvr.rollout.engine import HFEngine
from rlvr.rollout.sampler import sample_completions
from rlvr.tasks.arithmetic import ArithmeticTaskConfig, train_problems
from rlvr.train import update
from rlvr.train.agreement import (
    FP32_TOLERANCE,
    AgreementCheck,
    LogprobMismatchError,
    agreement_check,
    check_agreement,
)
from rlvr.train.config import GRPOConfig, Monitor, RolloutCorrection
from rlvr.train.grpo import build_trainer, grpo_step

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
AGREE = 1e-4  # measured on these plans: < 3e-5 (fp32)


class EosBias(torch.nn.Module):
    """A model whose EOS logit is raised by `bias` (rows end at different steps); its forward
    takes **kwargs, as a wrapper's does."""

    def __init__(self, model: torch.nn.Module, bias: float):
        super().__init__()
        self.model, self.bias = model, bias
        self.config = model.config

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.logits[..., EOS] += self.bias
        return out


def sampled_batch(model, seed: int = 0):
    """Prompts of unequal length (left padding), completions of unequal length (right
    padding), three completions per prompt at T = 0.7."""
    batch = sample_completions(
        model,
        TOKENIZER,
        ["357+468=", "1+2=", "99-5="],
        3,
        10,
        0.7,
        torch.Generator().manual_seed(seed),
    )
    assert len(set(batch.lengths.tolist())) >= 2 and bool((batch.prompt_mask == 0).any())
    return batch


def tiny(seed: int = 2) -> torch.nn.Module:
    return build_tiny_model(TinyModelConfig(hidden_size=32, num_layers=2), TOKENIZER, seed=seed)


def deviation(logp: torch.Tensor, batch) -> float:
    mask = batch.completion_mask != 0
    return (logp - batch.logprobs).abs()[mask].max().item()


@pytest.mark.parametrize("wrapped", [False, True], ids=["model", "wrapper"])
@pytest.mark.parametrize(
    "plan",
    ["padded rows", "shared prompt", "chunked head", "shared prompt + chunked head"],
)
def test_every_forward_plan_gives_the_samplers_logprobs(plan, wrapped):
    model = tiny()
    sampler = EosBias(model, 1.5) if wrapped else model
    batch = sampled_batch(sampler)
    chunk = 3 if "chunked" in plan else 0
    scorer = sampler.train()  # the update scores in training mode
    with torch.no_grad():
        if "shared" in plan:
            logp = completion_logprobs_shared_prompts(
                scorer, *batch.model_inputs(), batch.group_ids, 0.7, chunk
            )
        else:
            logp = completion_logprobs(scorer, *batch.model_inputs(), 0.7, chunk)
    assert deviation(logp, batch) < AGREE


def test_a_lora_policy_gives_the_samplers_logprobs():
    pytest.importorskip("peft")
    from rlvr.models.lora import LoRAConfig, apply_lora

    model = apply_lora(tiny(), LoRAConfig(rank=4), seed=0)
    batch = sampled_batch(model)
    with torch.no_grad():
        shared = completion_logprobs_shared_prompts(
            model.train(), *batch.model_inputs(), batch.group_ids, 0.7, 3
        )
    assert deviation(shared, batch) < AGREE


def _rows():
    problems = train_problems(ArithmeticTaskConfig(digits=2), seed=0)
    return ({"prompt": p.prompt, "answer": p.answer} for p in problems)


def _length_reward(prompts, completions, **_):
    return [len(c) % 3 / 2 for c in completions]


def _trainer(config: GRPOConfig, engine_of=HFEngine):
    policy = tiny(0)
    engine = engine_of(policy, TOKENIZER)
    t = build_trainer(policy, TOKENIZER, _rows(), [_length_reward], config, 0, engine=engine)
    return t, policy


def _step(t):
    return grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())


CONFIG = GRPOConfig(
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=12,
    lr=1e-2,
    cpu_workers=1,
    monitor=Monitor(every=0),
)


@pytest.mark.parametrize(
    "switches",
    [
        {},
        {"forward": "padded"},
        {"forward": "packed"},
        {"forward": "packed", "logprob_chunk_tokens": 5},
        {"logprob_chunk_tokens": 5},
        {"cpu_workers": 2, "micro_batch_tokens": 40},
        {"mu": 2},
    ],
    ids=[
        "default",
        "a prompt per row",
        "packed",
        "packed chunked",
        "chunked",
        "workers + micro-batches",
        "mu 2",
    ],
)
def test_an_on_policy_step_measures_agreement_on_its_first_pass(switches):
    t, _ = _trainer(dataclasses.replace(CONFIG, **switches))
    metrics = _step(t).metrics
    assert metrics["update/micro_batches"] >= 1
    assert 0 <= metrics["agreement/max_abs_log_ratio"] < AGREE
    if t.plan.mu == 1:  # later passes score moved weights: their ratio is not 1
        assert metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_an_off_policy_step_is_not_checked():
    tis = RolloutCorrection(mode="tis")
    t, _ = _trainer(dataclasses.replace(CONFIG, rollout_correction=tis))
    assert t.learner.agreement is None
    assert "agreement/max_abs_log_ratio" not in _step(t).metrics


def test_a_learner_that_scores_without_the_prompt_stops_before_the_optimizer_steps(
    monkeypatch,
):
    """The transformers < 5.24 fault, reproduced: the shared-prompt pass runs the completions
    with an empty cache. The step raises one line naming both paths, the deviation and the
    versions, and the weights are those the step started from."""

    def without_prompt(model, prompt_ids, prompt_mask, *rest, **kwargs):
        blank = torch.zeros_like(prompt_mask)
        return completion_logprobs(model, prompt_ids, blank, *rest[:2], *rest[3:], **kwargs)

    monkeypatch.setattr(update, "completion_logprobs_shared_prompts", without_prompt)
    t, policy = _trainer(CONFIG)
    before = [p.detach().clone() for p in policy.parameters()]
    with pytest.raises(LogprobMismatchError) as caught:
        _step(t)
    message = str(caught.value)
    for part in ("at step 1", "HF forward with KV cache", "shared-prompt forward", "torch "):
        assert part in message, part
    assert "transformers " in message and "\n" not in message
    for a, b in zip(before, policy.parameters()):
        assert torch.equal(a, b)  # nothing was updated


class NoisyEngine(HFEngine):
    """An engine whose log-probs are not the learner's numerics (as vLLM's or bf16's)."""

    exact_logprobs = False
    logprob_path = "a noisy engine"

    def generate(self, *args, **kwargs):
        batch = super().generate(*args, **kwargs)
        batch.logprobs = batch.logprobs + 0.5 * batch.completion_mask
        return batch


def test_an_engine_that_cannot_agree_exactly_is_logged_and_warned_about_once(capsys):
    t, _ = _trainer(dataclasses.replace(CONFIG, steps=2), NoisyEngine)
    assert t.learner.agreement == AgreementCheck(None, "a noisy engine")
    first, second = _step(t).metrics, _step(t).metrics
    assert first["agreement/max_abs_log_ratio"] == pytest.approx(0.5, abs=1e-3)
    assert second["agreement/max_abs_log_ratio"] > 0.4
    err = capsys.readouterr().err
    assert err.count("--grpo.rollout-correction.mode") == 1 and "a noisy engine" in err


def test_the_check_is_resolved_from_the_engine_and_the_precision():
    exact, noisy = HFEngine(None, None), NoisyEngine(None, None)
    assert agreement_check(False, exact, torch.float32) is None
    assert agreement_check(True, exact, torch.float32).tolerance == FP32_TOLERANCE
    assert agreement_check(True, exact, torch.bfloat16).tolerance is None
    assert agreement_check(True, noisy, torch.float32).tolerance is None
    check = AgreementCheck(1e-3, "engine")
    assert check_agreement(check, 5e-4, "learner", 1) is None
    with pytest.raises(LogprobMismatchError):
        check_agreement(check, float("nan"), "learner", 1)
    assert check_agreement(AgreementCheck(None, "e"), 0.05, "l", 1) is None
    assert "rollout-correction" in check_agreement(AgreementCheck(None, "e"), 0.2, "l", 1)
