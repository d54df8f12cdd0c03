"""Every command of docs/usage.md's "From the command line" block is accepted, without running anything.

tests/test_readme_commands.py runs the README's short block and checks that each command learns; the longer list of
docs/usage.md is checked here more cheaply, in order and in one folder: each ``asyncfl run`` command is given
``--print-config`` (so its flags are parsed, its configuration built, validated and resolved, and nothing is compiled
or run) and must exit with 0 and print the JSON configuration; ``--resume FOLDER`` needs a run in that folder and is
checked as a flag only; ``asyncfl algorithms`` and ``asyncfl presets`` run and must print something; any other command
(one that reads results folders, e.g. ``asyncfl plot``) is parsed by the command line's parser only. A leading
``XLA_FLAGS=...`` is dropped.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import re

from asyncfl_jax import cli
from support import command_argv

USAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "usage.md"


def usage_commands() -> list[str]:
    block = re.search(r"## From the command line\n\n```bash\n(.*?)```", USAGE.read_text(), re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line]


_argv = command_argv


def test_usage_lists_commands():
    commands = usage_commands()
    assert len(commands) >= 10
    assert any("--config experiment.json" in c for c in commands)


def test_every_usage_command_is_accepted(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for command in usage_commands():
        argv, redirect = _argv(command)
        if "--resume" in argv:
            assert argv == ["run", "--resume", argv[2]], f"{command!r}: --resume takes a folder and nothing else"
            continue
        if argv[0] not in ("run", "algorithms", "presets"):
            cli._build_parser().parse_args(argv)  # exits (SystemExit 2) on a flag it does not know
            continue
        checked = [*argv, "--print-config"] if argv[0] == "run" and "--print-config" not in argv else argv
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = cli.main(checked)
        err = capsys.readouterr().err
        assert code == 0, f"{command!r} is refused (exit {code}):\n{err}"
        assert stdout.getvalue().strip(), f"{command!r} printed nothing"
        if argv[0] == "run":
            config = json.loads(stdout.getvalue())  # the resolved configuration
            assert config["runs"], command
        if redirect is not None:
            (tmp_path / redirect).write_text(stdout.getvalue())
    assert not list(tmp_path.glob("runs/*")), "checking a command must not run it"


def test_a_bad_command_would_be_caught(tmp_path, monkeypatch, capsys):
    """The check above fails for a command the CLI refuses (so it is not vacuous)."""
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["run", "--algorithm", "fedbuff", "--buffer-size", "30", "--concurrency", "20",
                         "--print-config"])
    assert code == 2
    assert "buffer_size" in capsys.readouterr().err
