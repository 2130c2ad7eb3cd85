"""On-policy distillation end to end: the teacher is loaded (and refused with another
tokenizer), `rlvr train opd --grpo.distill.teacher DIR` trains and logs the reverse KL, the
reverse KL to a trained teacher falls, and the pipeline's `teacher:` setting names an earlier
stage."""

import dataclasses
import itertools

import pytest
import torch

from rlvr.cli import main
from rlvr.config import ConfigError
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
from rlvr.pipelines import stages
from rlvr.pipelines.common import PipelineContext
from rlvr.pipelines.pipeline import parse_pipeline
from rlvr.report.run_dir import read_jsonl
from rlvr.report.run_log import QUIET
from rlvr.report.timer import StepTimer
from rlvr.rollout.engine import HFEngine
from rlvr.tasks import reasoning
from rlvr.tasks.arithmetic import ArithmeticTaskConfig, train_problems
from rlvr.train.config import Distill, GRPOConfig, check_grpo_config
from rlvr.train.grpo import build_trainer, grpo_step
from rlvr.train.sft import train_next_token
from rlvr.train.teacher import TeacherError, load_teacher

SHAPE = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _saved(tmp_path, name, tokenizer, seed=0):
    model = build_tiny_model(SHAPE, tokenizer, seed=seed)
    return model, save_model(model, tokenizer, tmp_path / name)


def _problems(seed):
    return train_problems(ArithmeticTaskConfig(digits=2), seed=seed)


def test_a_teacher_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    other = build_char_tokenizer()
    other.add_tokens(["<extra>"])
    _, directory = _saved(tmp_path, "teacher", other)
    with pytest.raises(TeacherError, match="tokenizer is not the student's") as info:
        load_teacher(directory, build_char_tokenizer(), "cpu", torch.float32, 1.0)
    assert "\n" not in str(info.value) and str(directory) in str(info.value)
    assert "tokens against" in str(info.value)
    with pytest.raises(TeacherError, match="teacher: .*does not exist"):
        load_teacher(tmp_path / "nowhere", build_char_tokenizer(), "cpu", torch.float32, 1.0)


def test_the_same_tokenizer_loads_a_frozen_teacher(tmp_path):
    tokenizer = build_char_tokenizer()
    _, directory = _saved(tmp_path, "teacher", tokenizer)
    teacher = load_teacher(directory, tokenizer, "cpu", torch.float32, 0.7)
    assert not teacher.model.training and teacher.temperature == 0.7
    assert not any(p.requires_grad for p in teacher.model.parameters())


def test_distillation_switches_are_checked_naming_the_field():
    base = GRPOConfig(max_new_tokens=8)
    cases = {
        "distill.reward_coef has no effect without a teacher: set distill.teacher": {
            "distill": Distill(reward_coef=1.0)
        },
        "distill.kl_coef and distill.reward_coef must be >= 0": {
            "distill": Distill(teacher="t", kl_coef=-1.0)
        },
        "cannot both be 0": {"distill": Distill(teacher="t", kl_coef=0.0)},
        "advantage_estimator=gae": {
            "distill": Distill(teacher="t"),
            "advantage_estimator": "gae",
        },
    }
    for message, change in cases.items():
        with pytest.raises(ValueError, match=message):
            check_grpo_config(dataclasses.replace(base, **change))
    # pure distillation needs no group baseline: one completion per prompt is valid
    check_grpo_config(dataclasses.replace(base, distill=Distill(teacher="t"), group_size=1))
    with pytest.raises(ValueError, match="group_size must be >= 2"):  # mixing the reward does
        mixed = Distill(teacher="t", reward_coef=0.5)
        check_grpo_config(dataclasses.replace(base, distill=mixed, group_size=1))


def test_rlvr_train_opd_with_a_teacher_logs_the_reverse_kl(tmp_path, capsys):
    from tests.test_lab import TINY

    _, teacher = _saved(tmp_path, "teacher", build_char_tokenizer(), seed=3)
    runs = tmp_path / "runs"
    common = ["--runs-dir", str(runs), "--cache-dir", str(tmp_path / "cache"), *TINY]
    main(
        ["train", "opd", "--run-name", "d", *common, "--grpo.steps", "2"]
        + ["--grpo.distill.teacher", str(teacher)]
    )
    metrics = [m for m in read_jsonl(runs / "d" / "metrics.jsonl") if m["step"] > 0]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        # two random models: near-uniform both, a small reverse KL, but not the same model
        assert 0 < abs(m["distill/reverse_kl"]) < 1
        assert m["time/teacher_logprobs_s"] > 0
    config = (runs / "d" / "config.yaml").read_text()
    assert "recipe: opd" in config and f"teacher: {teacher}" in config
    # a teacher with another tokenizer: one line, no traceback
    other = build_char_tokenizer()
    other.add_tokens(["<extra>"])
    _, bad = _saved(tmp_path, "bad", other)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["train", "opd", "--run-name", "e", *common, "--grpo.distill.teacher", str(bad)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("rlvr: error: ")]
    assert len(errors) == 1  # (the lab's own warning about the random base comes first)
    message = errors[0]
    assert "tokenizer is not the student's" in message and str(bad) in message


def _trained_teacher(tokenizer):
    """A tiny model taught the 2-digit answers by next-token training (a few seconds)."""
    model = build_tiny_model(SHAPE, tokenizer, seed=1)
    pairs = ((p.prompt, p.answer) for p in _problems(seed=5))
    train_next_token(model, tokenizer, pairs, steps=40, batch_size=16, lr=5e-3, progress=False)
    return model


@torch.no_grad()
def _first_token_kl(student, teacher, tokenizer) -> float:
    """The exact KL(student || teacher) of the first answer token, mean over three prompts."""
    inputs = tokenizer(["12+34=", "56+7=", "80+19="], return_tensors="pt", padding=True)
    p = torch.log_softmax(student(**inputs).logits[:, -1], dim=-1)
    q = torch.log_softmax(teacher(**inputs).logits[:, -1], dim=-1)
    return (p.exp() * (p - q)).sum(-1).mean().item()


def test_the_reverse_kl_to_a_trained_teacher_falls(tmp_path):
    tokenizer = build_char_tokenizer()
    teacher = _trained_teacher(tokenizer)
    teacher_dir = save_model(teacher, tokenizer, tmp_path / "teacher")
    student = build_tiny_model(SHAPE, tokenizer, seed=2)  # fresh
    rows = ({"prompt": p.prompt, "answer": p.answer} for p in _problems(seed=0))
    config = GRPOConfig(
        prompts_per_step=32,
        group_size=1,
        max_new_tokens=3,
        lr=1e-2,
        distill=Distill(teacher=str(teacher_dir)),
        cpu_workers=1,
    )

    def no_reward(prompts, completions, **_):
        return [0.0] * len(completions)

    engine = HFEngine(student, tokenizer)
    t = build_trainer(student, tokenizer, rows, [no_reward], config, seed=0, engine=engine)
    exact_before = _first_token_kl(student, teacher, tokenizer)
    kls = []
    for _ in range(12):
        result = grpo_step(t.plan, t.rollout, t.learner, t.state.generator, StepTimer())
        kls.append(result.metrics["distill/reverse_kl"])
    first, last = sum(kls[:3]) / 3, sum(kls[-3:]) / 3
    assert last < 0.8 * first, kls  # the logged (sampled) reverse KL
    assert _first_token_kl(student, teacher, tokenizer) < 0.5 * exact_before  # the exact one


def test_the_grpo_stage_teacher_parses_and_an_unknown_stage_is_named(tmp_path):
    pipeline = parse_pipeline(
        {
            "stages": [
                {"name": "t", "kind": "base", "steps": 1},
                {"name": "s", "kind": "grpo", "teacher": "t", "grpo": {"group_size": 1}},
            ]
        },
        "p",
        "p.yaml",
    )
    settings = pipeline.stages[1].settings
    assert settings.teacher == "t"
    task_config = reasoning.ReasoningTaskConfig()
    task = reasoning.task_spec(task_config)
    config = stages.grpo_stage_config(settings, task)  # before the run: a stand-in
    assert config.distill.teacher == "<the model of stage t>" and config.group_size == 1
    assert stages.grpo_stage_config(settings, task, teacher_dir="/m").distill.teacher == "/m"
    wrong = dataclasses.replace(settings, teacher="nope")
    ctx = PipelineContext(task_config, task, None, 0, QUIET)
    with pytest.raises(ConfigError, match="teacher: stage 'nope' did not run earlier") as info:
        stages.run_grpo_stage(wrong, ctx, tmp_path)
    assert "\n" not in str(info.value)
    both = dataclasses.replace(settings, grpo=GRPOConfig(distill=Distill(teacher="/m")))
    with pytest.raises(ConfigError, match="leave grpo.distill.teacher unset"):
        stages.grpo_stage_config(both, task)


def test_the_distill_pipeline_compares_sft_opd_and_rl_at_the_same_time():
    from rlvr.pipelines.pipeline import load_pipeline

    by_name = {s.name: s.settings for s in load_pipeline("distill").stages}
    opd, rl = by_name["student-opd"], by_name["student-rl"]
    assert opd.teacher == "teacher-rl" and opd.model == rl.model == "student-base"
    assert opd.same_time_as == rl.same_time_as == "student-sft"
    assert list(itertools.islice(by_name, 0, None))[-2:] == ["student-opd", "student-rl"]


def test_a_missing_teacher_is_refused_before_any_model_loads(tmp_path, capsys):
    from tests.test_cli import cli_error

    argv = ["train", "opd", "--grpo.distill.teacher", str(tmp_path / "nope")]
    message = cli_error([*argv, "--runs-dir", str(tmp_path)], capsys)
    assert "--grpo.distill.teacher" in message and "no config.json" in message
    assert not (tmp_path / "lab").exists()  # refused before the run directory was made


def test_the_opd_recipe_without_a_teacher_is_warned_about(capsys):
    from rlvr.pipelines.lab import recipe_lab_config, resolve

    resolve(recipe_lab_config("opd"))
    assert "opd without --grpo.distill.teacher" in capsys.readouterr().err
