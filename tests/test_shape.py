"""The shape the second restructure promised (issue 25), checked on the source itself:

- `grpo_step` reads top to bottom: at most 140 lines and 10 branches, no config read, no
  teacher parameter (the teacher lives in the Learner);
- LoRA's special cases live in `train/lora_state.py` (and the strategy that refuses LoRA on
  several ranks): no other train/ module tests `is_lora` or `reference_is_base`;
- `GRPOConfig` holds at most 45 fields: each component owns its settings.

(The layout's `sharded` is checked in tests/test_strategy.py, the loop's config reads in
tests/test_config_plans.py, import circles by scripts/check_cycles.py.)
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from pathlib import Path

import rlvr.train
from rlvr.train.config import GRPOConfig
from rlvr.train.grpo import grpo_step

TRAIN = Path(rlvr.train.__file__).parent
BRANCHES = (ast.If, ast.IfExp, ast.For, ast.While, ast.Try, ast.Match, ast.comprehension)


def _step_tree() -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(grpo_step)))
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def test_the_step_is_short_and_has_few_branches():
    step = _step_tree()
    lines = step.end_lineno - step.lineno + 1
    branches = sum(isinstance(n, BRANCHES) for n in ast.walk(step))
    assert lines <= 140, f"grpo_step has {lines} lines"
    assert branches <= 10, f"grpo_step has {branches} branches"


def test_the_step_reads_no_config_and_takes_no_teacher():
    step = _step_tree()
    names = {n.id for n in ast.walk(step) if isinstance(n, ast.Name)}
    params = [a.arg for a in step.args.args]
    assert "config" not in names and "config" not in params
    assert "teacher" not in params


def _lora_branches(path: Path) -> list[str]:
    """The conditions in `path` that test for LoRA (`is_lora(...)`, `reference_is_base`)."""
    tests = [
        ast.unparse(n.test)
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.If | ast.IfExp | ast.While | ast.Assert)
    ]
    return [t for t in tests if "is_lora" in t or "reference_is_base" in t]


def test_only_the_lora_module_branches_on_lora():
    allowed = {"lora_state.py", "strategy.py"}
    offenders = {
        path.name: _lora_branches(path)
        for path in sorted(TRAIN.glob("*.py"))
        if path.name not in allowed and _lora_branches(path)
    }
    assert offenders == {}


def test_grpo_config_has_at_most_45_fields():
    assert len(dataclasses.fields(GRPOConfig)) <= 45
