"""What every reproduction writes and prints: Markdown table pieces, number formats, JSON, figures, the output
files and a progress line per compiled program."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from asyncfl_jax.results import History, save_figure, write_atomic


# ------------------------------------------------------------------------------------------------ text
def yes_no(flag: bool) -> str:
    """``"yes"`` or ``"no"``."""
    return "yes" if flag else "no"


def table_row(cells: Iterable[Any]) -> str:
    """One Markdown table row: ``| a | b | c |``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def fmt_bits(value: float | None) -> str:
    """A bit count in 3 significant digits, ``-`` for None."""
    return "-" if value is None else f"{value:.3g}"


def fmt_ratio(value: float | None, digits: int = 1) -> str:
    """A ratio with ``digits`` decimals, ``-`` for None."""
    return "-" if value is None else f"{value:.{digits}f}"


def parse_checked(parser: argparse.ArgumentParser, argv: list[str] | None,
                  fill: Callable[[argparse.Namespace], Any],
                  check: Callable[[argparse.Namespace], str | None]) -> argparse.Namespace:
    """``parser``'s arguments, completed by ``fill(args)`` (defaults that depend on other arguments) and checked by
    ``check(args)``: a message from it exits with a usage error."""
    args = parser.parse_args(argv)
    fill(args)
    problem = check(args)
    if problem:
        parser.error(problem)
    return args


def distinct_seeds_problem(seeds: Sequence[int], flag: str = "--seeds") -> str | None:
    """The error message when ``seeds`` are not distinct integers in [0, 1000) (training seeds 1000 j + s must not
    collide), else None."""
    if len(set(seeds)) != len(seeds) or any(not 0 <= s < 1000 for s in seeds):
        return f"{flag} must be distinct integers in [0, 1000)"
    return None


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``max(value, 1)``."""
    return int(math.ceil(max(value, 1) / multiple) * multiple)


def to_json(value: Any) -> Any:
    """``value`` with numpy arrays and scalars turned into Python lists and numbers and non-finite floats into None
    (strict JSON); dict keys become strings."""
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_json(value.tolist())
    if isinstance(value, (np.floating, float)):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


# ------------------------------------------------------------------------------------------------ files
def write_outputs(out: str, table: str, results: dict[str, Any], indent: int = 1,
                  default: Callable[[Any], Any] | None = None) -> None:
    """Writes ``table.md`` and ``results.json`` (atomically) into ``out``."""
    write_atomic(os.path.join(out, "table.md"), table)
    write_atomic(os.path.join(out, "results.json"), json.dumps(results, indent=indent, default=default))


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (imported only when a figure is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def label_axes(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    """Title (10 pt), axis labels, a light grid and a small legend: how every panel of the reproductions ends."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def save_png(fig: Any, out: str, name: str, dpi: int = 120) -> str:
    """Saves ``fig`` as ``out/name`` (atomically) and closes it; returns ``name``."""
    save_figure(fig, os.path.join(out, name), dpi=dpi)
    return name


# ------------------------------------------------------------------------------------------------ progress
def log_program(label: str, history: History, seconds: float | None = None, width: int = 40) -> None:
    """One line on stderr per compiled program: its replicas, steps, compile and run time."""
    total = "" if seconds is None else f"  (total {seconds:6.1f}s)"
    print(f"{label:<{width}} {history.num_replicas:>4} replicas {history.num_steps:>6} steps  compile "
          f"{history.compile_seconds:6.1f}s  run {history.run_seconds:6.1f}s{total}", file=sys.stderr, flush=True)
