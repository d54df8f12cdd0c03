"""The reproductions' settings values (asyncfl_jax.reproduce.settings): built from a command line or from keywords
alike, frozen, and refusing what the command line refuses (no run: the values alone decide the runs)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from asyncfl_jax.reproduce import ace, area, asyncfeded, asynflc_ef, bias_correction, ca2fl, compression
from asyncfl_jax.reproduce.settings import ReproductionSettings, SettingsError, argv_of

SETTINGS = {ace: ace.AceSettings, ca2fl: ca2fl.Ca2flSettings, area: area.AreaSettings,
            asynflc_ef: asynflc_ef.AsynflcEfSettings, bias_correction: bias_correction.BiasCorrectionSettings,
            compression: compression.CompressionSettings, asyncfeded: asyncfeded.AsyncfededSettings}


@pytest.mark.parametrize("module", list(SETTINGS), ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_option_is_a_field_and_both_ways_give_the_same_settings(module):
    cls = SETTINGS[module]
    args = module.parse_args(["--quick"])
    assert [f.name for f in dataclasses.fields(cls)] == list(vars(args))  # results.json keeps its key order
    settings = module.parse_settings(["--quick"])
    assert type(settings) is cls and vars(settings) == vars(args)
    assert cls.from_keywords(quick=True) == settings
    assert cls.from_keywords() == module.parse_settings([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.out = "elsewhere"
    assert cls.__doc__ and all(f"{f.name}:" in cls.__doc__ for f in dataclasses.fields(cls))  # each field documented


def test_keywords_are_the_flags_values_and_fill_in_as_the_command_line():
    argv = ["--quick", "--no-tune", "--seeds", "0", "3", "--lr", "ace=0.5,0.7", "--lr", "aced=0.1",
            "--dropout-setting", "0.1", "2", "--tau-ablation", "--clients", "12"]
    by_keywords = ace.AceSettings.from_keywords(quick=True, tune=False, seeds=[0, 3], lr=["ace=0.5,0.7", "aced=0.1"],
                                                dropout_setting=(0.1, 2), tau_ablation=[], clients=12,
                                                data_dir=None)  # None: the flag's default
    assert by_keywords == ace.parse_settings(argv)
    assert by_keywords.lr_override == {"ace": [0.5, 0.7], "aced": [0.1]} and by_keywords.tau_ablation == []
    assert by_keywords.concurrency == 12 and not by_keywords.tune  # filled from --clients, switched off
    ca = ca2fl.Ca2flSettings.from_keywords(settings=["cifar10/ca2fl_cnn/0.3"], rounds=20)
    assert ca.settings == [ca2fl.Setting("cifar10", "ca2fl_cnn", 0.3)] and ca.ablation_setting == ca.settings[0]


@pytest.mark.parametrize("options, message", [
    ({"clients": 1}, "--clients must be >= 2"),
    ({"scale": "gpu"}, "argument --scale: invalid choice: 'gpu'"),
    ({"lr": ["nope=1"]}, "--lr expects METHOD=V1,V2"),
    ({"nope": 1}, "unknown settings ['nope']"),
    ({"lr_override": {"ace": [1.0]}}, "unknown settings ['lr_override']"),  # derived, not an option
    ({"quick": "yes"}, "quick is a switch"),
    ({"seeds": 3}, "seeds takes a list of values"),
])
def test_keywords_the_command_line_refuses_are_refused_with_its_message(options, message):
    with pytest.raises(SettingsError, match=message.replace("[", r"\[").replace("(", r"\(")):
        ace.AceSettings.from_keywords(**options)


def test_an_option_without_a_field_is_refused_not_ignored():
    args = ace.parse_args(["--quick"])
    args.new_option = 3  # e.g. a flag added to the parser but not to AceSettings
    with pytest.raises(TypeError, match=r"options without a field \['new_option'\]"):
        ace.AceSettings.from_args(args)
    del args.new_option, args.lr_override
    with pytest.raises(TypeError, match=r"fields without an option \['lr_override'\]"):
        ace.AceSettings.from_args(args)


def test_argv_of_writes_each_kind_of_flag():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--xs", type=float, nargs="*", default=None)
    p.add_argument("--flag", action="store_true")
    p.add_argument("--opt", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--item", action="append", default=[])
    argv = argv_of(p, {"n": 3, "xs": [0.1, 2.0], "flag": True, "opt": False, "item": ["a", "b"]})
    assert argv == ["--n=3", "--xs", "0.1", "2.0", "--flag", "--no-opt", "--item=a", "--item=b"]
    assert vars(p.parse_args(argv)) == {"n": 3, "xs": [0.1, 2.0], "flag": True, "opt": False, "item": ["a", "b"]}
    assert argv_of(p, {"flag": False, "xs": None}) == []  # the defaults
    assert p.parse_args(argv_of(p, {"item": ["-a"]})).item == ["-a"]  # a value that looks like a flag
    assert issubclass(ace.AceSettings, ReproductionSettings)
