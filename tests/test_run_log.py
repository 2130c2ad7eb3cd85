"""RunLog: says its lines where it should, or nothing at all."""

from __future__ import annotations

from rlvr.report.run_log import QUIET, RunLog


def test_say_prints_one_tagged_line_to_stdout(capsys):
    RunLog().say("base model: cached")
    out = capsys.readouterr()
    assert (out.out, out.err) == ("[rlvr] base model: cached\n", "")


def test_say_on_stderr_with_its_own_tag(capsys):
    RunLog(to_stderr=True, prefix="rlvr compare").say("dapo -> runs/compare-dapo")
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "[rlvr compare] dapo -> runs/compare-dapo\n")


def test_a_quiet_log_says_nothing(capsys):
    QUIET.say("hidden")
    RunLog(progress=False, to_stderr=True).say("hidden")
    assert capsys.readouterr() == ("", "")


def test_only_if_silences_the_other_ranks(capsys):
    log = RunLog(to_stderr=True)
    assert log.only_if(True) is log
    assert not log.only_if(False).progress and log.only_if(False).to_stderr
    log.only_if(False).say("rank 1")
    assert capsys.readouterr() == ("", "")
