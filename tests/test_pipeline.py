import json

import pytest
import yaml

from rlvr.config import ConfigError
from rlvr.pipelines import pipeline as pipeline_module
from rlvr.pipelines import stages
from rlvr.pipelines.common import PipelineContext
from rlvr.pipelines.pipeline import builtin_pipelines, load_pipeline, run_pipeline
from rlvr.report.run_log import QUIET
from rlvr.report.stats import format_interval
from rlvr.tasks.reasoning import task_spec as reasoning_task_spec

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
SPEC = {
    "name": "mini",
    "task": {"digits": 2, "held_out_size": 16},
    "tiny": TINY,
    "eval_modes": ["default", "no_think"],
    "stages": [
        {"name": "base", "kind": "base", "steps": 3, "batch_size": 4},
        {
            "name": "cold",
            "kind": "sft",
            "data": ["readable:8", "no_think:4"],
            "sft": {"steps": 2, "batch_size": 4},
        },
        {
            "name": "rl",
            "kind": "grpo",
            "grpo": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "checkpoint_every": 0},
            "consistency_weight": 0.5,
            "modes": ["think", "no_think"],
        },
        {
            "name": "samples",
            "kind": "sample",
            "prompts": 4,
            "sampling": {"num_samples": 2, "max_per_prompt": 1},
            "readable_only": False,
        },
        {"name": "budget", "kind": "thinking_budget", "budgets": [0, 4]},
    ],
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))


def write(tmp_path, spec) -> str:
    path = tmp_path / "mini.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_builtin_pipelines_parse():
    assert set(builtin_pipelines()) >= {"r1-zero", "r1", "distill", "qwen3"}
    for name in builtin_pipelines():
        assert load_pipeline(name).stages


def test_bad_pipelines_are_refused_naming_the_valid_keys(tmp_path):
    bad_key = {**SPEC, "stages": [{"name": "base", "kind": "base", "stepz": 3}]}
    with pytest.raises(
        ValueError, match=r"mini.yaml: stages\[0\]: unknown key 'stepz'.*valid keys"
    ):
        load_pipeline(write(tmp_path, bad_key))
    old_style = {**SPEC, "stages": [{"name": "rl", "kind": "grpo", "steps": 3}]}
    with pytest.raises(ValueError, match=r"stages\[0\]: unknown key 'steps'.*grpo"):
        load_pipeline(write(tmp_path, old_style))
    bad_type = {
        **SPEC,
        "stages": [SPEC["stages"][0], {"name": "rl", "kind": "grpo", "grpo": {"lr": "5e-4x"}}],
    }
    with pytest.raises(ConfigError, match=r"stages\[1\]\.grpo\.lr: expected float"):
        load_pipeline(write(tmp_path, bad_type))
    bad_kind = {**SPEC, "stages": [{"name": "x", "kind": "nope"}]}
    with pytest.raises(ValueError, match="unknown stage kind 'nope'"):
        load_pipeline(write(tmp_path, bad_kind))
    with pytest.raises(FileNotFoundError, match="r1-zero"):
        load_pipeline("no-such-pipeline")


def test_impossible_grpo_settings_are_refused_before_any_stage_runs(tmp_path):
    spec = {
        **SPEC,
        "stages": [SPEC["stages"][0], {"name": "rl", "kind": "grpo", "grpo": {"group_size": 1}}],
    }
    with pytest.raises(ConfigError, match=r"stages\[1\] \(rl\)\.grpo: .*group_size must be >= 2"):
        run_pipeline(load_pipeline(write(tmp_path, spec)), tmp_path / "run", log=QUIET)
    assert not (tmp_path / "run" / "01-base").exists()
    rollout = {"name": "rl", "kind": "grpo", "rollout": {"ray": True, "rollout_workers": 0}}
    spec = {**SPEC, "stages": [SPEC["stages"][0], rollout]}
    with pytest.raises(
        ConfigError, match=r"stages\[1\] \(rl\)\.rollout: --rollout-workers must be >= 1"
    ):
        run_pipeline(load_pipeline(write(tmp_path, spec)), tmp_path / "run", log=QUIET)


def test_pipeline_runs_reports_and_skips_finished_stages(tmp_path, monkeypatch):
    out = tmp_path / "run"
    spec = load_pipeline(write(tmp_path, SPEC))
    report = run_pipeline(spec, out, log=QUIET, report_to="tensorboard")
    assert [r["stage"] for r in report] == ["base", "cold", "rl", "samples", "budget"]
    assert list((out / "03-rl" / "grpo" / "tensorboard").glob("events.out.tfevents.*"))
    for row in report:
        if row["kind"] in ("base", "sft", "grpo"):
            assert 0 <= row["accuracy"] <= 1 and 0 <= row["readability@no_think"] <= 1
            assert 0 <= row["obeys@no_think"] <= 1 and 0 <= row["sampled"] <= 1
            assert row["length"] > 0
    assert (out / "report.png").exists() and "| cold | sft |" in (out / "report.md").read_text()
    # every accuracy cell of report.md carries its 95% interval over the held-out problems
    cold = next(line for line in (out / "report.md").read_text().splitlines() if "| cold |" in line)
    n = len(reasoning_task_spec(load_pipeline(write(tmp_path, SPEC)).task).held_out_rows())
    assert format_interval(report[1]["accuracy"], n) in cold
    assert (out / "05-budget" / "thinking_budget.png").exists()
    sft_rows = [json.loads(x) for x in open(out / "02-cold" / "sft_data.jsonl")]
    assert len(sft_rows) == 12 and sum("/no_think" in r["prompt"] for r in sft_rows) == 4
    # every stage directory has its config.yaml, resolved where a stage derives fields
    assert all((d / "config.yaml").exists() for d in out.iterdir() if d.is_dir())
    rl = yaml.safe_load((out / "03-rl" / "config.yaml").read_text())
    grpo = yaml.safe_load((out / "03-rl" / "grpo" / "config.yaml").read_text())
    assert grpo["steps"] == 1 and grpo["max_new_tokens"] == rl["grpo"]["max_new_tokens"] > 0
    sampling = yaml.safe_load((out / "04-samples" / "config.yaml").read_text())["sampling"]
    assert sampling["num_samples"] == 2 and sampling["max_new_tokens"] > 0

    # resume: nothing re-runs; a changed stage re-runs with everything after it
    calls = []
    for kind, (cls, fn) in list(stages.STAGE_KINDS.items()):

        def counting(s, ctx, d, fn=fn, kind=kind):
            calls.append(kind)
            return fn(s, ctx, d)

        monkeypatch.setitem(stages.STAGE_KINDS, kind, (cls, counting))
    run_pipeline(load_pipeline(write(tmp_path, SPEC)), out, log=QUIET)
    assert calls == []
    changed = json.loads(json.dumps(SPEC))
    changed["stages"][3]["sampling"]["num_samples"] = 3
    run_pipeline(load_pipeline(write(tmp_path, changed)), out, log=QUIET)
    assert calls == ["sample", "thinking_budget"]


def test_sample_stage_keeps_only_verified_readable_rows(tmp_path):
    spec = json.loads(json.dumps(SPEC))
    spec["stages"] = spec["stages"][:1] + [
        {"name": "samples", "kind": "sample", "prompts": 8, "sampling": {"num_samples": 4}}
    ]
    run_pipeline(load_pipeline(write(tmp_path, spec)), tmp_path / "run", log=QUIET)
    from rlvr.tasks import reasoning

    for line in open(tmp_path / "run" / "02-samples" / "samples.jsonl"):
        row = json.loads(line)
        assert reasoning.score(row["completion"], row["answer"]) == 1.0
        assert reasoning.readability(row["completion"]) == 1.0


def test_stage_context_names_missing_models():
    ctx = PipelineContext(None, None, None, 0, QUIET)
    with pytest.raises(ValueError, match="start with a `base` stage"):
        ctx.model_of(None)
    with pytest.raises(ValueError, match="'teacher'"):
        ctx.model_of("teacher")


del pipeline_module


def test_sft_sources_mix_generated_rows_and_retagged_sample_rows(tmp_path):
    from rlvr.tasks import reasoning

    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"prompt": "12+34=", "completion": "<think>x</think>46"}) + "\n")
    config = reasoning.ReasoningTaskConfig(digits=2, held_out_size=8)
    ctx = PipelineContext(config, reasoning.task_spec(config), None, 0, QUIET)
    ctx.outputs["s"] = {"data": str(samples)}
    rows = stages.sft_pairs(("readable:3", "no_think:2", "s", "s@think"), ctx, seed=0)
    prompts = [r["prompt"] for r in rows]
    assert len(rows) == 7 and prompts[-2:] == ["12+34=", "/think 12+34="]
    assert sum(p.startswith("/no_think") for p in prompts) == 2
    with pytest.raises(ValueError, match="unknown SFT data source 's@loud'"):
        stages.sft_pairs(("s@loud",), ctx, seed=0)


def test_the_compare_table_quotes_accuracies_with_intervals():
    from rlvr.pipelines.compare import format_table

    row = {
        "final_greedy_acc": 0.9,
        "final_sampled_acc": 0.75,
        "held_out_problems": 200,
        "steps_to_80pct": 12,
        "frac_zero_std_groups": 0.5,
        "completion_len_mean": 20.0,
        "seconds_per_step": 1.5,
        "peak_rss_mb": 900.0,
    }
    table = format_table({"grpo": row})
    assert format_interval(0.9, 200) in table and format_interval(0.75, 200) in table


def test_a_stage_naming_a_stage_that_is_not_earlier_is_refused_before_anything_runs(tmp_path):
    spec = {
        **SPEC,
        "stages": [
            {"name": "base", "kind": "base", "steps": 2},
            {"name": "rl", "kind": "grpo", "teacher": "later", "grpo": {"steps": 1}},
            {"name": "later", "kind": "base", "steps": 2},
        ],
    }
    with pytest.raises(
        ConfigError, match=r"stages\[1\] \(rl\)\.teacher: 'later' is not an earlier"
    ):
        run_pipeline(load_pipeline(write(tmp_path, spec)), tmp_path / "run", log=QUIET)
    assert not (tmp_path / "run" / "01-base").exists()  # nothing ran
