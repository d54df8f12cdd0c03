"""Runs notebooks at the small size and stores their outputs in the .ipynb files.

    python scripts/store_notebook_outputs.py notebooks/01_quickstart.ipynb ...   (default: every notebook)

Each notebook runs top to bottom in a fresh ``python3`` kernel, from the repository root, with
``ASYNCFL_NOTEBOOK_SMALL=1`` (the parameters cell's small sizes, as tests/test_notebooks.py runs them). The outputs
are stored in place, with ``metadata.asyncfl_jax.outputs = "small"`` and a line in the first Markdown cell, so a reader
(and tests/test_notebooks.py) knows what they come from; the repository's absolute path is replaced by ``.`` in every text output. A notebook whose run
raises is left unchanged and the script exits with 1.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_MARK = {"outputs": "small", "environment": "ASYNCFL_NOTEBOOK_SMALL=1"}
SMALL_NOTE = ("*The outputs stored in this notebook come from the small size (`ASYNCFL_NOTEBOOK_SMALL=1`); run it as "
              "it is for the full size (the first code cell holds the sizes).*")


def mark_small(nb: nbformat.NotebookNode) -> None:
    """Records in the metadata, and says in the first Markdown cell, that the stored outputs are the small size's."""
    nb.metadata["asyncfl_jax"] = dict(SMALL_MARK)
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    if SMALL_NOTE not in first.source:
        first.source = first.source.rstrip() + "\n\n" + SMALL_NOTE


def _scrub(text: str) -> str:
    """Text output with the repository's absolute path (and the home folder) taken out."""
    return text.replace(ROOT + os.sep, "").replace(ROOT, ".").replace(os.path.expanduser("~"), "~")


def scrub_outputs(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)  # the kernel's timestamps: noise in every diff
        for output in cell.outputs:
            if "text" in output:
                output["text"] = _scrub(output["text"])
            for key, value in output.get("data", {}).items():
                if key.startswith("text/") and isinstance(value, str):
                    output["data"][key] = _scrub(value)


def store(path: str, timeout: int) -> bool:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": ROOT}})
    start = time.perf_counter()
    try:
        client.execute()
    except Exception as error:  # noqa: BLE001 - reported, the file is left as it was
        print(f"{path}: failed, left unchanged: {type(error).__name__}: {str(error)[-400:]}", file=sys.stderr)
        return False
    scrub_outputs(nb)
    mark_small(nb)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    print(f"{path}: outputs stored ({time.perf_counter() - start:.0f} s)")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="default: notebooks/*.ipynb")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell (default 900)")
    args = parser.parse_args(argv)
    os.environ["ASYNCFL_NOTEBOOK_SMALL"] = "1"  # the kernel inherits the environment
    paths = args.notebooks or sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
    results = [store(p, args.timeout) for p in paths]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
