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
def test_notebook_is_stored_clean(path):
    """Valid nbformat v4, stored without outputs, and its first code cell is the parameters cell."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cell"
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, f"stored with outputs: {cell.source[:60]!r}"
    assert 'os.environ.get("ASYNCFL_NOTEBOOK_SMALL", "0") == "1"' in code[0].source


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
