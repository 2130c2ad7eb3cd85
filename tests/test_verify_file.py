import json

import pytest

from rlvr.cli import main


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_verify_file_summarises_by_reason(tmp_path, capsys):
    path = tmp_path / "completions.jsonl"
    write_jsonl(
        path,
        [
            {"completion": "7+8+0=15 #### 15", "answer": "15"},
            {"completion": "#### 15 or 16", "answer": "15"},
            {"completion": "<think>#### 15</think>", "answer": "15"},
            {"completion": "#### 14", "answer": "15"},
        ],
    )
    main(["verify", "--file", str(path)])
    summary = json.loads(capsys.readouterr().out)
    assert summary["completions"] == 4 and summary["mean_reward"] == 0.25
    assert summary["by_reason"]["correct"] == 1 and summary["by_reason"]["wrong"] == 1
    assert sum(summary["by_reason"].values()) == 4


def test_weak_verifier_pays_for_a_hedge(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    write_jsonl(path, [{"completion": "#### 15 or 16", "answer": "15"}])
    main(["verify", "--file", str(path), "--verifier", "weak_math"])
    assert json.loads(capsys.readouterr().out)["mean_reward"] == 1.0


def test_malformed_lines_name_their_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"completion": "#### 1", "answer": "1"}\n{"completion": \n')
    with pytest.raises(SystemExit, match="2"):
        main(["verify", "--file", str(path)])
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err
    path.write_text('{"completion": "#### 1"}\n')
    with pytest.raises(SystemExit, match="2"):
        main(["verify", "--file", str(path)])
    assert "bad.jsonl:1: missing field(s) ['answer']" in capsys.readouterr().err
