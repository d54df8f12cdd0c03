"""``asyncfl plot RUN_DIR... --out FIG``: the runs of one or more results folders in one figure
(:func:`asyncfl_jax.figures.plot_comparison` on the folders' Histories, titled with their setting)."""

from __future__ import annotations

import json
import os
from typing import Sequence

from asyncfl_jax.errors import InputError
from asyncfl_jax.figures import (AXES, DEFAULT_AXES, OTHER_IMAGE_SUFFIXES, plot_comparison, run_settings,
                                 save_figure_files, setting_title)
from asyncfl_jax.results import load_results


def plot_folders(folders: Sequence[str], out: str, metric: str | None = None, band: str = "minmax",
                 axes: Sequence[str] = DEFAULT_AXES, title: str | None = None) -> list[str]:
    """``asyncfl plot RUN_DIR... --out FIG``: every run of the results ``folders`` in one figure
    (:func:`plot_comparison`), written to ``out`` (``.png``, ``.pdf``, or both without a suffix); returns the paths.
    The title defaults to the setting of the folders' ``config.json`` (:func:`setting_title`; the settings joined by
    " | " when the folders differ); the legend names each run with its protocol, and with its folder when several
    folders hold a run of the same name. Raises :class:`~asyncfl_jax.errors.InputError` for a folder that is not a
    finished results folder, an unknown metric or axis."""
    bad = [a for a in axes if a not in AXES]
    if bad or not axes:
        raise InputError(f"invalid option --axes = {','.join(axes)!r}: each must be one of {list(AXES)}")
    if os.path.splitext(out)[1].lower() in OTHER_IMAGE_SUFFIXES:
        raise InputError(f"invalid option --out = {out!r}: a figure is FIG.png or FIG.pdf (or FIG: both)")
    histories, labels, settings, owners = [], [], [], []
    for k, folder in enumerate(folders):
        try:
            loaded = load_results(folder)
            with open(os.path.join(folder, "config.json")) as f:
                config = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError(f"invalid results folder {folder!r}: {e}") from None
        protocols = run_settings(config)
        settings.append(setting_title(config))
        for h in loaded:
            histories.append(h)
            owners.append(k)
            labels.append(f"{h.label} ({protocols[h.label]})" if h.label in protocols else h.label)
    if len(set(folders)) > 1:
        counts = {x: labels.count(x) for x in labels}
        labels = [f"{x} [{os.path.basename(os.path.normpath(folders[o]))}]" if counts[x] > 1 else x
                  for x, o in zip(labels, owners)]
    if metric is not None:
        missing = [h.label for h in histories if metric not in h.metrics]
        if missing:
            raise InputError(f"invalid option --metric = {metric!r}: runs {missing} have no such metric (they have "
                             f"{sorted(histories[0].metrics)})")
    if title is None:
        title = " | ".join(dict.fromkeys(settings))
    fig = plot_comparison(histories, None, metric=metric, axes=axes, band=band, title=title, labels=labels)
    return save_figure_files(fig, out)
