"""`rlvr` command line: thin wrappers that parse a config dataclass and call the library."""

from __future__ import annotations

import os

# Before torch is imported: with OpenMP's default busy-wait, two threads sharing the CPU with
# another process ran ten times slower per step (measured); passive waiting avoids that.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import tyro  # noqa: E402

from rlvr.pipelines.lab import LabConfig, run_lab  # noqa: E402
from rlvr.pipelines.sample import SampleConfig, run_sample  # noqa: E402
from rlvr.pipelines.sft import SFTConfig, run_sft  # noqa: E402
from rlvr.tasks.arithmetic import ArithmeticTaskConfig  # noqa: E402
from rlvr.tasks.reasoning import ReasoningTaskConfig  # noqa: E402


@dataclass(frozen=True)
class EvalConfig:
    """`rlvr eval`: held-out accuracy of a local model on a task."""

    model: str
    """A local Hugging Face model directory (for example runs/lab/model)."""
    task: str = "arithmetic"
    """arithmetic, code or tool."""
    max_new_tokens: int | None = None
    """Completion budget in tokens (None: the task's own)."""
    temperature: float = 0.0
    """0 is greedy; > 0 gives sampled pass@1 at that temperature."""
    num_samples: int = 1
    """Completions per problem (averaged) when sampling."""
    seed: int = 0
    """Sampling seed."""
    arithmetic: ArithmeticTaskConfig = field(default_factory=ArithmeticTaskConfig)
    reasoning: ReasoningTaskConfig = field(default_factory=ReasoningTaskConfig)
    mode: str = "default"
    """reasoning task: the thinking mode of the prompts (default, think or no_think)."""
    thinking_budget: str | None = None
    """reasoning task: comma-separated budgets in thinking tokens, e.g. 0,8,16,32,none; prints
    accuracy and tokens per budget and writes the curve's figure to --out."""
    out: str = "thinking_budget.png"
    """Where --thinking-budget writes its figure (a .json of the curve goes beside it)."""


@dataclass(frozen=True)
class PipelineConfig:
    """`rlvr pipeline NAME|FILE.yaml`: run (or resume) a multi-stage pipeline."""

    pipeline: tyro.conf.Positional[str] = "r1"
    """A built-in pipeline (r1-zero, r1, distill, qwen3) or a YAML file of stages."""
    out_dir: str | None = None
    """Where stage directories and the report go (default: runs/pipeline-NAME). Running again
    skips finished stages."""
    list: bool = False
    """List the built-in pipelines and their stages, then exit."""
    reevaluate: bool = False
    """Evaluate the models of finished stages again (e.g. after changing the evaluation)."""
    progress: bool = True
    """Show progress bars."""


@dataclass(frozen=True)
class VerifyConfig:
    """`rlvr verify`: grade one completion, or a JSONL file of them, and say why."""

    file: str | None = None
    """A JSONL file: one object per line with "completion" and the reference ("answer", or
    "tests" for --verifier code). Prints a summary by reason."""
    completion: str | None = None
    """One completion to grade (instead of --file)."""
    answer: str | None = None
    """Its reference answer."""
    verifier: str = "math"
    """math, code, tool, format or weak_math."""
    marker: str = "####"
    """The final-answer marker (math)."""


@dataclass(frozen=True)
class RecipesConfig:
    """`rlvr recipes [show NAME]`: list the named recipes or print one's switches."""

    action: str = "list"
    """list, or show."""
    name: str | None = None
    """The recipe to show."""


@dataclass(frozen=True)
class CompareConfig:
    """`rlvr compare`: several recipes on the same task, base model, seed and budget."""

    recipes: str = "grpo,rloo,dr_grpo,dapo,gspo"
    """Comma-separated recipe names (see `rlvr recipes`)."""
    name: str = "compare"
    """The comparison's directory under --runs-dir (each recipe gets NAME-RECIPE beside it)."""
    runs_dir: str = "runs"
    """Where run directories are created."""
    steps: int = 60
    """Steps per recipe."""
    seed: int = 0
    """The same seed for every recipe."""
    train_args: str = ""
    """Further arguments for every `rlvr train`, e.g. "--model DIR --arithmetic.digits 2"."""


def sample(config: SampleConfig) -> dict:
    """`rlvr sample`: rejection sampling to a JSONL file; prints and returns the summary."""
    summary = run_sample(config)
    print(json.dumps(summary))
    return summary


def sft(config: SFTConfig) -> None:
    """`rlvr sft`: fine-tune and write the run directory."""
    run_sft(config)


def compare(config: CompareConfig) -> None:
    """`rlvr compare`: one `rlvr train` per recipe, then one figure and one table."""
    import shlex

    from rlvr.pipelines.compare import compare_recipes

    args = [
        "--grpo.steps",
        str(config.steps),
        "--seed",
        str(config.seed),
        "--overwrite",
        "--no-progress",
        *shlex.split(config.train_args),
    ]
    recipes = [r.strip() for r in config.recipes.split(",") if r.strip()]
    compare_recipes(recipes, config.runs_dir, config.name, args)


def lab(config: LabConfig) -> None:
    """`rlvr lab` / `rlvr train`: the lab with the `--set` overrides applied."""
    run_lab(resolve_switches(config))


def resolve_switches(config: LabConfig) -> LabConfig:
    """Apply `--set key=value` overrides to the GRPO switches (unknown keys name valid ones)."""
    from rlvr.config import apply_overrides

    if not config.set:
        return config
    return dataclasses.replace(config, grpo=apply_overrides(config.grpo, list(config.set)))


def recipes(config: RecipesConfig) -> None:
    """`rlvr recipes`: list the recipes, or show one's switches."""
    from rlvr.train.recipes import RECIPES, describe_recipe

    if config.action == "list":
        for name, switches in RECIPES.items():
            print(f"{name:12s} {', '.join(f'{k}={v}' for k, v in switches.items())}")
    elif config.action == "show" and config.name:
        print(describe_recipe(config.name))
    else:
        raise SystemExit("usage: rlvr recipes [list | show NAME]")


def evaluate(config: EvalConfig) -> None:
    """`rlvr eval`: print a model's held-out accuracy (or its thinking-budget curve)."""
    from rlvr.models.tiny import load_model
    from rlvr.tasks.registry import build_task
    from rlvr.train.evaluate import held_out_accuracy

    task = build_task(config.task, config.arithmetic, config.reasoning)
    model, tokenizer = load_model(config.model)
    rows = task.held_out_rows()
    if config.task == "reasoning":
        from rlvr.tasks.reasoning import set_mode

        rows = [{**r, "prompt": set_mode(r["prompt"], config.mode)} for r in rows]
    if config.thinking_budget is not None:
        _thinking_budget(config, model, tokenizer, rows, task)
        return
    accuracy = held_out_accuracy(
        model,
        tokenizer,
        rows,
        task.score,
        config.max_new_tokens or task.max_new_tokens,
        temperature=config.temperature,
        num_samples=config.num_samples,
        seed=config.seed,
    )
    mode = "greedy" if config.temperature == 0 else f"sampled at T={config.temperature}"
    result = {
        "model": config.model,
        "task": config.task,
        "mode": mode,
        "problems": len(rows),
        "accuracy": accuracy,
    }
    print(json.dumps(result))


def _thinking_budget(config: EvalConfig, model, tokenizer, rows, task) -> None:
    """`rlvr eval --thinking-budget`: print the curve's table, write its figure and json."""
    from pathlib import Path

    from rlvr.report.plots import format_table, plot_thinking_budget
    from rlvr.train.evaluate import thinking_budget_curve

    if config.task != "reasoning":
        raise SystemExit("rlvr eval: --thinking-budget needs --task reasoning (a <think> task)")
    try:
        budgets = [
            None if b.strip().lower() == "none" else int(b)
            for b in config.thinking_budget.split(",")
        ]
    except ValueError:
        raise SystemExit(
            f"rlvr eval: --thinking-budget expects numbers and 'none' separated by commas, got "
            f"{config.thinking_budget!r}"
        ) from None
    curve = thinking_budget_curve(
        model,
        tokenizer,
        rows,
        task.score,
        budgets=budgets,
        temperature=config.temperature,
        num_samples=config.num_samples,
        seed=config.seed,
    )
    print(format_table(curve))
    figure = plot_thinking_budget(curve, config.out, title=f"thinking budget: {config.model}")
    Path(figure).with_suffix(".json").write_text(json.dumps(curve, indent=2))
    print(f"[rlvr] figure: {figure}")


def pipeline(config: PipelineConfig) -> None:
    """`rlvr pipeline`: list the built-ins, or run (resume) one and point at its report."""
    from rlvr.pipelines.pipeline import builtin_pipelines, load_pipeline, run_pipeline

    if config.list:
        for name in builtin_pipelines():
            p = load_pipeline(name)
            print(f"{name:8s} " + " -> ".join(s.name for s in p.stages))
        return
    spec = load_pipeline(config.pipeline)
    out = config.out_dir or f"runs/pipeline-{spec.name}"
    run_pipeline(spec, out, progress=config.progress, reevaluate=config.reevaluate)
    print(f"[rlvr] report: {out}/report.md, figure: {out}/report.png")


def verify(config: VerifyConfig) -> None:
    """`rlvr verify`: grade one completion or a JSONL file and print why."""
    from rlvr.verifiers.files import grade_file, grade_one

    if config.file is not None:
        print(json.dumps(grade_file(config.file, config.verifier), indent=2))
    elif config.completion is not None:
        reward, parts = grade_one(
            config.verifier, config.completion, config.answer, marker=config.marker
        )
        print(json.dumps({"reward": reward, **parts}))
    else:
        raise SystemExit("rlvr verify: pass --file FILE.jsonl, or --completion and --answer")


COMMANDS = {
    "lab": (lab, LabConfig, "Build a tiny base model and watch GRPO's reward curve climb."),
    "train": (lab, LabConfig, "Train with a recipe (--recipe dapo --set key=value) on the task."),
    "recipes": (recipes, RecipesConfig, "List the named recipes, or show one's switches."),
    "compare": (compare, CompareConfig, "Run several recipes side by side: one figure, one table."),
    "eval": (evaluate, EvalConfig, "Held-out accuracy of a local model."),
    "verify": (verify, VerifyConfig, "Grade one completion with the strict math verifier."),
    "sft": (sft, SFTConfig, "Fine-tune on prompt/completion pairs (loss on completion tokens)."),
    "sample": (sample, SampleConfig, "Rejection sampling: keep verified completions as SFT data."),
    "pipeline": (
        pipeline,
        PipelineConfig,
        "Run a multi-stage pipeline: r1-zero, r1, distill, qwen3.",
    ),
}


def main(argv: list[str] | None = None) -> None:
    """`rlvr COMMAND [flags]`: parse the command's config and run it."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(COMMANDS)
        if argv and not argv[0].startswith("-"):
            print(f"rlvr: unknown command {argv[0]!r}; choose one of: {names}", file=sys.stderr)
            raise SystemExit(2)
        print(f"usage: rlvr {{{names}}} [--help]\n")
        for name, (_, _, text) in COMMANDS.items():
            print(f"  {name:8s} {text}")
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-file load/save bars drown rlvr's own progress
    run, config_type, text = COMMANDS[argv[0]]
    args = argv[1:]
    if config_type is RecipesConfig:  # positional form: rlvr recipes show NAME
        config = RecipesConfig(*args[:2]) if args and not args[0].startswith("-") else None
        run(config or tyro.cli(RecipesConfig, args=args, prog="rlvr recipes"))
        return
    if config_type is LabConfig and "--resume" in args:
        config = _resume_config(args)
        print(f"[rlvr] resuming {config.runs_dir}/{config.run_name} with its saved config.yaml")
        try:
            run(config)
        except KeyboardInterrupt:
            print("[rlvr] interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        return
    default = None
    if config_type is LabConfig:
        default = _recipe_default(args)
    config = tyro.cli(
        config_type, args=args, prog=f"rlvr {argv[0]}", description=text, default=default
    )
    try:
        run(config)
    except KeyboardInterrupt:
        print("[rlvr] interrupted", file=sys.stderr)
        raise SystemExit(130) from None


def _resume_config(args: list[str]) -> LabConfig:
    """`--resume [RUN_DIR]`: the run's own saved config, with resume on.

    The run is RUN_DIR, or --runs-dir/--run-name (default runs/lab). Other flags would be
    silently ignored, so they are refused.
    """
    import pathlib

    import yaml

    from rlvr.config import config_from_dict

    rest, runs_dir, run_name, progress = list(args), "runs", "lab", True
    i = rest.index("--resume")
    rest.pop(i)
    if i < len(rest) and not rest[i].startswith("-"):
        path = pathlib.Path(rest.pop(i))
        runs_dir, run_name = str(path.parent), path.name
    for flag in ("--runs-dir", "--run-name"):
        if flag in rest:
            j = rest.index(flag)
            value = rest[j + 1] if j + 1 < len(rest) else ""
            del rest[j : j + 2]
            runs_dir, run_name = (value, run_name) if flag == "--runs-dir" else (runs_dir, value)
    for flag in ("--progress", "--no-progress"):
        if flag in rest:
            rest.remove(flag)
            progress = flag == "--progress"
    if rest:
        raise ValueError(
            f"--resume continues a run with its saved config.yaml; these flags would be "
            f"ignored, so they are refused: {' '.join(rest)}"
        )
    saved = pathlib.Path(runs_dir) / run_name / "config.yaml"
    if not saved.exists():
        raise FileNotFoundError(f"{saved.parent} has no config.yaml: nothing to resume")
    config = config_from_dict(LabConfig, yaml.safe_load(saved.read_text()))
    return dataclasses.replace(
        config, runs_dir=runs_dir, run_name=run_name, resume=True, progress=progress
    )


def _recipe_default(args: list[str]) -> LabConfig | None:
    """A LabConfig whose GRPO switches come from `--recipe NAME`, so --grpo.* flags still win."""
    from rlvr.train.recipes import recipe_config

    for i, arg in enumerate(args):
        if arg == "--recipe" and i + 1 < len(args):
            name = args[i + 1]
        elif arg.startswith("--recipe="):
            name = arg.split("=", 1)[1]
        else:
            continue
        return LabConfig(recipe=name, grpo=recipe_config(name))
    return None


if __name__ == "__main__":
    main()
