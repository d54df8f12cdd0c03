"""Every command of the README's quick start and "From the command line" block runs, in order, and learns.

Each command runs in-process (``asyncfl_jax.cli.main``) in one shared folder, as a newcomer would type them one after
another, at a small size: ``--set runs.arrivals=SMALL_ARRIVALS --set eval_points=3`` is appended to every command that
runs an experiment (``--resume`` takes no options and continues what the command before it wrote). A leading
``XLA_FLAGS=...`` is dropped: in one process there is one CPU device, the math is the same (the sharded runs are
compared with single-device runs in tests/test_sharding.py). Fashion-MNIST commands are skipped when its IDX files are
not installed (CI installs them).

Each run must exit with 0, no replica may diverge, and every replica's final test accuracy must reach the threshold
stated below for its output folder. ``asyncfl run`` without ``--out`` writes to a folder of its own choosing under
``runs/``: the test finds it as the one folder the command added there.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import pathlib
import re

import pytest

from asyncfl_jax import cli
from support import command_argv

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
SMALL_ARRIVALS = 1000
SMALL = ["--set", f"runs.arrivals={SMALL_ARRIVALS}", "--set", "eval_points=3", "--no-progress"]

DEFAULT_RUN = "(the new folder of `asyncfl run` without --out)"
THRESHOLDS = {
    # output folder -> the final test accuracy every replica must reach after SMALL_ARRIVALS uploads (10 classes:
    # chance is 0.1). Each is the lowest replica measured on the 2-core CPU machine minus about 0.07: FedAsync, one
    # arrival per step, is the slowest to learn in 1,000 uploads (0.43-0.60 across the sweep's seeds and alphas).
    DEFAULT_RUN: 0.5,
    "runs/sweep": 0.35,
    "runs/ace-int8": 0.5,
    "runs/preset": 0.8,
    "runs/mine": 0.45,
}


def readme_commands() -> list[str]:
    """The quick start's run command, then every line of the "From the command line" block (continuations joined,
    comments removed)."""
    text = README.read_text()
    quick = re.search(r"## Quick start\n\n```bash\n(.*?)```", text, re.S).group(1)
    first = quick.splitlines()[0].split("#")[0].split("&&")[-1].strip()
    block = re.search(r"## From the command line\n\n```bash\n(.*?)```", text, re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    return [first, *(line for line in lines if line)]


_argv = command_argv


def _out_folder(argv: list[str]) -> str | None:
    if argv[0] == "plot":  # its --out is a figure, not a results folder
        return None
    for flag in ("--out", "--resume"):
        if flag in argv:
            return argv[argv.index(flag) + 1]
    return DEFAULT_RUN if argv[0] == "run" and "--print-config" not in argv else None


def _final_accuracies(folder: pathlib.Path) -> dict[tuple[str, str], float]:
    """(run, replica) -> test accuracy at the last evaluation, from metrics.csv."""
    last: dict[tuple[str, str], tuple[int, float]] = {}
    with open(folder / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            key, step = (row["run"], row["replica"]), int(row["step"])
            if key not in last or step >= last[key][0]:
                last[key] = (step, float(row["test_accuracy"]) if row["test_accuracy"] else float("nan"))
    return {k: v for k, (_, v) in last.items()}


def test_the_readme_lists_the_commands_this_test_knows():
    commands = readme_commands()
    assert commands[0] == "asyncfl run"
    outs = {_out_folder(_argv(c)[0]) for c in commands} - {None}
    assert outs == set(THRESHOLDS), "give every README output folder a threshold here (and nothing else)"
    for command in commands:  # every command that runs an experiment writes to its own folder
        argv, _ = _argv(command)
        if argv[0] == "run" and "--print-config" not in argv and command != "asyncfl run":
            assert "--out" in argv or "--resume" in argv, f"{command!r} has no --out"


@pytest.mark.slow
def test_every_readme_command_runs_in_order_and_learns(tmp_path, monkeypatch, capsys):
    from asyncfl_jax.data.idx import DatasetNotFoundError, find_idx_dir

    monkeypatch.chdir(tmp_path)
    try:
        find_idx_dir("fashion_mnist", None)
        have_fashion = True
    except DatasetNotFoundError:
        have_fashion = False
    reached: list[str] = []
    too_low: list[str] = []
    for command in readme_commands():
        argv, redirect = _argv(command)
        if "fashion_mnist" in argv and not have_fashion:
            continue
        if argv[0] == "run" and "--print-config" not in argv and "--resume" not in argv:
            argv = [*argv, *SMALL]
        elif "--resume" in argv:
            argv = [*argv, "--no-progress"]
        before = set((tmp_path / "runs").glob("*"))
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 0, f"{command!r} exited with {code}:\n{err}"
        assert "Traceback" not in err, err
        if redirect is not None:
            (tmp_path / redirect).write_text(stdout.getvalue())
            json.loads(stdout.getvalue())  # the redirected output is the JSON it promises
        out = _out_folder(argv)
        if argv[0] == "plot":  # the figure it promises, in both formats
            fig = argv[argv.index("--out") + 1]
            assert (tmp_path / f"{fig}.png").stat().st_size > 0 and (tmp_path / f"{fig}.pdf").stat().st_size > 0
        if out is None:
            assert stdout.getvalue().strip(), f"{command!r} printed nothing"
            continue
        if out == DEFAULT_RUN:
            added = set((tmp_path / "runs").glob("*")) - before
            assert len(added) == 1, f"{command!r} should add one folder to runs/, added {sorted(added)}"
            (folder,) = added
        else:
            folder = tmp_path / out
        summary = json.loads((folder / "summary.json").read_text())
        for run in summary["runs"]:
            assert all(d == -1 for d in run["diverged_at"]), f"{command!r}: {run['run']} diverged: {run['diverged_at']}"
        threshold = THRESHOLDS[out]
        for (run, replica), accuracy in _final_accuracies(folder).items():
            reached.append(f"{command!r}: run {run} replica {replica}: {accuracy:.3f} (threshold {threshold})")
            if not accuracy >= threshold:
                too_low.append(reached[-1])
    print("\n".join(reached))
    assert not too_low, "final test accuracy below the threshold:\n" + "\n".join(too_low)
    assert os.path.isfile(tmp_path / "experiment.json")
