"""Pinned behaviour: two seeded GRPO steps per recipe give the numbers recorded before the
restructure (rtol 1e-4). A move that changes what a step computes breaks this test.

The model is the untrained 32-wide tiny model; the reward counts distinct characters in a
completion, so every group has spread and every switch (clip, KL, critic, dynamic sampling,
overlong shaping, several workers and micro-batches) does real work. The values were recorded
on main at c9da05e by running this file with RLVR_PIN_PRINT=1 (lora, teacher and async at
5580cf1). The loss sits near 0 where the
advantages are centred on-policy, so it is also compared to 1e-6 absolute.

The lab's own numbers are checked in tests/test_lab_numbers.py (`pytest -m slow`): a band that
holds on any CPU, and bit-identical reruns on one machine.
"""

import dataclasses
import os

import pytest
import torch

from rlvr.models.lora import LoRAConfig, apply_lora
from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model, save_model
from rlvr.report.run_dir import RunDirectory
from rlvr.tasks import arithmetic
from rlvr.tasks.arithmetic import ArithmeticTaskConfig
from rlvr.train.config import GRPOConfig, Monitor, RolloutCorrection
from rlvr.train.grpo import train_grpo
from rlvr.train.recipes import recipe_config

PINNED_KEYS = ("loss", "grad_norm", "reward/mean")

BASE = GRPOConfig(
    steps=2,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=12,
    lr=1e-3,
    eval_every=1000,
    monitor=Monitor(every=0),
    checkpoint_every=0,
    cpu_workers=1,
)
CASES = {
    "grpo": recipe_config("grpo", BASE),
    "rloo": recipe_config("rloo", BASE),
    "dr_grpo": recipe_config("dr_grpo", BASE),
    "dapo": recipe_config("dapo", dataclasses.replace(BASE, max_new_tokens=12)),
    "gspo": recipe_config("gspo", BASE),
    "reinforce++": recipe_config("reinforce++", BASE),
    "ppo": recipe_config("ppo", BASE),
    "workers-micro-batches-mu2": dataclasses.replace(
        BASE, cpu_workers=2, micro_batch_tokens=64, mu=2, beta=0.04, ref_sync_every=1
    ),
    "no-shared-prompts": dataclasses.replace(
        BASE, forward="padded", micro_batch_tokens=64, mask_truncated=True
    ),
    # a LoRA policy (`lora=True` below) with beta > 0: the reference is the adapters-off base
    "lora": dataclasses.replace(BASE, beta=0.04, lr=1e-2),
    # on-policy distillation: `teacher` is filled in with a saved tiny model's directory
    "teacher": recipe_config("opd", dataclasses.replace(BASE, prompts_per_step=8)),
    "async": dataclasses.replace(
        BASE, async_steps=1, rollout_correction=RolloutCorrection(mode="tis")
    ),
}
# the pinned step holds for each forward of the loss: the same numbers as "grpo" (auto)
FORWARD_CASES = {f"grpo, forward {f}": f for f in ("padded", "shared-prompt", "packed")}
CASES.update(
    {name: dataclasses.replace(CASES["grpo"], forward=f) for name, f in FORWARD_CASES.items()}
)
LORA_CASES = {"lora"}
TEACHER_CASES = {"teacher"}

EXPECTED: dict[str, list[dict[str, float]]] = {
    "grpo": [
        {
            "loss": -4.470348358154297e-08,
            "grad_norm": 1.1022700071334839,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": 7.141381502151489e-06, "grad_norm": 0.7574906349182129, "reward/mean": 1.046875},
    ],
    "rloo": [
        {
            "loss": -2.0489096641540527e-08,
            "grad_norm": 0.7307212352752686,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": -4.842877388000488e-08, "grad_norm": 0.40332168340682983, "reward/mean": 1.046875},
    ],
    "dr_grpo": [
        {
            "loss": -0.0950520932674408,
            "grad_norm": 0.2661852538585663,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": -0.053493939340114594, "grad_norm": 0.20154330134391785, "reward/mean": 1.046875},
    ],
    "dapo": [
        {
            "loss": 0.02020944654941559,
            "grad_norm": 0.7153564691543579,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": 0.0569273866713047, "grad_norm": 0.7496012449264526, "reward/mean": 1.046875},
    ],
    "gspo": [
        {
            "loss": -2.2351741790771484e-08,
            "grad_norm": 1.1022700071334839,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": -3.725290298461914e-08, "grad_norm": 0.7573332190513611, "reward/mean": 1.046875},
    ],
    "reinforce++": [
        {
            "loss": -0.3136735260486603,
            "grad_norm": 0.667086124420166,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": -0.18108050525188446, "grad_norm": 0.6727432012557983, "reward/mean": 1.046875},
    ],
    "ppo": [
        {
            "loss": -9.053869653996571e-09,
            "grad_norm": 0.7700075507164001,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": -1.3154128453152225e-07, "grad_norm": 0.888168215751648, "reward/mean": 1.046875},
    ],
    "workers-micro-batches-mu2": [
        {"loss": -0.06450110860168934, "grad_norm": 0.6735321879386902, "reward/mean": 1.09375},
        {"loss": -0.04974283347837627, "grad_norm": 0.5810663104057312, "reward/mean": 1.046875},
    ],
    "no-shared-prompts": [
        {
            "loss": 0.752577930688858,
            "grad_norm": 1.5990945100784302,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": 1.4150903224945068, "grad_norm": 3.2534849643707275, "reward/mean": 1.046875},
    ],
    "lora": [
        {
            "loss": -0.22219444811344147,
            "grad_norm": 0.05156711861491203,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": -0.14564216136932373, "grad_norm": 0.04182475432753563, "reward/mean": 1.046875},
    ],
    "teacher": [
        {
            "loss": 0.010117189027369022,
            "grad_norm": 0.0660727396607399,
            "reward/mean": 0.9700521230697632,
        },
        {"loss": 0.006834678817540407, "grad_norm": 0.06508143991231918, "reward/mean": 1.03125},
    ],
    "async": [
        {
            "loss": -0.22219444811344147,
            "grad_norm": 0.7156049609184265,
            "reward/mean": 0.9114583730697632,
        },
        {"loss": -0.1441410928964615, "grad_norm": 0.5918859243392944, "reward/mean": 1.046875},
    ],
}


def distinct_reward(prompts, completions, **_):
    """A reward that differs inside every group: distinct characters, up to 12."""
    return [len(set(c)) / 12 for c in completions]


TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def run_two_steps(config: GRPOConfig, tmp_path, lora: bool = False) -> list[dict[str, float]]:
    torch.set_num_threads(2)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TINY, tokenizer, seed=0)
    if lora:
        model = apply_lora(model, LoRAConfig(rank=4), seed=0)
    task = ArithmeticTaskConfig(digits=2)
    rows = ({"prompt": p.prompt, "answer": p.answer} for p in arithmetic.train_problems(task, 3))
    records = train_grpo(
        model,
        tokenizer,
        rows,
        [distinct_reward],
        config,
        RunDirectory(tmp_path, "pin"),
        evaluate=lambda m: {},
        seed=0,
        progress=False,
    )
    return [{k: r[k] for k in PINNED_KEYS} for r in records if r["step"] > 0]


@pytest.mark.parametrize("name", list(CASES))
def test_two_seeded_steps_give_the_pinned_numbers(name, tmp_path):
    config = CASES[name]
    if name in TEACHER_CASES:
        teacher = build_tiny_model(TINY, build_char_tokenizer(), seed=3)
        directory = save_model(teacher, build_char_tokenizer(), tmp_path / "teacher")
        distill = dataclasses.replace(config.distill, teacher=str(directory))
        config = dataclasses.replace(config, distill=distill)
    got = run_two_steps(config, tmp_path / "run", lora=name in LORA_CASES)
    if os.environ.get("RLVR_PIN_PRINT"):
        print(f"PIN {name!r}: {got!r},")
        return
    expected = EXPECTED["grpo" if name in FORWARD_CASES else name]
    assert len(got) == len(expected) == 2
    for step, (g, e) in enumerate(zip(got, expected), start=1):
        for key in PINNED_KEYS:
            assert g[key] == pytest.approx(e[key], rel=1e-4, abs=1e-6), (name, step, key)
