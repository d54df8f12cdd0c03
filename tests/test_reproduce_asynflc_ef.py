"""asyncfl_jax.reproduce.asynflc_ef (scripts/reproduce_asynflc_ef.py): its method names and bit costs, the paper's
reference ratios, the paper-scale plan and the missing-data error, and a tiny end-to-end run (so it never rots). The
window schedule and the delay statistics are tested in test_timing_window.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from asyncfl_jax.algorithms.compression import message_bits
from asyncfl_jax.reproduce import asynflc_ef as R

from support import ROOT, script_env

SCRIPT = os.path.join(ROOT, "scripts", "reproduce_asynflc_ef.py")


def _env(**extra):
    return script_env(fast_compile=False, **extra)


def test_method_names_algorithms_and_paper_bits():
    d = 10_000
    cases = {  # name: (algorithm name, compressor, paper bits per upload)
        "FedBuff": ("fedbuff", None, 32 * d),
        "AsynFL": ("asynfl", None, 32 * d),
        "AsynFLC(Q4b)": ("asynflc", "qsgd_max", 4 * d),
        "AsynFLC(top3)": ("asynflc", "top_k", 32 * 300),
        "AsynFLC(sign)": ("asynflc", "sign", d),
        "AsynFLC-EF(top10)": ("asynflc_ef", "top_k", 32 * 1000),
        "AsynFLC-EF(top3+Q2b)": ("asynflc_ef", "top_k_qsgd", 2 * 300),
        "AsynFLC-EF(top0.5+Q8b)": ("asynflc_ef", "top_k_qsgd", 8 * 50),
    }
    for name, (algorithm, compressor, bits) in cases.items():
        method = R.parse_method(name)
        alg = method.build()
        assert alg.name == algorithm and alg.options.get("compressor") == compressor, name
        assert method.paper_bits(d) == bits, name
        # The package's payload is the paper's bits plus the quantizers' / scaled sign's one float32 scale.
        scale = 32 if compressor in ("qsgd_max", "top_k_qsgd", "sign") else 0
        assert message_bits(alg, d)[0] == bits + scale, name
    assert R.parse_method("AsynFLC(Q4b)", qsgd_norm="l2").build().options["compressor"] == "qsgd"
    assert R.parse_method("AsynFLC-EF(top3+Q4b)").bit_fraction == pytest.approx(0.03 * 4 / 32)
    assert R.ef_name(0.06, None) == "AsynFLC-EF(top6)" and R.ef_name(0.1, 4) == "AsynFLC-EF(top10+Q4b)"
    with pytest.raises(ValueError, match="unknown method"):
        R.parse_method("AsynFLC-EF(rand3)")


def test_paper_reference_reproduces_the_ratios_quoted_in_the_text():
    # "AsynFLC-EF with Top 3% reaches 48.74x, and ... Top 3% and QSGD (b=2) reaches 860.29x" (AlexNet).
    assert R.paper_reference("cifar10_alexnet", "AsynFLC-EF(top3)")["bits_ratio"] == pytest.approx(48.74, abs=0.01)
    assert R.paper_reference("cifar10_alexnet", "AsynFLC-EF(top3+Q2b)")["bits_ratio"] == pytest.approx(860.29,
                                                                                                        abs=0.01)
    # FedBuff needs 1.37x AsynFL's uploads on the CIFAR-10 CNN (digest, derived checks).
    assert R.paper_reference("cifar10_cnn", "FedBuff")["uploads_ratio"] == pytest.approx(1.37, abs=0.01)
    assert R.paper_reference("fmnist_mlp", "AsynFLC-EF(top6+Q2b)") is None  # not a Table III column
    assert R.paper_reference(None, "AsynFL") is None


def test_paper_scale_plan_and_a_missing_dataset_stops_before_anything_runs(tmp_path, capsys):
    empty = tmp_path / "tfds"
    empty.mkdir()
    assert R.main(["--scale", "paper", "--dry-run", "--tfds-data-dir", str(empty)]) == 0
    plan = capsys.readouterr().out
    lines = {line.split(":")[0]: line for line in plan.splitlines() if not line.startswith(" ")}
    assert set(lines) == {"mnist_mlp", "fmnist_mlp", "cifar10_cnn", "cifar10_alexnet"}
    for name, line in lines.items():
        assert "n = 100" in line and "batch 128" in line and "K = 10" in line and "W = 500 s (wait)" in line
        assert "dirichlet(0.4)" in line and "seeds [0, 1, 2]" in line and "server lr [1.0]" in line
    assert "mlp (d = 199,210)" in lines["fmnist_mlp"] and "T = 200 rounds" in lines["fmnist_mlp"]
    assert "local lr 0.01," in lines["cifar10_cnn"] and "T = 1000 rounds" in lines["cifar10_cnn"]
    alexnet = lines["cifar10_alexnet"]
    assert "d = 23,272,266" in alexnet and "local lr 0.0001" in alexnet and "(1 per program)" in alexnet
    assert "16 methods" in alexnet and "AsynFLC-EF(top6+Q2b)" in alexnet  # Table III's 12 + 4 heat-map cells
    assert "NOT AVAILABLE" in plan  # CIFAR-10 is not prepared in the empty TFDS folder
    out = tmp_path / "none"
    proc = subprocess.run([sys.executable, SCRIPT, "--scale", "paper", "--tasks", "cifar10_cnn", "--tfds-data-dir",
                           str(empty), "--out", str(out)], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cifar10 is not available" in proc.stderr and "--tasks" in proc.stderr
    assert not out.exists()


def test_quick_run_end_to_end_writes_every_output(tmp_path):
    out = tmp_path / "asynflc_ef"
    # Tiny: 10 clients, 10 rounds, one local step, on the embedded synthetic data; three methods, a 1 x 2 heat map
    # (top3 with and without 4-bit quantization) and W in {500, 1000}: six programs. XLA's backend optimizations are
    # off in the child to halve the compile time.
    flags = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]))
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--tasks", "synthetic_logreg", "--clients", "10",
                           "--rounds", "10", "--local-steps", "1", "--methods", "FedBuff", "AsynFL", "AsynFLC(top3)",
                           "--fractions", "0.03", "--quant-bits", "4", "--windows", "500", "1000", "--out", str(out)],
                          env=_env(XLA_FLAGS=flags), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["accuracy_vs_bits.png", "accuracy_vs_time.png", "heatmap.png",
                                       "results.json", "table.md", "waiting_time.png"]
    table = (out / "table.md").read_text()
    assert table in proc.stdout  # the table is also printed
    methods = ["FedBuff", "AsynFL", "AsynFLC(top3)", "AsynFLC-EF(top3+Q4b)", "AsynFLC-EF(top3)"]
    assert all(f"| {m} |" in table for m in methods)
    assert "| 0.03 |" in table and "| 1000 |" in table and "The paper's Table III" in table
    data = json.loads((out / "results.json").read_text())
    (task,) = data["tasks"]
    rows = {r["method"]: r for r in task["rows"]}
    assert list(rows) == methods
    d = task["settings"]["d"]
    assert rows["AsynFL"]["paper_bits_per_upload"] == 32 * d and rows["AsynFLC-EF(top3+Q4b)"]["quant_bits"] == 4
    assert rows["AsynFLC-EF(top3+Q4b)"]["message_bits"]["payload"] < rows["AsynFLC-EF(top3)"]["message_bits"][
        "payload"] < rows["AsynFL"]["message_bits"]["payload"] == rows["FedBuff"]["message_bits"]["payload"]
    # FedBuff gets (at least) the uploads of the window runs.
    assert rows["FedBuff"]["uploads"] >= max(s["uploads"] for s in task["settings"]["delay_statistics"])
    for r in rows.values():
        assert r["server_lr"] in (1.0, 2.0) and len(r["grid"]) == 2 and 0 <= r["final_accuracy"] <= 1
        curve = task["curves"][r["method"]]
        assert len(curve["accuracy"]) == 1 and len(curve["accuracy"][0]) == len(curve["steps"])
        assert curve["paper_bits"][0][-1] == curve["uploads"][0][-1] * r["paper_bits_per_upload"]
    assert [(c["fraction"], c["quant_bits"]) for c in task["heatmap"]] == [(0.03, 4), (0.03, 32)]
    windows = task["waiting_time"]["windows"]
    assert [w["window"] for w in windows] == [500.0, 1000.0]
    (sync,) = windows[1]["delay_statistics"]  # W = 1000 s: synchronous rounds of all clients
    assert sync["tau_max"] == 0 and sync["S_mean"] == 10
    assert windows[1]["curves"]["times"][0][-1] == 10 * 1000.0
    # --from-results remakes the table and the figures without running anything.
    again = tmp_path / "again"
    assert R.main(["--from-results", str(out / "results.json"), "--out", str(again)]) == 0
    assert sorted(os.listdir(again)) == sorted(os.listdir(out))
    assert (again / "table.md").read_text() == table
