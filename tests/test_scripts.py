"""The demonstration scripts run end to end at a tiny size (so they never rot)."""

from __future__ import annotations

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bias_correction_demo_runs_and_writes_its_table(tmp_path, capsys):
    demo = _load("demo_bias_correction")
    out = tmp_path / "demo"
    code = demo.main(["--dataset", "synthetic", "--clients", "10", "--uploads", "60", "--seeds", "0",
                      "--spreads", "0", "1.5", "--out", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "| ACE |" in table and "| gap" in table
    results = json.loads((out / "results.json").read_text())["results"]
    assert {r["method"] for r in results} == set(demo.METHODS)
    assert len(results) == 2 * len(demo.METHODS)
    assert all(r["uploads"] >= 60 for r in results)  # ACE also counts its initialization round
    assert sorted(os.listdir(out)) == ["accuracy.png", "results.json", "table.md"]
