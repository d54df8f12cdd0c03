"""scripts/bench_accelerator.py --quick end to end in a subprocess (so the GPU benchmark cannot rot on a CPU-only CI):
every part runs, the JSON and the markdown table hold every measurement with finite ratios. Without PyTorch (the CI
install) only the PyTorch comparison is skipped, and the output says so. No timing assertions."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from support import ROOT, script_env

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import bench_accelerator as ba  # noqa: E402  (stdlib and numpy only at import)


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow  # about 85 CPU-seconds: six processes, thirteen small compilations
def test_quick_run_writes_every_part_with_finite_ratios(tmp_path):
    has_torch = importlib.util.find_spec("torch") is not None
    # XLA's default optimizations: at level 0 the vmapped convolutions run orders of magnitude slower on a CPU.
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_accelerator.py"), "--quick",
                           "--budget", "1500", "--out", str(tmp_path)],
                          env=script_env(fast_compile=False), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == [ba.JSON_NAME, ba.MD_NAME]
    res = json.loads((tmp_path / ba.JSON_NAME).read_text())
    plan = ba.PLANS["quick"]

    env = res["env"]
    assert env["date"] and env["jax"] and env["device"]["platform"] == "cpu" and env["device"]["device_kind"]
    assert env["git"]["commit"] is None or len(env["git"]["commit"]) == 40
    assert (env["torch"] is not None) == has_torch
    for name in ba.PARTS:
        part = res["parts"][name]
        if name == "torch" and not has_torch:
            assert part["status"] == "skipped" and "PyTorch is not installed" in part["reason"]
            assert "PyTorch is not installed" in proc.stdout
            continue
        assert part["status"] == "ok", (name, part.get("reason"))
        assert part["skipped"] == [] and part["rows"], name

    ratios = res["ratios"]
    assert _finite_positive(ratios["matmul_bfloat16_over_float32"])
    fb = plan["fedbuff"]
    expected = {(m, mc) for m in fb["models"] for mc in fb["concurrency"]}
    assert {(r["model"], r["concurrency"]) for r in ratios["fedbuff"]} == expected
    for r in ratios["fedbuff"]:
        assert _finite_positive(r["engine_arrivals_per_second"]) and _finite_positive(
            r["engine_arrivals_per_second_with_compile"])
        assert _finite_positive(r["engine_flops_over_matmul_float32"])
        assert _finite_positive(r["engine_flops_over_matmul_bfloat16"])
        if has_torch:
            assert _finite_positive(r["engine_over_torch"]) and _finite_positive(r["engine_over_torch_with_compile"])
            assert _finite_positive(r["torch_flops_over_matmul_float32"])
    for r in res["parts"]["fedbuff"]["rows"]:
        assert r["same_schedule_as_torch"] and r["num_clients"] == fb["num_clients"]
    mp = plan["memory"]
    assert {(r["algorithm"], r["model"], r["num_clients"]) for r in ratios["memory"]} == {
        (a, m, n) for a in mp["algorithms"] for m in mp["models"] for n in mp["ns"]}
    for r in res["parts"]["memory"]["rows"]:
        assert r["cache"] == "float32" and r["refusals"] == []
        assert _finite_positive(r["seconds_per_step"]) and _finite_positive(r["peak_over_budget"])
        assert r["budget_total_bytes"] > r["budget_state_bytes"] > 4 * r["num_clients"] * r["num_params"] - 1
        assert _finite_positive(r["compiled_chunk_bytes"])
    assert [r["replicas"] for r in ratios["replicas"]] == list(plan["replicas"]["counts"])
    assert all(_finite_positive(r["throughput_vs_one"]) for r in ratios["replicas"])
    assert [r["model"] for r in ratios["mixed_precision"]] == list(plan["mixed_precision"]["models"])
    assert all(_finite_positive(r["bfloat16_over_float32"]) for r in ratios["mixed_precision"])

    table = (tmp_path / ba.MD_NAME).read_text()
    for name in ("matmul", "fedbuff", "memory", "replicas", "mixed_precision"):
        assert f"| {name} |" in table
    assert "status failed" not in table and "status timeout" not in table
    assert table.count("| fedbuff |") == 3 * len(expected) + 1  # three rows per configuration, the part's time
    assert ("no PyTorch" in table) == (not has_torch)
