"""The results as a table: one row per (run, replica, evaluation), as ``metrics.csv`` text
(:func:`metrics_csv`) or a pandas DataFrame (:func:`histories_dataframe`); ``histories`` are
:class:`~asyncfl_jax.results.History` objects (their :meth:`~asyncfl_jax.results.History.rows`)."""

from __future__ import annotations

import csv
import io
from typing import Any, Sequence


def metrics_csv(histories: Sequence[Any]) -> str:
    """All histories' rows as CSV text (columns: the union of every history's columns, in first-seen order)."""
    rows = [row for h in histories for row in h.rows()]
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def read_metrics_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ImportError("History.to_dataframe needs pandas, which is not installed: pip install pandas (or "
                          "pip install -e \".[pandas]\" from a clone)") from None
    return pandas


INTEGER_COLUMNS = ("replica", "seed", "point", "step", "uploads", "diverged_at")


def histories_dataframe(histories: Sequence[Any]) -> Any:
    """One pandas DataFrame of every history's :meth:`History.rows` (columns: the union, in first-seen order; a
    column one run lacks, e.g. a hyper-parameter swept only in another run, is NaN in its rows)."""
    pandas = _pandas()
    rows = [row for h in histories for row in h.rows()]
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    frame = pandas.DataFrame(rows, columns=columns)
    return frame.astype({c: "int64" for c in INTEGER_COLUMNS if c in frame.columns})
