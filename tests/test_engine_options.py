"""The engine options (``asyncfl_jax/engine/options.py``): one value, each rule written once, reaching every entry
point from there; and the planning pass ``plan`` that every entry point goes through."""

from __future__ import annotations

import ast
import dataclasses
import os

import pytest

from asyncfl_jax import cli
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.engine.options import EngineOptions, OptionError, python_words

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "asyncfl_jax")

FRONT_DOORS = ("cli.py", "config.py", "experiment.py", "preflight.py", "checkpoint.py", "engine/simulate.py",
               "engine/arguments.py", "engine/callbacks.py")
"""The modules an option used to be threaded through (the flag, the configuration key and its rule, the experiment's
pass-through, the ``simulate`` keyword and its type check, the memory preflight, the checkpoint identity)."""

RESULT_NAMES = ("history", "h")
"""Variables that hold a :class:`~asyncfl_jax.results.History`: ``history.trajectory`` is a result, not the
option."""


def _option_mentions(path: str, names: set[str]) -> list[str]:
    """Where the code of the module at ``path`` names an engine option: a keyword argument ``name=``, a parameter
    ``name``, an attribute ``x.name`` (not of a History), or a string that is exactly the option's name or its flag
    (``"lookahead"``, ``"--lookahead"``). Docstrings, comments and longer messages do not count."""
    flags = {"--" + n.replace("_", "-"): n for n in names}
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.keyword) and node.arg in names:
            name = node.arg
        elif isinstance(node, ast.arg) and node.arg in names:
            name = node.arg
        elif isinstance(node, ast.Attribute) and node.attr in names:
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            name = None if owner in RESULT_NAMES else node.attr
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value if node.value in names else flags.get(node.value)
        if name is not None:
            found.append(f"{name} (line {node.lineno})")
    return found


def test_adding_an_engine_option_touches_at_most_two_package_files():
    """The rule that makes an engine option cost two package files: ``engine/options.py`` (the field: default,
    rule, flag help, identity) and the engine module that implements it.

    Checked in two halves. (1) No front-door module names an option in its code (:func:`_option_mentions`): the
    command line, the configuration, the experiment driver, ``simulate`` and its argument checks, the memory
    preflight and the checkpoint identity all take the options as one value. (2) Each option reaches every front
    door from ``engine/options.py`` alone (the next test): a configuration key with the same default, a command-line
    flag, a ``simulate`` / ``prepare_run`` keyword, and its part of the checkpoint identity. Before this rule, adding
    ``replica_batch`` touched seven package files."""
    names = set(EngineOptions.names())
    mentions = {module: _option_mentions(os.path.join(PACKAGE, module), names) for module in FRONT_DOORS}
    assert {module: found for module, found in mentions.items() if found} == {}


def test_the_mention_finder_finds_each_kind_of_mention(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('def f(lookahead):\n    g(job_executor=1)\n    cfg.precision\n    history.trajectory\n'
                    '    x = ["--replica-batch", "shard_jobs", "the lookahead window"]\n')
    found = _option_mentions(str(path), set(EngineOptions.names()))
    assert sorted(f.split()[0] for f in found) == ["job_executor", "lookahead", "precision", "replica_batch",
                                                   "shard_jobs"]  # not history.trajectory, not the message


def test_every_option_reaches_every_front_door():
    config_fields = {f.name: f for f in dataclasses.fields(ExperimentConfig)}
    run_parser = next(a for a in cli._build_parser()._subparsers._group_actions[0].choices.values()
                      if a.prog.endswith(" run"))
    flags = {s for action in run_parser._actions for s in action.option_strings}
    for f in dataclasses.fields(EngineOptions):
        assert config_fields[f.name].default == f.default, f.name  # a configuration key with the same default
        assert "--" + f.name.replace("_", "-") in flags, f.name  # a command-line flag
        assert getattr(EngineOptions.from_keywords({f.name: f.default}), f.name) == f.default  # a keyword
        assert callable(f.metadata["rule"]) and f.metadata["help"]
    # the order of a configuration: its sections, the engine options, then the output folder
    assert list(config_fields)[-len(EngineOptions.names()) - 1:-1] == EngineOptions.names()


def test_a_rule_speaks_both_dialects():
    with pytest.raises(OptionError, match=r"^lookahead must be an integer >= 1 \(1: no lookahead batching\), got 0$"):
        EngineOptions(lookahead=0).checked()
    cfg = ExperimentConfig(lookahead=0)
    with pytest.raises(ConfigError, match=r"^invalid option lookahead = 0: must be an integer >= 1"):
        validate(cfg, check_files=False)
    with pytest.raises(OptionError, match=r"replica_batch must be None \(the backend's default grouping\)"):
        EngineOptions(replica_batch=0).checked()
    with pytest.raises(ConfigError, match=r"replica_batch = 0: must be null \(the backend's default grouping\)"):
        validate(ExperimentConfig(replica_batch=0), check_files=False)
    assert python_words("true, false or null (nullable, untrue)") == "True, False or None (nullable, untrue)"


@pytest.mark.parametrize("options, name, text", [
    (dict(shard_jobs=True, shard_replicas=True), "shard_replicas", "cannot be combined with shard_jobs"),
    (dict(shard_replicas=True, shard_clients=True), "shard_clients",
     "cannot be combined with shard_jobs or shard_replicas"),
    (dict(replica_batch=2, shard_clients=True), "replica_batch", "cannot be combined with shard_clients"),
    (dict(lookahead=3, shard_jobs=True), "lookahead", "cannot be combined with shard_jobs"),
])
def test_combinations_are_refused_once_for_every_entry_point(options, name, text):
    with pytest.raises(OptionError, match=f"^{name} {text}"):
        EngineOptions(**options).checked()
    with pytest.raises(ConfigError, match=f"^invalid option {name} = .*: {text}"):
        validate(ExperimentConfig(**options), check_files=False)


def test_a_configuration_switch_is_true_or_false():
    for value in (None, 1, "yes", lambda x: x):
        with pytest.raises(ConfigError, match=r"invalid option trajectory = .*: must be true or false$"):
            validate(ExperimentConfig(trajectory=value), check_files=False)
    EngineOptions(trajectory=None).checked()  # from Python None is off and a function records what it returns
    EngineOptions(trajectory=lambda x: x[:2]).checked()


def test_an_unknown_keyword_is_refused_with_the_closest_option():
    with pytest.raises(TypeError, match=r"simulate\(\) got an unexpected keyword argument 'lookahed'; did you mean "
                                        r"'lookahead'\?"):
        EngineOptions.from_keywords({"lookahed": 2})


def test_a_configuration_is_its_engine_options_and_a_run_may_differ():
    cfg = ExperimentConfig(lookahead=4, replica_batch=2, precision="float64")
    options = EngineOptions.from_config(cfg)
    assert type(options) is EngineOptions and options.as_keywords() == {
        **EngineOptions().as_keywords(), "lookahead": 4, "replica_batch": 2, "precision": "float64"}
    assert options.for_run(event_clock=True).lookahead == 1 and options.for_run(event_clock=False) is options
