"""Bad values that used to pass silently are refused before anything runs, with exit code 2 and the option named."""

from __future__ import annotations

import os

import pytest

from asyncfl_jax import cli


@pytest.mark.parametrize("argv,message", [
    (["--out", ""], "invalid option output = '': must name a folder"),
    (["--out", "   "], "invalid option output = '   ': must name a folder"),
    (["--batch-size", "-3"], "invalid option --batch-size = -3: must be an integer >= 1, or 0"),
    (["--set", "data.synthetic_alpha=NaN"], "invalid option data.synthetic_alpha = nan: must be a finite number"),
    (["--set", "data.synthetic_beta=Infinity"], "invalid option data.synthetic_beta = inf: must be a finite number"),
    (["--seeds", "100000000000000000000"], "invalid option seeds = 100000000000000000000: must be a non-empty list"),
    (["--set", "data.seed=4294967296"], "invalid option data.seed = 4294967296: must be an integer in [0, 4294967295]"),
    (["--set", "model.seed=-1"], "invalid option model.seed = -1: must be an integer in [0, 4294967295]"),
    (["--set", "model.seed=1.5"], "invalid option model.seed = 1.5"),
])
def test_bad_values_are_refused_before_anything_is_written(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("the user's own file")
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    assert cli.main(["run", *out, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["mine.txt"]  # nothing written, nothing replaced


def test_the_largest_seed_is_accepted():
    from asyncfl_jax.cli import config_from_argv
    from asyncfl_jax.config import validate

    validate(config_from_argv(["--seeds", "0,4294967295", "--set", "data.seed=4294967295"]))
