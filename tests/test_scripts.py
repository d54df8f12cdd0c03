"""The demonstration scripts run end to end at a tiny size (so they never rot)."""

from __future__ import annotations

import json
import os

import pytest

from asyncfl_jax.reproduce import bias_correction as demo

from support import ROOT, script_env


def test_bias_correction_demo_runs_and_writes_its_table(tmp_path, capsys):
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
    figures = [f"compare_alpha0.1_sigma{s}.{ext}" for s in ("0", "1.5") for ext in ("pdf", "png")]
    assert sorted(os.listdir(out)) == sorted(["accuracy.png", *figures, "results.json", "table.md"])


def test_compression_demo_runs_in_a_subprocess_and_tables_every_method(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "compression"
    # The fastest mode, shrunk further: 10 clients, 100 uploads, one local step, on the embedded synthetic data.
    env = script_env()  # XLA's backend optimizations off: half the compile time (5 methods, one program each)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "demo_compression.py"), "--quick",
                           "--dataset", "synthetic", "--clients", "10", "--uploads", "100", "--local-steps", "1",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["accuracy_vs_bits.png", "results.json", "table.md"]
    methods = ["AsynFL", "FedBuff", "AsynFLC top-k", "AsynFLC-EF top-k", "AsynFLC-EF top-k+Q"]
    table = (out / "table.md").read_text()
    assert table in proc.stdout  # the table is also printed
    assert all(f"| {m} |" in table for m in methods)
    results = json.loads((out / "results.json").read_text())["results"]
    assert [r["method"] for r in results] == methods
    assert all(r["uploads"] >= 100 for r in results)
    payload = {r["method"]: r["message_bits"]["payload"] for r in results}
    assert payload["AsynFLC-EF top-k+Q"] < payload["AsynFLC-EF top-k"] < payload["AsynFL"] == payload["FedBuff"]


def test_reproduce_asyncfeded_quick_writes_outputs_and_tables_every_method(tmp_path):
    import subprocess
    import sys

    script = os.path.join(ROOT, "scripts", "reproduce_asyncfeded.py")
    env = script_env(fast_compile=False)
    # The paper's other tasks are not in the project: a clear error, before anything runs.
    proc = subprocess.run([sys.executable, script, "--task", "femnist", "--out", str(tmp_path / "none")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not available" in proc.stderr
    assert not (tmp_path / "none").exists()
    out = tmp_path / "asyncfeded"
    # --quick on Synthetic(1, 1): budget 12, P in {0, 0.9}, one seed, the constant-K ablation with K = 5 (about 50 s,
    # mostly compiling). The Fashion-MNIST task of --scale cpu: tests/test_reproduce_asyncfeded.py.
    proc = subprocess.run([sys.executable, script, "--quick", "--task", "synthetic", "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["ablation.png", "accuracy.png", "metrics_vs_p.png", "results.json", "table.md"]
    table = (out / "table.md").read_text()
    assert table in proc.stdout  # the table is also printed
    methods = ["AsyncFedED", "FedAsync+Constant", "FedAsync+Hinge", "FedAvg", "FedProx"]
    assert all(table.count(f"| {m} |") >= 4 for m in methods)  # max accuracy, t90, time to target, uploads
    assert "| constant K = 5 |" in table and "| adaptive K (K_init = 10) |" in table
    data = json.loads((out / "results.json").read_text())
    assert f"The test set has {data['args']['test_examples']} examples" in table  # Synthetic(1, 1): 10% held out
    rows = {(r["method"], r["prob"]): r for r in data["results"]}
    assert set(rows) == {(m, p) for m in methods for p in (0.0, 0.9)} | {("AsyncFedED", 0.1), ("AsyncFedED K=5", 0.1)}
    for row in rows.values():
        assert 0.0 <= row["max_accuracy"] <= 1.0 and 0.0 <= row["time_to_90pct_max"] <= data["args"]["budget"]
    for run in data["runs"]:  # every run covers the budget on the time axis
        assert run["times"][0] == 0.0 and run["times"][-1] > data["args"]["budget"]


def test_bench_scale_parts_run_in_the_smallest_mode_and_write_their_json(tmp_path):
    """scripts/bench.py --smoke: the ACE/CA2FL, scaling, replicas and compile parts end to end at tiny sizes (about
    30-50 s, mostly compiling); a smoke test of the JSON they write, no timing assertions."""
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    env = script_env()  # XLA's backend optimizations off: half the compile time; one CPU device (no sharding)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench.py"), "--smoke", "--one-device",
                           "--parts", "ace,ca2fl,scaling,replicas,compile", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["bench.json", "bench.png"]
    assert "targets" in proc.stdout
    res = json.loads(out.read_text())
    assert res["mode"] == "smoke" and res["parts"] == ["ace", "ca2fl", "scaling", "replicas", "compile"]
    assert {"env", "data", "algorithms", "scaling", "replicas", "compile", "targets", "part_seconds",
            "total_seconds", "plot"} <= set(res)
    for name, variants in (("ace", {"1", "4"}), ("ca2fl", {"1"})):
        a = res["algorithms"][name]
        assert set(a["engine"]) == variants and set(a["speedup"]) == variants and set(a["speedup_best"]) == variants
        for v in variants:
            e = a["engine"][v]
            assert e["updates_per_second"] > 0 and e["seconds_per_step"] > 0 and e["timed_steps"] > 0
            assert {"server_bytes", "clients_bytes", "pending_bytes", "data_bytes"} <= set(e["memory_budget"])
            assert a["check"][v]["match"]  # the engine and the per-event loop computed the same model
        assert a["baseline"]["updates_per_second"] > 0 and a["baseline"]["best_segment_updates_per_second"] > 0
        assert {"server_seconds_per_step", "training_seconds_per_step", "other_seconds_per_step"} <= set(a["breakdown"])
    windows = res["algorithms"]["ace"]["engine"]["4"]["windows"]
    assert windows["L"] == 4 and 1 <= windows["max_window"] <= 4 and windows["mean_window"] >= 1
    assert res["algorithms"]["ca2fl"]["lookahead_windows_L8"]["L"] == 8
    rows = res["scaling"]["rows"]
    assert {(r["algorithm"], r["num_clients"]) for r in rows} == {("ace", 60), ("ca2fl", 60)}
    for r in rows:
        assert r["seconds_per_event"] > 0 and r["peak_rss_bytes"] > 0 and r["state_bytes"] > 0
        assert r["memory_budget"]["replicas"] == 1
    assert [r["zero_init"] for r in rows] == [True, False]  # ACE beyond real_init_max_n starts from a zero state
    replicas = res["replicas"]["ace"]["rows"]
    assert [r["replicas"] for r in replicas] == [1, 2] and replicas[0]["relative_to_one"] == 1.0
    one, two = replicas
    # R = 2 is compared with one replica timed again right before it (paired); the first row's time is kept beside
    paired = two["paired_one_seconds_per_step"]
    assert paired > 0 and "paired_one_seconds_per_step" not in one
    assert two["throughput_vs_one"] == pytest.approx(2 * paired / two["seconds_per_step"])
    assert two["throughput_vs_first_one"] == pytest.approx(2 * one["seconds_per_step"] / two["seconds_per_step"])
    assert two["cpu_throughput_vs_one"] == pytest.approx(
        two["paired_one_cpu_seconds_per_upload"] / two["cpu_seconds_per_upload"])
    if res["replicas"]["ace"]["devices"] == 2:  # (with 2 host devices R = 2 is also run with shard_replicas)
        assert two["sharded_throughput_vs_one"] == pytest.approx(2 * paired / two["sharded_seconds_per_step"])
    assert two["best_throughput_vs_one"] == max(two["throughput_vs_one"], two.get("sharded_throughput_vs_one", 0.0))
    compiled = res["compile"]
    assert compiled["runs"] and compiled["runs"][0]["algorithm"] == "fedbuff"
    assert compiled["compile_seconds_total"] > 0 and compiled["wall_seconds"] >= compiled["compile_seconds_total"]
    names = [t["name"] for t in res["targets"]]
    assert any(n.startswith("ACE: engine (lookahead off)") for n in names)
    assert any(n.startswith("default experiment: compile") for n in names)
    assert "ace: R replicas together / the R run one by one, worst R (R = 2)" in names
    assert all(t["status"] in ("PASS", "MISS") for t in res["targets"])
