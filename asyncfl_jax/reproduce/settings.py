"""The settings of a reproduction as one typed, frozen value.

Each reproduction module (``ace``, ``ca2fl``, ``area``, ``asynflc_ef``, ``asyncfeded``, ``bias_correction``,
``compression``) has a frozen dataclass of its settings (``AceSettings``, ``Ca2flSettings``...) whose fields are the
command line's options, named as their ``--flags`` with ``_`` for ``-``, after the module's parse step has filled in
the defaults that depend on other options (``--scale``, ``--quick``) and normalized them, plus what that step derives
(e.g. ACE's ``lr_override``). Every function of the module takes that value, or the two or three numbers it needs.

There are two ways to build one, and both go through the same defaults, filling and checks:

* from the command line: ``parse_settings(argv)`` (``Settings.from_args(parse_args(argv))``), what ``main`` does;
* from Python: ``Settings.from_keywords(quick=True, seeds=[0, 1], ...)``, the options as the flags take them
  (``None`` or an absent keyword: the flag's default); a bad value raises :class:`SettingsError` with the message the
  command line would print.

A field is never reassigned (``dataclasses.replace`` makes a changed copy). A value a module's parse step leaves as a
list stays a list, so that the runs and their ``results.json`` are those of the command line exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
from typing import Any, Callable, Mapping, TypeVar

S = TypeVar("S", bound="ReproductionSettings")


class SettingsError(ValueError):
    """A reproduction's settings built from keywords were refused; the message is the command line's."""


class ReproductionSettings:
    """What every reproduction's settings dataclass shares: :meth:`from_args` and the keyword path behind each
    module's ``from_keywords``."""

    @classmethod
    def from_args(cls: type[S], args: argparse.Namespace) -> S:
        """The settings of a parsed and filled-in command line (the module's ``parse_args``). Every attribute of
        ``args`` must be a field and every field an attribute: an option without a field would be silently ignored,
        so it is refused (``TypeError``: a field is missing from the dataclass)."""
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        given = set(vars(args))
        if given != set(names):
            raise TypeError(f"{cls.__name__} and the parsed arguments differ: options without a field "
                            f"{sorted(given - set(names))}, fields without an option {sorted(set(names) - given)}")
        return cls(**{name: getattr(args, name) for name in names})

    @classmethod
    def _from_keywords(cls: type[S], parser: argparse.ArgumentParser,
                       parse_args: Callable[[list[str]], argparse.Namespace], options: Mapping[str, Any]) -> S:
        """``cls.from_args(parse_args(argv))`` for the command line ``argv`` that gives ``options``
        (:func:`argv_of`); a refused value raises :class:`SettingsError` with the command line's message."""
        argv = argv_of(parser, options)
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                args = parse_args(argv)
        except SystemExit as e:
            lines = stderr.getvalue().strip().splitlines()
            message = lines[-1].partition(": error: ")[2] or lines[-1] if lines else f"{dict(options)} was refused"
            raise SettingsError(message) from e
        return cls.from_args(args)


def argv_of(parser: argparse.ArgumentParser, options: Mapping[str, Any]) -> list[str]:
    """The command line of ``parser`` that sets each of ``options`` (``dest: value``, the values as the flag takes
    them: a number, a string, a list for a flag of several values, a bool for a switch); ``None`` leaves an option at
    its default. An unknown name raises :class:`SettingsError` naming the known ones."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}  # argparse keeps them
    unknown = sorted(set(options) - set(actions))
    if unknown:
        raise SettingsError(f"unknown settings {unknown}; the options are {sorted(actions)}")
    argv: list[str] = []
    for name, value in options.items():
        if value is None:
            continue
        action = actions[name]
        flag = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if _switch(name, value) else f"--no-{flag[2:]}")
        elif isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if _switch(name, value) != action.default:
                argv.append(flag)
        elif isinstance(action, argparse._AppendAction):
            argv += [f"{flag}={item}" for item in _items(name, value)]  # "=": a value may start with "-"
        elif action.nargs is None or action.nargs == "?":
            argv.append(f"{flag}={value}")
        else:
            argv += [flag, *(str(v) for v in _items(name, value))]
    return argv


def _switch(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SettingsError(f"{name} is a switch: True or False, got {value!r}")
    return value


def _items(name: str, value: Any) -> list[Any]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise SettingsError(f"{name} takes a list of values, got {value!r}")
    return list(value)


__all__ = ["ReproductionSettings", "SettingsError", "argv_of"]
