"""The notebooks in notebooks/ run top to bottom at a tiny size (so they never rot).

Each notebook is executed in a temporary copy by a fresh ``python3`` Jupyter kernel, with the repository root as the
working directory and ``ASYNCFL_NOTEBOOK_SMALL=1`` in the environment (the kernel inherits it), so its parameters cell
picks tiny sizes. A cell that raises fails the test, which names the notebook. ``JAX_DISABLE_MOST_OPTIMIZATIONS=1``
is set too: it roughly halves the XLA compile times, which dominate these tiny runs, and changes no result beyond float
rounding.
"""

from __future__ import annotations

import glob
import os
import shutil

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
KERNEL = "python3"


def ensure_kernel(name: str = KERNEL) -> None:
    """Installs the ``python3`` kernelspec for this interpreter (user-wide) when Jupyter cannot find one."""
    from jupyter_client.kernelspec import KernelSpecManager

    if name in KernelSpecManager().find_kernel_specs():
        return
    from ipykernel.kernelspec import install

    try:
        install(user=True, kernel_name=name)
    except OSError:  # another test worker may be installing it at the same moment
        pass
    assert name in KernelSpecManager().find_kernel_specs(), f"could not install the {name!r} kernelspec"


def test_there_are_notebooks():
    names = [os.path.basename(p) for p in NOTEBOOKS]
    assert {"01_quickstart.ipynb", "02_heterogeneity_and_bias.ipynb", "03_your_own_algorithm.ipynb", "04_sweeps.ipynb",
            "05_compression_and_error_feedback.ipynb"} <= set(names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_stored_clean_or_with_small_outputs(path):
    """Valid nbformat v4 whose first code cell is the parameters cell, stored either without outputs or with the
    outputs of a whole run at the small size (``scripts/store_notebook_outputs.py``): marked as such in the metadata
    and in the first Markdown cell, every code cell executed in order, no error, nothing on stderr, and no absolute
    path of the repository in a text output."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cell"
    assert 'os.environ.get("ASYNCFL_NOTEBOOK_SMALL", "0") == "1"' in code[0].source
    if all(cell.outputs == [] and cell.execution_count is None for cell in code):
        return  # stored clean
    assert nb.metadata.get("asyncfl_jax", {}).get("outputs") == "small", \
        "stored with outputs not marked as the small size's: run scripts/store_notebook_outputs.py"
    first_markdown = next(c for c in nb.cells if c.cell_type == "markdown")
    assert "ASYNCFL_NOTEBOOK_SMALL=1" in first_markdown.source and "small size" in first_markdown.source
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "not one run top to bottom"
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"], "stored with an error"
    assert not [o for o in outputs if o.output_type == "stream" and o.name == "stderr"], "stored with stderr output"
    assert any("image/png" in o.get("data", {}) for o in outputs), "stored outputs without a figure"
    texts = [o.get("text", "") for o in outputs] + [v for o in outputs for k, v in o.get("data", {}).items()
                                                    if k.startswith("text/") and isinstance(v, str)]
    assert not [t for t in texts if ROOT in t], "a stored output holds the repository's absolute path"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, tmp_path, monkeypatch):
    ensure_kernel()
    copy = tmp_path / os.path.basename(path)
    shutil.copyfile(path, copy)
    nb = nbformat.read(copy, as_version=4)
    monkeypatch.setenv("ASYNCFL_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    client = NotebookClient(nb, timeout=300, kernel_name=KERNEL, resources={"metadata": {"path": ROOT}})
    try:
        client.execute()  # raises CellExecutionError (with the cell and traceback) when a cell raises
    finally:
        nbformat.write(nb, copy)  # the executed copy, with its outputs, for a look after a failure
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, f"{os.path.basename(path)}: {errors[0].ename}: {errors[0].evalue}"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{os.path.basename(path)} produced no image output"
