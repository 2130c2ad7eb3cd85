"""`rlvr` command line: thin wrappers that parse a config dataclass and call the library."""

from __future__ import annotations

import os

# Before torch is imported: with OpenMP's default busy-wait, two threads sharing the CPU with
# another process ran ten times slower per step (measured); passive waiting avoids that.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

import tyro  # noqa: E402

from rlvr.config import ConfigError, UserError  # noqa: E402
from rlvr.pipelines.compare import CompareConfig, run_compare  # noqa: E402
from rlvr.pipelines.dpo import DPOConfig, run_dpo  # noqa: E402
from rlvr.pipelines.evaluate import EvalConfig, run_eval  # noqa: E402
from rlvr.pipelines.lab import LabConfig, run_lab  # noqa: E402
from rlvr.pipelines.sample import SampleConfig, run_sample  # noqa: E402
from rlvr.pipelines.sft import SFTConfig, run_sft  # noqa: E402
from rlvr.train.config import GRPOConfig  # noqa: E402
from rlvr.workers import WorkerError  # noqa: E402

T = TypeVar("T")


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
    device: str = "auto"
    """Where every stage's model runs: auto (CUDA when present, else the CPU), cpu, cuda or
    cuda:N."""
    dtype: str = "auto"
    """Compute precision: auto (bfloat16 autocast on CUDA, float32 on the CPU), float32 or
    bfloat16."""
    report_to: str = "none"
    """Trackers every GRPO stage reports to as well (as `rlvr train --report-to`): none, or
    comma-separated tensorboard, wandb, trackio."""
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
    prompt: str | None = None
    """The prompt (math): an answer that only restates its expression scores 0."""
    explain: bool = False
    """Print which grading rules decided the verdict, one step a line (math)."""


@dataclass(frozen=True)
class CheckLossConfig:
    """`rlvr check-loss`: the loss identities (micro-batch and rank splits, Dr. GRPO's constant
    denominator, RLOO's n/(n-1), zero-variance groups, padding) on a GRPO config."""

    recipe: str | None = None
    """A named recipe (`rlvr recipes`): its switches fill the --grpo fields left at their
    defaults, as `rlvr train RECIPE` does."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    seed: int = 0
    """Seed of the synthetic batch and the tiny model the checks run on."""


@dataclass(frozen=True)
class RecipesConfig:
    """`rlvr recipes [show NAME]`: list the named recipes or print one's switches."""

    action: str = "list"
    """list, or show."""
    name: str | None = None
    """The recipe to show."""


@dataclass(frozen=True)
class ModelsConfig:
    """`rlvr models [list | prepare NAME | convert-gguf FILE.gguf OUT_DIR]`: real checkpoints
    that ship in pip packages as GGUF, converted once to ordinary Hugging Face directories."""

    action: tyro.conf.Positional[str] = "list"
    """list, prepare or convert-gguf."""
    args: tyro.conf.Positional[tuple[str, ...]] = ()
    """prepare: the model's name; convert-gguf: the GGUF file and the output directory."""
    cache_dir: str | None = None
    """Where `prepare` keeps converted models, under models/ (default: $RLVR_CACHE, else
    ~/.cache/rlvr)."""
    progress: bool = True
    """Show the converter's progress bars."""


def models(config: ModelsConfig) -> None:
    """`rlvr models`: list the packaged models, or convert one (its directory is printed as
    the last line, for `rlvr train --model "$(rlvr models prepare NAME | tail -n 1)"`)."""
    from rlvr.models.gguf import PACKAGED, convert_gguf, prepare
    from rlvr.pipelines.base_model import prepared_model_dir

    if config.action == "list" and not config.args:
        for name, model in PACKAGED.items():
            print(f"{name}: {model.description}; needs {model.install}")
    elif config.action == "prepare" and len(config.args) == 1:
        models_dir = prepared_model_dir(config.args[0], config.cache_dir).parent
        print(prepare(config.args[0], models_dir, progress=config.progress))
    elif config.action == "convert-gguf" and len(config.args) == 2:
        print(convert_gguf(*config.args, progress=config.progress))
    else:
        raise UserError("usage: rlvr models [list | prepare NAME | convert-gguf FILE.gguf OUT_DIR]")


@dataclass(frozen=True)
class CourseConfig:
    """`rlvr course build OUT`: the module's course (teaching document, slides, script, lab
    handout) as a static site that opens offline, every number from a committed result."""

    action: tyro.conf.Positional[str] = "build"
    """build."""
    out: tyro.conf.Positional[str | None] = None
    """The site's directory: new, empty, or written by an earlier build."""
    source: str | None = None
    """The course's sources (default: the checkout's course/)."""


def course(config: CourseConfig) -> None:
    """`rlvr course build OUT`: write the site and say where its pages are."""
    from rlvr.report.course import build

    if config.action != "build" or config.out is None:
        raise UserError("usage: rlvr course build OUT [--source DIR]")
    out = Path(config.out)
    manifest = build(out, Path(config.source) if config.source else None)
    print(
        f"[rlvr] course: {len(manifest['slides'])} slides, {len(manifest['numbers'])} numbers "
        f"from {len(manifest['results'])} results; open {out / 'index.html'}"
    )


def sample(config: SampleConfig) -> dict:
    """`rlvr sample`: rejection sampling to a JSONL file; prints and returns the summary."""
    summary = run_sample(config)
    print(json.dumps(summary))
    return summary


def sft(config: SFTConfig) -> None:
    """`rlvr sft`: fine-tune and write the run directory."""
    run_sft(config)


def compare(config: CompareConfig) -> None:
    """`rlvr compare`: one child process running the lab per recipe, then one figure and one
    table."""
    run_compare(config)


def lab(config: LabConfig) -> None:
    """`rlvr lab` / `rlvr train [RECIPE]`: the lab (`run_lab` resolves the config first)."""
    run_lab(config)


def recipes(config: RecipesConfig) -> None:
    """`rlvr recipes`: list the recipes, or show one's switches."""
    from rlvr.train.recipes import RECIPES, describe_recipe, switch_text

    if config.action == "list":
        for name in RECIPES:
            print(f"{name:12s} {switch_text(name)}")
    elif config.action == "show" and config.name:
        print(describe_recipe(config.name))
    else:
        raise UserError("usage: rlvr recipes [list | show NAME]")


def evaluate(config: EvalConfig) -> None:
    """`rlvr eval`: print a model's held-out accuracy (or its thinking-budget curve)."""
    run_eval(config)


def pipeline(config: PipelineConfig) -> None:
    """`rlvr pipeline`: list the built-ins, or run (resume) one and point at its report."""
    from rlvr.devices import resolve_precision
    from rlvr.pipelines.pipeline import builtin_pipelines, load_pipeline, run_pipeline
    from rlvr.report.run_log import RunLog

    if config.list:
        for name in builtin_pipelines():
            p = load_pipeline(name)
            print(f"{name:8s} " + " -> ".join(s.name for s in p.stages))
        return
    precision = resolve_precision(config.device, config.dtype)
    spec = load_pipeline(config.pipeline)
    out = config.out_dir or f"runs/pipeline-{spec.name}"
    log = RunLog(config.progress, to_stderr=True)
    run_pipeline(spec, out, log, config.reevaluate, precision, config.report_to)
    print(f"[rlvr] report: {out}/report.md, figure: {out}/report.png")


def check_loss(config: CheckLossConfig) -> None:
    """`rlvr check-loss`: print each identity's pass / FAIL / n/a with its numbers; exit 1 when
    any identity fails."""
    from rlvr.train.loss_checks import check_loss as run_checks
    from rlvr.train.loss_checks import format_check_results
    from rlvr.train.recipes import apply_recipe

    grpo = apply_recipe(config.recipe, config.grpo) if config.recipe else config.grpo
    results = run_checks(grpo, config.seed)
    print(format_check_results(results))
    if any(r.failed for r in results):
        raise SystemExit(1)


def dpo(config: DPOConfig) -> None:
    """`rlvr dpo`: DPO/IPO on pairs of the model's verified samples; write the run directory."""
    run_dpo(config)


def verify(config: VerifyConfig) -> None:
    """`rlvr verify`: grade one completion or a JSONL file and print why."""
    from rlvr.verifiers.files import REFERENCE_FIELD, grade_file, grade_one

    check_verify_config(config, REFERENCE_FIELD)
    if config.file is not None:
        try:
            summary = grade_file(config.file, config.verifier)
        except OSError as exc:
            raise UserError(f"{config.file}: cannot read the file ({exc.strerror})") from None
        except ValueError as exc:  # a malformed line, named by its number
            raise UserError(str(exc)) from None
        print(json.dumps(summary, indent=2))
    else:
        reward, parts = grade_one(
            config.verifier,
            config.completion,
            config.answer,
            marker=config.marker,
            prompt=config.prompt,
            explain=config.explain,
        )
        why = parts.pop("explain", None)
        print(json.dumps({"reward": reward, **parts}))
        if why:
            print(why)


def check_verify_config(config: VerifyConfig, verifiers: dict[str, str | None]) -> None:
    """Refuse an unknown --verifier and a call with nothing (or two things) to grade;
    `verifiers` maps each verifier to its reference field (None: it takes none)."""
    if config.verifier not in verifiers:
        raise ConfigError(
            f"--verifier: unknown verifier {config.verifier!r}; choose one of "
            f"{', '.join(sorted(verifiers))}"
        )
    if config.file is not None and config.completion is not None:
        raise ConfigError("pass --file FILE.jsonl or --completion TEXT, not both")
    if config.file is None and config.completion is None:
        raise ConfigError("pass --file FILE.jsonl, or --completion TEXT and --answer REFERENCE")
    if config.completion is not None and config.answer is None and verifiers[config.verifier]:
        raise ConfigError(f"--verifier {config.verifier} needs --answer, the reference")


TRAIN_USAGE = """rlvr train [RECIPE] [--grpo.* ...] [--set KEY=VALUE ...]

RECIPE is a named recipe (`rlvr recipes`): {recipes}. It is the base config that the flags
override: `rlvr train dapo --grpo.lr 3e-5`. Without one, GRPOConfig's defaults (the lab's)."""

COMMANDS = {
    "lab": (lab, LabConfig, "Build a tiny base model and watch GRPO's reward curve climb."),
    "train": (lab, LabConfig, "Train with a recipe (rlvr train dapo --grpo.lr 3e-5) on the task."),
    "recipes": (recipes, RecipesConfig, "List the named recipes, or show one's switches."),
    "compare": (compare, CompareConfig, "Run several recipes side by side: one figure, one table."),
    "eval": (evaluate, EvalConfig, "Held-out accuracy of a local model."),
    "verify": (
        verify,
        VerifyConfig,
        "Grade a completion or a JSONL file with a verifier (math, code, tool, format, weak_math).",
    ),
    "dpo": (dpo, DPOConfig, "DPO (or IPO) on (correct, wrong) pairs of the model's own samples."),
    "check-loss": (
        check_loss,
        CheckLossConfig,
        "Check the loss identities (splits, Dr. GRPO, RLOO, zero-variance groups, padding).",
    ),
    "sft": (sft, SFTConfig, "Fine-tune on prompt/completion pairs (loss on completion tokens)."),
    "sample": (sample, SampleConfig, "Rejection sampling: keep verified completions as SFT data."),
    "pipeline": (
        pipeline,
        PipelineConfig,
        "Run a multi-stage pipeline: r1-zero, r1, distill, qwen3.",
    ),
    "models": (models, ModelsConfig, "Convert a packaged real checkpoint (GGUF) to a model dir."),
    "course": (course, CourseConfig, "Build the module's course: an offline site."),
}


def main(argv: list[str] | None = None) -> None:
    """`rlvr [--debug] COMMAND [flags]`: parse the command's config and run it.

    A user error (`rlvr.config.UserError`: an unknown task, key or recipe, a wrong type, a
    malformed file, a missing model directory, an existing run directory) prints one line
    `rlvr: error: ...` to stderr and exits 2. `--debug` (anywhere on the line) or
    `RLVR_DEBUG=1` shows the exception with its traceback instead. A worker lost in another
    process (`rlvr.workers.WorkerError`) prints its name, the last checkpoint and the resume
    command on one line and exits 1.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("RLVR_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    try:
        _run_command(argv)
    except UserError as exc:
        if debug:
            raise
        message = " ".join(str(exc).split())
        print(f"rlvr: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    except WorkerError as exc:  # a lost worker: its name and the last checkpoint, exit 1
        if debug:
            raise
        print(f"rlvr: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("[rlvr] interrupted", file=sys.stderr)
        raise SystemExit(130) from None


def _run_command(argv: list[str]) -> None:
    """Dispatch `argv` (without --debug) to its command."""
    if not argv or argv[0] not in COMMANDS:
        _usage(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-file load/save bars drown rlvr's own progress
    run, config_type, text = COMMANDS[argv[0]]
    args, prog = argv[1:], f"rlvr {argv[0]}"
    if config_type is RecipesConfig:  # positional form: rlvr recipes show NAME
        config = RecipesConfig(*args[:2]) if args and not args[0].startswith("-") else None
        run(config or parse_args(RecipesConfig, args, prog))
    elif config_type is LabConfig:
        run(parse_lab(args, prog))
    else:
        run(parse_args(config_type, args, prog, description=text))


def parse_args(config_type: type[T], args: list[str], prog: str, **options: Any) -> T:
    """`tyro.cli(config_type, args=args, prog=prog, **options)`, with a parse error (a value
    of the wrong type, an unknown or missing flag) as one `UserError` line instead of tyro's
    box: its message and `see PROG --help`. --help still prints and exits 0."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            # a surrogate's flags (--grpo.surrogate.epsilon-high) work without naming its
            # subcommand, and flags may follow a subcommand (grpo.surrogate:cispo --grpo.lr 1)
            options.setdefault("config", (tyro.conf.CascadeSubcommandArgs,))
            config = tyro.cli(config_type, args=args, prog=prog, **options)
    except SystemExit as exc:
        if exc.code in (0, None):  # --help
            sys.stderr.write(captured.getvalue())
            raise
        message = tyro_error_message(captured.getvalue())
        raise UserError(f"{message} (see {prog} --help)") from None
    sys.stderr.write(captured.getvalue())  # tyro's warnings, if any
    return config


_RULE = re.compile(r"^[-\u2500]+$")  # a box's horizontal rule, plain or drawn
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BOX_EDGES = " \u2502\u256d\u256e\u2570\u256f"


def tyro_error_message(text: str) -> str:
    """The message of a tyro error box on one line: the section under its title (`Error
    parsing --grpo.lr: could not convert string to float: 'abc'`), re-joined where the box
    wrapped it; for missing required flags, the flags (`Missing from rlvr eval: --model
    STR`); and the flags of a "Perhaps you meant" section. Plain and drawn boxes alike."""
    sections: list[list[str]] = [[]]
    for line in _ANSI.sub("", text).splitlines():
        top = line.lstrip().startswith("\u256d")  # a drawn box's title is in its top edge
        line = line.strip(_BOX_EDGES)
        if _RULE.match(line):
            sections.append([])
        elif line.strip("\u2500 "):
            sections[-1].append(line.strip("\u2500 "))
        if top:
            sections.append([])
    title, body, *rest = sections + [[], []]
    if title == ["Required options"]:
        body = body[:1] + [line for line in body if line.startswith("-")]
    message = " ".join(body or title) or "could not parse the command line"
    for section in rest:
        if section and section[0].startswith("Perhaps you meant"):
            message += "; perhaps you meant " + ", ".join(s for s in section if s[0] == "-")
    return message


def _usage(argv: list[str]) -> None:
    """Print the commands and exit: 0 for --help, 2 otherwise (one line for an unknown one)."""
    names = ", ".join(COMMANDS)
    if argv and not argv[0].startswith("-"):
        raise UserError(f"unknown command {argv[0]!r}; choose one of: {names}")
    print(f"usage: rlvr [--debug] {{{names}}} [--help]\n")
    for name, (_, _, text) in COMMANDS.items():
        print(f"  {name:8s} {text}")
    raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)


def parse_lab(args: list[str], prog: str = "rlvr train") -> LabConfig:
    """`[RECIPE] [flags]` as a LabConfig: the flags applied by tyro to the recipe's config
    (`recipe_lab_config`, tyro's default instance) or to the lab's defaults. The recipe is
    applied here once; `resolve` does not apply it again, so a recipe switch given back its
    `GRPOConfig` default (`rlvr train dapo --grpo.dynamic-sampling.no-enabled`) stays set."""
    from rlvr.pipelines.lab import recipe_lab_config
    from rlvr.train.recipes import RECIPES

    old = [a for a in args if a == "--recipe" or a.startswith("--recipe=")]
    if old:
        raise UserError(
            "--recipe NAME is now a subcommand: rlvr train NAME [flags], e.g. "
            "rlvr train dapo --grpo.lr 3e-5"
        )
    recipe = args[0] if args and not args[0].startswith("-") and ":" not in args[0] else None
    default = recipe_lab_config(recipe) if recipe else LabConfig()
    description = TRAIN_USAGE.format(recipes=", ".join(RECIPES))
    return parse_args(
        LabConfig, args[1:] if recipe else args, prog, description=description, default=default
    )


if __name__ == "__main__":
    main()
