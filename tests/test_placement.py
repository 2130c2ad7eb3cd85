"""`--engine`, `--ray`, `--rollout-workers`, `--ray-address`: impossible combinations are one
line before any model loads; the in-process default stays the loop's own engine."""

import pytest

from rlvr.devices import resolve_precision
from rlvr.pipelines.engines import RolloutPlacement, build_engine
from tests.test_cli import cli_error

LAB = ["lab", "--run-name", "x"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--engine", "sglang"], "--engine must be one of hf, vllm, got 'sglang'"),
        (["--ray", "--rollout-workers", "0"], "--rollout-workers must be >= 1, got 0"),
        (["--ray-address", "auto"], "--ray-address joins a Ray cluster for rollout workers"),
        (["--ray", "--placement", "nearby"], "--placement must be one of separate, colocated"),
        (["--ray", "--lora.rank", "4"], "--ray loads the policy's full weights"),
        (["--engine", "vllm", "--lora.rank", "4"], "--engine vllm loads the policy's full"),
    ],
)
def test_impossible_placements_are_one_line(flags, message, tmp_path, capsys):
    args = [*LAB, "--runs-dir", str(tmp_path), *flags]
    assert cli_error(args, capsys).startswith(message)
    assert not any(tmp_path.iterdir())  # refused before the run directory was made


def test_the_default_placement_leaves_the_engine_to_the_loop(tmp_path):
    engine = build_engine(
        RolloutPlacement(), None, None, tmp_path, resolve_precision("cpu"), 0, 60.0
    )
    assert engine is None
