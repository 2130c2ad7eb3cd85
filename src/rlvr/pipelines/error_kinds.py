"""The pipelines' `error_kinds` stage: the kinds of earlier stages' held-out errors, and their
accuracy curves.

The error-kind analysis (`error_kind`) reads a wrong completion of the addition tasks (both
`arithmetic` and `reasoning` write column steps, then the answer) and names its kind: the
base's taught flaw (`dropped_carry`: the answer of the procedure with one or more carries
forgotten), `wrong_digit` (one digit off, not explained by a dropped carry), `format` (no
well-formed answer) or `other`. The curves are those the earlier GRPO and DPO stages logged
(held-out greedy accuracy against completions generated and wall seconds).
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError, read_yaml
from rlvr.models.tiny import load_model
from rlvr.pipelines.common import PipelineContext
from rlvr.report.run_dir import read_jsonl
from rlvr.report.stats import format_interval
from rlvr.tasks.arithmetic import ANSWER_MARKER
from rlvr.tasks.reasoning import split_think
from rlvr.train.evaluate import held_out_samples

ERROR_KINDS = ("dropped_carry", "wrong_digit", "format", "other")
_ADDITION = re.compile(r"(\d+)\+(\d+)=")


def dropped_carry_answers(a: int, b: int) -> set[str]:
    """Every answer of `a + b` done column by column with one or more carries forgotten (the
    base corpus's slip; each carry dropped or not), except the correct one."""
    da, db = [int(c) for c in reversed(str(a))], [int(c) for c in reversed(str(b))]
    width = max(len(da), len(db))
    da, db = da + [0] * (width - len(da)), db + [0] * (width - len(db))
    answers = set()
    for drops in itertools.product((False, True), repeat=width):
        digits, carry = [], 0
        for x, y, drop in zip(da, db, drops):
            carry = 0 if drop else carry
            value = x + y + carry
            digits.append(value % 10)
            carry = value // 10
        if carry:
            digits.append(carry)
        answers.add(str(int("".join(map(str, reversed(digits))))))
    return answers - {str(a + b)}


def final_answer(completion: str) -> str | None:
    """The answer a completion gives: after a well-formed think block (reasoning task), else
    after the last `####` (arithmetic task); None when there is none or it is not a number."""
    reason, _, answer = split_think(completion)
    if reason == "ok":
        text = answer.strip()
    elif ANSWER_MARKER in completion:
        text = completion.rsplit(ANSWER_MARKER, 1)[1].strip()
    else:
        return None
    return text if text.isdigit() else None


def error_kind(completion: str, row: dict[str, Any]) -> str:
    """The kind of a *wrong* completion of an addition row (`prompt` holds `A+B=`): one of
    `ERROR_KINDS` (module docstring). A row that is not an addition is `other`."""
    answer = final_answer(completion)
    if answer is None:
        return "format"
    match = _ADDITION.search(row["prompt"])
    if match is None:
        return "other"
    a, b = int(match.group(1)), int(match.group(2))
    if answer in dropped_carry_answers(a, b):
        return "dropped_carry"
    right = str(a + b)
    if len(answer) == len(right) and sum(x != y for x, y in zip(answer, right)) == 1:
        return "wrong_digit"
    return "other"


def error_shares(completions: list[str], rows: list[dict[str, Any]], scores: list[float]) -> dict:
    """`{"errors": n, "kinds": {kind: share of the n errors}}` over the rows scored below 1
    (shares are 0 when there are no errors)."""
    kinds = Counter(error_kind(c, r) for c, r, s in zip(completions, rows, scores) if s < 1.0)
    errors = sum(kinds.values())
    return {"errors": errors, "kinds": {k: kinds[k] / max(1, errors) for k in ERROR_KINDS}}


@dataclass(frozen=True)
class ErrorKindsStage:
    """The kinds of the held-out greedy errors of earlier stages' models (`error_kind`), with
    greedy accuracy and its 95% interval; and, when those stages logged a curve (GRPO and DPO
    stages), held-out greedy accuracy against completions generated and wall seconds."""

    models: tuple[str, ...] = ()
    """Stages whose models are analysed, in order (e.g. [base, dpo, dpo-iterated, grpo])."""


def run_error_kinds_stage(
    s: ErrorKindsStage, ctx: PipelineContext, stage_dir: Path
) -> dict[str, str]:
    """error_kinds.json, error_kinds.md (one table) and, with curves, curves.json/curves.png."""
    if not s.models:
        raise ConfigError("models: name at least one earlier stage")
    rows = ctx.task.held_out_rows()
    table = []
    for name in s.models:
        model, tokenizer = load_model(ctx.model_of(name), device=ctx.precision.device)
        samples = held_out_samples(model, tokenizer, rows, ctx.task.score, ctx.task.max_new_tokens)
        completions = [c for (c,) in samples.completions]
        scores = [sc for (sc,) in samples.scores]
        table.append(
            {
                "stage": name,
                "greedy_acc": samples.accuracy,
                **error_shares(completions, rows, scores),
            }
        )
    (stage_dir / "error_kinds.json").write_text(json.dumps(table, indent=2))
    (stage_dir / "error_kinds.md").write_text(format_error_table(table, len(rows)) + "\n")
    outputs = {"data": str(stage_dir / "error_kinds.json")}
    curves = {name: _curve(stage_dir.parent, name) for name in s.models}
    curves = {k: v for k, v in curves.items() if v}
    if curves:
        (stage_dir / "curves.json").write_text(json.dumps(curves, indent=2))
        outputs["figure"] = str(plot_curves(curves, stage_dir / "curves.png"))
    return outputs


def format_error_table(table: list[dict[str, Any]], problems: int) -> str:
    """A markdown table: stage, greedy accuracy with its 95% interval, errors, kind shares."""
    lines = [
        "| model | greedy acc [95% CI] | errors | " + " | ".join(ERROR_KINDS) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in ERROR_KINDS) + " |",
    ]
    for row in table:
        shares = " | ".join(f"{row['kinds'][k]:.2f}" for k in ERROR_KINDS)
        acc = format_interval(row["greedy_acc"], problems)
        lines.append(f"| {row['stage']} | {acc} | {row['errors']} | {shares} |")
    return "\n".join(lines)


def _curve(pipeline_dir: Path, stage: str) -> list[dict[str, float]]:
    """The held-out greedy curve of an earlier GRPO or DPO stage (from its metrics.jsonl):
    points {step, completions, seconds, greedy_acc}; [] for a stage that logged none.
    A GRPO stage generates prompts_per_step x group_size completions a step."""
    dirs = sorted(pipeline_dir.glob(f"[0-9][0-9]-{stage}"))
    if not dirs:
        return []
    grpo, dpo = dirs[-1] / "grpo" / "metrics.jsonl", dirs[-1] / "dpo" / "metrics.jsonl"
    if dpo.exists():
        records, per_step = read_jsonl(dpo), None
    elif grpo.exists():
        settings = (read_yaml(dirs[-1] / "config.yaml") or {}).get("grpo", {})
        records, per_step = read_jsonl(grpo), settings["prompts_per_step"] * settings["group_size"]
    else:
        return []
    points = []
    for r in records:
        if "eval/greedy_acc" in r:
            done = r["completions"] if per_step is None else r["step"] * per_step
            seconds = r.get("time/elapsed_s", 0.0)
            points.append(
                {
                    "step": r["step"],
                    "completions": done,
                    "seconds": seconds,
                    "greedy_acc": r["eval/greedy_acc"],
                }
            )
    return points


def plot_curves(curves: dict[str, list[dict[str, float]]], path: Path) -> Path:
    """Held-out greedy accuracy against completions generated (left) and wall seconds (right),
    one line per stage; returns `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for name, points in curves.items():
        for ax, x in zip(axes, ("completions", "seconds")):
            ax.plot([p[x] for p in points], [p["greedy_acc"] for p in points], "o-", label=name)
    axes[0].set_xlabel("completions generated for training")
    axes[1].set_xlabel("wall seconds (training and its evaluations)")
    axes[0].set_ylabel("held-out greedy accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
