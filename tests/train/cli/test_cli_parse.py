import pytest

from train.cli import parse


def test_overrides_may_follow_options():
    args = parse(["train", "c.yaml", "a.b=1", "--runs-dir", "r", "c.d=2", "--overwrite"])
    assert args.overrides == ["a.b=1", "c.d=2"] and args.runs_dir == "r" and args.overwrite


def test_unknown_option_is_still_an_error(capsys):
    with pytest.raises(SystemExit) as e:
        parse(["train", "c.yaml", "--bogus"])
    assert e.value.code == 2 and "--bogus" in capsys.readouterr().err


def test_resume_and_overwrite_exclude_each_other():
    with pytest.raises(SystemExit):
        parse(["train", "c.yaml", "--resume", "--overwrite"])
