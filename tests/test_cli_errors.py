"""Every command through a table of bad inputs: each is one `rlvr: error:` line on stderr and
exit 2, no traceback, nothing written (no run directory, no cache, no output file), and no
model built, loaded or trained (issue 23: the checks run before any work)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import rlvr.cli
import rlvr.models.tiny
import rlvr.pipelines.pipeline  # noqa: F401  (imported for `forbid_models`: the CLI defers it)
import rlvr.train.sft

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FORBIDDEN = (
    rlvr.models.tiny.load_model,
    rlvr.models.tiny.build_tiny_model,
    rlvr.train.sft.train_next_token,
)
"""Building, loading or training a model: none of them may run for a bad input."""


def _verl_rows(source: str) -> list[dict]:
    """Rows in verl's layout (no solution column: a base model cannot be trained on them)."""
    return [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": f"What is {i}+{i}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
        }
        for i in range(12)
    ]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bad (and a few good) input files the table names as {in}/NAME."""
    d = tmp_path_factory.mktemp("inputs")
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(12)]
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = [{"prompt": r["prompt"], "completion": r["answer"]} for r in rows]
    (d / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (d / "broken.jsonl").write_text('{"prompt": "1+1=", "answer": \n')
    (d / "noanswer.jsonl").write_text('{"prompt": "1+1="}\n')
    (d / "empty.jsonl").write_text("")
    (d / "broken.json").write_text('[{"prompt": "1+1=", "answer": "2"},\n')
    (d / "scalars.json").write_text("[1, 2]\n")
    (d / "empty.json").write_text("")
    (d / "empty.parquet").write_bytes(b"")
    (d / "text.parquet").write_text("not a parquet file\n")
    pq.write_table(pa.Table.from_pylist(_verl_rows("openai/gsm8k")), d / "verl.parquet")
    pq.write_table(pa.Table.from_pylist(_verl_rows("no/such-source")), d / "unknown.parquet")
    (d / "notadataset").mkdir()
    (d / "notadataset" / "readme.txt").write_text("not saved by datasets\n")
    (d / "empty_dir").mkdir()
    (d / "fake_model").mkdir()  # the files a model directory has (never loaded)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (d / "fake_model" / name).write_text("{}")
    (d / "runs" / "lab").mkdir(parents=True)
    (d / "runs" / "lab" / "metrics.jsonl").write_text("")
    (d / "badrun").mkdir()
    (d / "badrun" / "config.yaml").write_text("grpo: {lr: [1\n")
    (d / "exists.jsonl").write_text("")
    (d / "bad.yaml").write_text("stages: [{name: a, kind: base, steps: 3\n")
    (d / "negative.yaml").write_text(
        "stages:\n  - {name: base, kind: base, steps: 3}\n"
        "  - {name: rl, kind: grpo, grpo: {steps: -1}}\n"
    )
    (d / "base0.yaml").write_text("stages:\n  - {name: base, kind: base, steps: 0}\n")
    return d


# (id, argv with {in} for the inputs directory, a part of the message that must be there)
CASES = [
    # --- train / lab: each flag's type and range --------------------------------------------
    ("lr-not-a-number", "train --grpo.lr abc", "--grpo.lr"),
    ("steps-missing-value", "train --grpo.steps", "--grpo.steps"),
    ("unknown-flag", "train --grop.lr 1e-4", "perhaps you meant --grpo.lr"),
    ("stray-argument", "lab --grpo.lr 1e-4 extra", "extra"),
    ("negative-steps", "train --grpo.steps -1", "steps"),
    ("group-size-0", "train --grpo.group-size 0", "group_size"),
    ("group-size-0-reinforce", "train reinforce++ --grpo.group-size 0", "group_size"),
    ("temperature-negative", "train --grpo.temperature -0.5", "temperature"),
    ("lr-negative", "train --grpo.lr -1e-4", "lr"),
    ("grad-clip-0", "train --grpo.grad-clip 0", "grad_clip"),
    ("epsilon-negative", "train --grpo.surrogate.epsilon-low -0.1", "surrogate.epsilon_low"),
    ("epsilon-low-above-1", "train --grpo.surrogate.epsilon-low 1.5", "surrogate.epsilon_low"),
    (
        "correction-band-inverted",
        "train --grpo.rollout-correction.mode icepop --grpo.rollout-correction.low 3 "
        "--grpo.rollout-correction.cap 2",
        "rollout_correction.low",
    ),
    ("max-new-tokens-0", "train --grpo.max-new-tokens 0", "max_new_tokens"),
    ("keep-checkpoints-0", "train --grpo.keep-checkpoints 0", "keep_checkpoints"),
    ("ref-sync-alpha-2", "train --grpo.ref-sync-alpha 2", "ref_sync_alpha"),
    ("gamma-above-1", "train ppo --grpo.critic.gamma 1.5", "critic.gamma"),
    ("set-wrong-type", "train --set group_size=eight", "group_size"),
    ("set-unknown-key", "train --set epsilon_lo=0.1", "epsilon_lo"),
    ("set-old-flat-name", "train --set cispo_epsilon_high=2", "surrogate.epsilon_high"),
    ("set-clip-of-another", "train cispo --set surrogate.clip_ratio_c=3", "ppo-clip"),
    ("set-unknown-surrogate", "train --set surrogate=pgo", "ppo-clip, cispo, gmpo"),
    ("old-flat-flag", "train --grpo.epsilon-high 0.3", "--grpo.epsilon-high"),
    ("clip-of-another-flag", "train cispo --grpo.surrogate.clip-ratio-c 3", "clip-ratio-c"),
    ("threads-0", "train --threads 0", "--threads"),
    ("few-shot-negative", "train --few-shot -1", "--few-shot"),
    ("eval-samples-0", "train --eval-samples 0", "--eval-samples"),
    ("base-steps-0", "train --base.steps 0", "--base.steps"),
    ("flaw-prob-above-1", "train --base.flaw-prob 1.5", "--base.flaw-prob"),
    ("base-lr-negative", "train --base.lr -1", "--base.lr"),
    ("tiny-width-zero", "train --tiny.hidden-size 0", "--tiny.hidden-size"),
    ("tiny-no-layers", "lab --tiny.num-layers 0", "--tiny.num-layers"),
    ("tiny-heads-uneven", "lab --tiny.num-heads 3", "--tiny.num-heads"),
    ("tiny-mlp-zero", "lab --tiny.intermediate-size 0", "--tiny.intermediate-size"),
    ("tiny-too-short", "lab --tiny.max-positions 4", "--tiny.max-positions"),
    ("dpo-tiny-heads-uneven", "dpo --tiny.num-heads 3", "--tiny.num-heads"),
    ("unknown-device", "train --device tpu", "--device"),
    ("unknown-dtype", "train --dtype float8", "--dtype"),
    # --- train: names that name nothing -----------------------------------------------------
    ("unknown-task", "train --task poetry", "poetry"),
    ("unknown-recipe", "train dapoo", "dapoo"),
    ("old-recipe-flag", "train --recipe dapo", "rlvr train dapo"),
    ("unknown-engine", "train --engine sglang", "--engine"),
    ("unknown-tracker", "train --report-to mlflow", "mlflow"),
    ("unknown-surrogate", "lab grpo.surrogate:nope", "grpo.surrogate:nope"),
    ("unknown-verifier", "train --verifier lenient", "lenient"),
    ("unknown-data-source", "train --task {in}/unknown.parquet --model {in}/empty_dir", "source"),
    ("unknown-gym-task", "train --task reasoning_gym:no_such_generator", "no_such_generator"),
    # --- train: files of each layout --------------------------------------------------------
    ("jsonl-missing", "train --task {in}/missing.jsonl", "missing.jsonl"),
    ("jsonl-empty", "train --task {in}/empty.jsonl", "empty.jsonl"),
    ("jsonl-malformed", "train --task {in}/broken.jsonl", "broken.jsonl:1"),
    ("jsonl-no-answer", "train --task {in}/noanswer.jsonl", "answer"),
    ("json-malformed", "train --task {in}/broken.json", "broken.json"),
    ("json-not-objects", "train --task {in}/scalars.json", "scalars.json"),
    ("json-empty", "train --task {in}/empty.json", "empty.json"),
    ("parquet-missing", "train --task {in}/missing.parquet", "missing.parquet"),
    ("parquet-empty", "train --task {in}/empty.parquet", "empty.parquet"),
    ("parquet-malformed", "train --task {in}/text.parquet", "text.parquet"),
    ("not-a-saved-dataset", "train --task {in}/notadataset", "notadataset"),
    ("verl-file-without-model", "train --task {in}/verl.parquet", "--model"),
    ("columns-unknown", "train --task {in}/verl.parquet --columns prompt=nope", "nope"),
    # --- train: incompatible switches, models and run directories ---------------------------
    ("columns-without-file", "train --columns prompt=q", "--columns"),
    ("weak-verifier-on-code", "train --task code --verifier weak", "weak"),
    ("ray-address-without-ray", "train --ray-address auto", "--ray"),
    ("lora-with-vllm", "train --lora.rank 4 --engine vllm", "--lora.rank"),
    ("async-without-correction", "train --grpo.async-steps 1", "rollout_correction.mode"),
    ("distill-coef-without-teacher", "train --grpo.distill.kl-coef 2", "distill.teacher"),
    (
        "teacher-not-a-model",
        "train --grpo.distill.teacher {in}/empty_dir",
        "--grpo.distill.teacher",
    ),
    ("model-not-a-model", "train --model {in}/empty_dir", "config.json"),
    ("model-missing", "train --model {in}/no_such_model", "no_such_model"),
    ("run-directory-exists", "train --runs-dir {in}/runs", "--overwrite"),
    ("resume-no-run", "train --resume {in}/empty_dir", "config.yaml"),
    ("resume-bad-config", "train --resume {in}/badrun", "config.yaml"),
    # --- eval ---------------------------------------------------------------------------------
    ("eval-without-model", "eval", "--model"),
    ("eval-not-a-model", "eval --model {in}/empty_dir", "config.json"),
    ("eval-unknown-task", "eval --model {in}/empty_dir --task poetry", "poetry"),
    ("eval-num-samples-0", "eval --model {in}/empty_dir --num-samples 0", "--num-samples"),
    ("eval-temperature-negative", "eval --model {in}/empty_dir --temperature -1", "--temperature"),
    ("eval-budget-needs-reasoning", "eval --model {in}/empty_dir --thinking-budget 8", "reasoning"),
    (
        "eval-budget-not-numbers",
        "eval --model {in}/empty_dir --task reasoning --thinking-budget 8,lots",
        "--thinking-budget",
    ),
    ("eval-unknown-mode", "eval --model {in}/empty_dir --task reasoning --mode loud", "--mode"),
    ("eval-few-shot-negative", "eval --model {in}/empty_dir --few-shot -2", "--few-shot"),
    ("eval-parquet-malformed", "eval --model {in}/empty_dir --task {in}/text.parquet", "text"),
    # --- verify -------------------------------------------------------------------------------
    ("verify-unknown-verifier", "verify --completion x --answer 1 --verifier nope", "nope"),
    ("verify-nothing-to-grade", "verify", "--completion"),
    ("verify-no-answer", "verify --completion x", "--answer"),
    ("verify-file-missing", "verify --file {in}/missing.jsonl", "missing.jsonl"),
    ("verify-file-malformed", "verify --file {in}/broken.jsonl", "broken.jsonl:1"),
    ("verify-file-and-completion", "verify --file {in}/rows.jsonl --completion x", "--file"),
    # --- sft ----------------------------------------------------------------------------------
    ("sft-no-data", "sft", "--data"),
    ("sft-data-missing", "sft --data {in}/missing.jsonl", "missing.jsonl"),
    ("sft-data-empty", "sft --data {in}/empty.jsonl", "empty.jsonl"),
    ("sft-data-malformed", "sft --data {in}/broken.jsonl", "broken.jsonl:1"),
    ("sft-task-without-steps", "sft --task arithmetic", "--steps"),
    (
        "sft-held-out-too-large",
        "sft --task arithmetic --steps 2 --arithmetic.digits 1",
        "--arithmetic.held-out-size 200",
    ),
    ("sft-batch-size-0", "sft --data {in}/pairs.jsonl --batch-size 0", "batch_size"),
    ("sft-lr-negative", "sft --data {in}/pairs.jsonl --lr -1", "--lr"),
    ("sft-not-a-model", "sft --data {in}/pairs.jsonl --model {in}/empty_dir", "config.json"),
    ("sft-eval-data-missing", "sft --data {in}/pairs.jsonl --eval-data {in}/no.jsonl", "no.jsonl"),
    ("sft-unknown-tracker", "sft --data {in}/pairs.jsonl --report-to mlflow", "mlflow"),
    ("sft-run-exists", "sft --data {in}/pairs.jsonl --run-dir {in}/runs/lab", "--overwrite"),
    # --- dpo ----------------------------------------------------------------------------------
    ("dpo-beta-0", "dpo --beta 0", "--beta"),
    ("dpo-unknown-loss", "dpo --loss-type hinge", "--loss-type"),
    ("dpo-not-a-model", "dpo --model {in}/empty_dir", "config.json"),
    ("dpo-unknown-task", "dpo --task poetry", "poetry"),
    ("dpo-verl-file-without-model", "dpo --task {in}/verl.parquet", "--model"),
    ("dpo-run-exists", "dpo --model {in}/fake_model --run-dir {in}/runs/lab", "--overwrite"),
    # --- sample -------------------------------------------------------------------------------
    ("sample-without-output", "sample --model {in}/empty_dir", "--output"),
    ("sample-output-exists", "sample --model {in}/empty_dir --output {in}/exists.jsonl", "exists"),
    (
        "sample-unknown-task",
        "sample --model {in}/empty_dir --output out.jsonl --task poetry",
        "poetry",
    ),
    ("sample-not-a-model", "sample --model {in}/empty_dir --output out.jsonl", "config.json"),
    (
        "sample-unknown-verifier",
        "sample --model {in}/empty_dir --output out.jsonl --task {in}/rows.jsonl --verifier x",
        "--verifier",
    ),
    (
        "sample-num-prompts-0",
        "sample --model {in}/empty_dir --output out.jsonl --num-prompts 0",
        "--num-prompts",
    ),
    # --- pipeline -----------------------------------------------------------------------------
    ("pipeline-unknown", "pipeline r2", "r2"),
    ("pipeline-invalid-yaml", "pipeline {in}/bad.yaml", "bad.yaml"),
    ("pipeline-negative-steps", "pipeline {in}/negative.yaml", "steps"),
    ("pipeline-base-steps-0", "pipeline {in}/base0.yaml", "steps"),
    ("pipeline-unknown-tracker", "pipeline r1 --report-to mlflow", "mlflow"),
    ("pipeline-unknown-device", "pipeline r1 --device tpu", "--device"),
    # --- compare, recipes, models, check-loss, the command itself ------------------------------
    ("compare-unknown-recipe", "compare --recipes grpo,nope", "nope"),
    ("compare-bad-train-setting", "compare --recipes grpo --train.grpo.steps 0", "steps"),
    ("recipes-show-unknown", "recipes show nope", "nope"),
    ("recipes-unknown-action", "recipes frobnicate", "recipes"),
    ("models-unknown-action", "models frobnicate", "rlvr models"),
    ("models-prepare-unknown", "models prepare nope", "nope"),
    ("models-convert-missing", "models convert-gguf {in}/none.gguf out", "none.gguf"),
    ("check-loss-unknown-recipe", "check-loss --recipe nope", "nope"),
    ("check-loss-group-size-0", "check-loss --grpo.group-size 0", "group_size"),
    ("course-unknown-action", "course frobnicate out", "rlvr course build OUT"),
    ("course-no-out", "course build", "rlvr course build OUT"),
    ("course-out-not-ours", "course build {in}", "not written by `rlvr course build`"),
    ("course-out-a-file", "course build {in}/rows.jsonl", "is not a directory"),
    ("course-no-sources", "course build site --source {in}", "no course sources"),
    ("unknown-command", "trian", "trian"),
]


def _tree(*roots: Path) -> list[str]:
    """Every path under `roots`, with file sizes: what a command may not change."""
    return sorted(
        f"{p}:{p.stat().st_size if p.is_file() else '/'}" for r in roots for p in r.rglob("*")
    )


@pytest.fixture
def forbid_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace every binding of the `FORBIDDEN` functions in rlvr's modules by one that fails
    the test: a bad input must be refused before a model is built, loaded or trained."""

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was built, loaded or trained before the input was refused")

    for name, module in list(sys.modules.items()):
        if not name.startswith("rlvr"):
            continue
        for attr, value in list(vars(module).items()):
            if any(value is f for f in FORBIDDEN):
                monkeypatch.setattr(module, attr, forbidden)


@pytest.mark.parametrize("argv, named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_any_work(
    argv, named, inputs, tmp_path, monkeypatch, capsys, forbid_models
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RLVR_DEBUG", raising=False)
    before = _tree(tmp_path, inputs)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        rlvr.cli.main(argv.format(**{"in": inputs}).split())
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlvr: error: "), err
    assert info.value.code == 2, err
    assert named in lines[0], lines[0]
    assert _tree(tmp_path, inputs) == before, "a bad input wrote files"


def test_table_covers_every_command():
    commands = {c[1].split()[0] for c in CASES}
    assert set(rlvr.cli.COMMANDS) <= commands
    assert len(CASES) >= 40


def test_missing_tracker_package_is_refused_before_the_run(
    tmp_path, monkeypatch, capsys, forbid_models
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(SystemExit) as info:
        rlvr.cli.main(["train", "--report-to", "wandb"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1
    assert "pip install 'rlvr[wandb]'" in err[0]
    assert list(tmp_path.iterdir()) == []


PLAIN_BOX = """\
 Value error
 ---------------------------------------------------------------
  Error parsing --grpo.lr: could not convert string to float:
  'abc'
  ---------------------------------------------------------------
  Argument helptext:
      --grpo.lr FLOAT
  ---------------------------------------------------------------
  For full helptext, see rlvr train --help
"""
DRAWN_BOX = """\
\x1b[31m\u256d\u2500 Required options \u2500\u2500\u2500\u2500\u2500\u2500\u256e\x1b[0m
\u2502 Missing from rlvr eval:          \u2502
\u2502     --model STR                  \u2502
\u2502         A local model directory. \u2502
\u2502         (required)               \u2502
\u2502 \u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500 \u2502
\u2502 For full helptext, run rlvr eval --help \u2502
\u2570\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u2500\u256f
"""


def test_tyro_boxes_become_one_line():
    # the wrapped message re-joined; the helptext sections dropped
    assert rlvr.cli.tyro_error_message(PLAIN_BOX) == (
        "Error parsing --grpo.lr: could not convert string to float: 'abc'"
    )
    # a drawn box (its title in the top edge, colours on): the required flag, not its help
    assert rlvr.cli.tyro_error_message(DRAWN_BOX) == "Missing from rlvr eval: --model STR"


def test_help_still_prints_and_exits_0(capsys):
    with pytest.raises(SystemExit) as info:
        rlvr.cli.main(["verify", "--help"])
    assert info.value.code == 0
    assert "--verifier" in capsys.readouterr().out
