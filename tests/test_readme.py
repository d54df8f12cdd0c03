"""The README's Python example runs as written."""

from __future__ import annotations

import pathlib
import re

import matplotlib

matplotlib.use("Agg")


def test_readme_python_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the example writes its metrics file into the current folder
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "the README has no Python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["out"].metrics["test_accuracy"].shape == (8, 7)
    assert namespace["history"].num_replicas == 4
    assert (tmp_path / "fedbuff.csv").read_text().startswith("run,step,replica,seed")
