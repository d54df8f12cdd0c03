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
    assert sorted(os.listdir(out)) == ["accuracy_vs_bits.png", "accuracy_vs_time.png", "claims_synthetic_logreg.png",
                                       "heatmap.png", "results.json", "table.md", "waiting_time.png"]
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


# ------------------------------------------------------------------------------------------------ --scale cpu_mlp
def test_cpu_mlp_scale_runs_the_claim_methods_on_five_seeds_without_heat_map_or_windows(capsys):
    args = R.parse_args(["--scale", "cpu_mlp"])
    assert args.tasks == ["fmnist_mlp_cpu"] and args.seeds == [0, 1, 2, 3, 4] and args.server_lr == [1.0, 2.0, 4.0]
    assert [m.name for m in args.method_specs] == list(R.CLAIM_METHODS)
    assert args.fractions == [] and args.windows == [] and R.all_methods(args) == args.method_specs
    # The other scales keep Table III's methods, the heat map and the Fig. 4 part.
    cpu = R.parse_args([])
    assert cpu.methods == list(R.TABLE3_METHODS) and cpu.fractions == [0.03, 0.06, 0.1] and cpu.windows == R.WINDOWS
    quick = R.parse_args(["--scale", "cpu_mlp", "--quick"])
    assert quick.seeds == [0] and quick.rounds == 30 and quick.fractions == []
    assert R.main(["--scale", "cpu_mlp", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert plan.startswith("fmnist_mlp_cpu: fashion_mnist, mlp (d = 50,890)")  # the MLP 784-64-10
    assert "seeds [0, 1, 2, 3, 4]" in plan and "5 methods" in plan


def _result(curves: dict, K: int = 10) -> dict:
    """A task result with only what the verdicts read: the settings and, per method, every seed's curve."""
    rows = [{"method": m, "server_lr": 1.0} for m in curves]
    return {"settings": {"local_steps": K, "paper_row": "fmnist_mlp", "task": "t", "seeds": [0, 1, 2]},
            "rows": rows, "curves": curves}


def _curve(final: list[float], bits_per_upload: float) -> dict:
    """Three seeds evaluated at 0, 100, ..., 1000 uploads (100 s per upload), rising to ``final[s]`` by 500
    uploads and flat after."""
    uploads = list(range(0, 1001, 100))
    return {"uploads": [uploads] * 3, "times": [[100.0 * u for u in uploads]] * 3,
            "paper_bits": [[bits_per_upload * u for u in uploads]] * 3,
            "accuracy": [[min(1.0, u / 500) * f for u in uploads] for f in final]}


def test_claim_verdicts_at_equal_uploads_time_and_bits_beside_the_papers_numbers():
    from asyncfl_jax.reproduce.verdicts import SEEDS_WITHIN_NOISE

    d = 1000
    result = _result({
        "AsynFL": _curve([0.80, 0.81, 0.82], 32 * d),
        "AsynFLC(top3)": _curve([0.70, 0.71, 0.72], 32 * 30),
        "AsynFLC-EF(top3)": _curve([0.795, 0.815, 0.805], 32 * 30)})
    verdicts = R.task_verdicts(result)
    got = {(v.claim.split(":")[0].split(" (")[0], v.budget): v for v in verdicts}
    # Only the claims whose two methods ran: 3 per-upload claims x 2 budgets, and one claim at equal bits.
    assert sorted(got) == sorted([("error feedback helps top-k", "equal uploads"),
                                  ("error feedback helps top-k", "equal virtual time"),
                                  ("top-k without error feedback loses", "equal uploads"),
                                  ("top-k without error feedback loses", "equal virtual time"),
                                  ("AsynFLC-EF(top3) ≈ AsynFL", "equal uploads"),
                                  ("AsynFLC-EF(top3) ≈ AsynFL", "equal virtual time"),
                                  ("AsynFLC-EF(top3) above AsynFL at equal bits", "equal bits sent")])
    ef = got[("error feedback helps top-k", "equal uploads")]
    assert ef.gap == pytest.approx(0.095) and ef.outcome == "holds" and ef.seeds == 3 and ef.flattened
    assert ef.paper == ("GB to 75%: 0.02 vs 0.05; uploads vs AsynFL 1.39 vs 3.47 (FMNIST (MLP, 75%))")
    parity = got[("AsynFLC-EF(top3) ≈ AsynFL", "equal uploads")]
    assert parity.gap == pytest.approx(-0.005) and parity.outcome == "within noise"
    assert parity.needs_more_seeds and parity.seeds < SEEDS_WITHIN_NOISE
    # At equal bits the budget is EF's 1000 uploads x 960 bits: AsynFL has sent that after 30 uploads, where only
    # its first evaluation (0 uploads, accuracy 0) lies.
    bits = got[("AsynFLC-EF(top3) above AsynFL at equal bits", "equal bits sent")]
    assert bits.baseline == 0.0 and bits.method == pytest.approx(0.805) and not bits.flattened
    table = "\n".join(R.verdict_section(result))
    assert table.count("| error feedback helps top-k") == 2 and "'reversed' refutes it" in table
    # Without one of a claim's methods, its rows are left out.
    del result["curves"]["AsynFLC(top3)"]
    assert {v.claim for v in R.task_verdicts(result)} == {c[0] for c in R.UPLOAD_CLAIMS[2:3] + R.BITS_CLAIMS[:1]}


def test_cpu_mlp_quick_run_writes_the_verdicts_and_the_claims_figure(tmp_path):
    out = tmp_path / "claims"
    # Tiny: the cpu_mlp methods on the embedded synthetic data (logistic regression), 8 clients, 6 rounds of one
    # local step, two seeds (a seed spread), one server lr: five programs of two replicas.
    proc = subprocess.run([sys.executable, SCRIPT, "--scale", "cpu_mlp", "--quick", "--tasks", "synthetic_logreg",
                           "--clients", "8", "--rounds", "6", "--local-steps", "1", "--seeds", "0", "1",
                           "--server-lr", "1", "--evals", "3", "--out", str(out)],
                          env=_env(XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS", ""),
                                                                    "--xla_backend_optimization_level=0"]))),
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["accuracy_vs_bits.png", "accuracy_vs_time.png", "claims_synthetic_logreg.png",
                                       "results.json", "table.md"]  # no heat map, no Fig. 4 part
    table = (out / "table.md").read_text()
    assert "Verdicts on the paper's claims (synthetic_logreg, 2 seeds" in table
    data = json.loads((out / "results.json").read_text())
    (task,) = data["tasks"]
    assert [r["method"] for r in task["rows"]] == list(R.CLAIM_METHODS) and not task["heatmap"]
    assert "waiting_time" not in task and 0 < task["settings"]["fastest_share"] < 1
    verdicts = task["verdicts"]
    assert len(verdicts) == 2 * len(R.UPLOAD_CLAIMS) + len(R.BITS_CLAIMS)
    for v in verdicts:
        assert v["seeds"] == 2 and v["outcome"] in ("holds", "reversed", "within noise")
        assert v["paper"] == "-" and f"| {v['claim']} | {v['budget']} |" in table  # synthetic: no paper row
