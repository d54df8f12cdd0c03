"""asyncfl_jax.reproduce.ca2fl (scripts/reproduce_ca2fl.py): its arguments, the delay tables, the metrics, the paper
path's data, and one tiny run end to end (so the script never rots)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from asyncfl_jax.reproduce import ca2fl
from asyncfl_jax.reproduce.data import CIFAR_STATS

from support import ROOT, script_env

SCRIPT = os.path.join(ROOT, "scripts", "reproduce_ca2fl.py")


@pytest.fixture(scope="module")
def repro():
    return ca2fl


def test_scales_and_argument_checks(repro, capsys):
    cpu = repro.parse_settings([])
    assert [s.key for s in cpu.settings] == ["fashion_mnist/mlp/0.1"]
    assert (cpu.rounds, cpu.seeds, cpu.client_lr, cpu.train_subset, cpu.target) == (300, [0, 1, 2, 3, 4], 0.1, 12000,
                                                                                   0.75)
    assert cpu.ablation_setting.key == "fashion_mnist/mlp/0.1"  # the stronger label skew
    assert cpu.methods == ["asyncfl", "ca2fl", "mf8", "mf4", "mf2"]  # FedAsync etc. were not swept on this task
    paper = repro.parse_settings(["--scale", "paper"])
    assert len(paper.settings) == 6 and paper.settings[0].key == "cifar10/ca2fl_cnn/0.3"
    assert (paper.rounds, paper.seeds, paper.client_lr, paper.train_subset) == (500, [0, 1, 2], 0.01, None)
    assert paper.ablation_setting.key == "cifar10/resnet18_gn/0.3"  # Fig. 4 trains ResNet-18
    assert (paper.concurrency, paper.buffer, paper.clients, paper.server_lr, paper.weight_decay) == (20, 10, 100, 1.0,
                                                                                                    1e-4)
    # Every paper setting has its Table 2/3 row; targets as Table 1.
    for s in paper.settings:
        assert repro.paper_reference(s) == ((s.dataset, s.model, s.alpha), "same setting")
    assert [repro.target_for(s, paper) for s in paper.settings[:2]] == [0.5, 0.8]
    assert repro.target_for(paper.settings[-1], paper) is None
    quick = repro.parse_settings(["--scale", "paper", "--quick"])
    assert [s.key for s in quick.settings] == ["cifar10/ca2fl_cnn/0.3"] and quick.seeds == [0]
    assert quick.ablation_setting.key == "cifar10/ca2fl_cnn/0.3"  # the ResNet setting is not run: the first one
    assert paper.methods == list(repro.METHODS)
    synthetic = repro.parse_settings(["--dataset", "synthetic"])
    assert [s.key for s in synthetic.settings] == ["synthetic/mlp/0.1"]
    assert synthetic.ablation_setting.key == "synthetic/mlp/0.1"
    for bad in (["--settings", "cifar10/ca2fl_cnn"], ["--settings", "imagenet/ca2fl_cnn/0.3"],
                ["--settings", "cifar10/ca2fl_cnn/-1"], ["--buffer", "30"], ["--seeds", "0", "0"],
                ["--ablation-buffer", "25"], ["--ablation-setting", "cifar10/ca2fl_cnn/0.3"],
                ["--settings", "cifar10/ca2fl_cnn/0.3", "cifar10/ca2fl_cnn/0.3"]):
        with pytest.raises(SystemExit):
            repro.parse_settings(bad)
    capsys.readouterr()


def test_method_plan_and_fedasync_hyperparameters(repro):
    args = repro.parse_settings(["--settings", "cifar10/resnet18_gn/0.3", "cifar10/resnet18_gn/0.1", "--methods",
                                 *repro.METHODS])
    first, second = args.settings
    assert [m.key for m in repro.methods_for(first, args)] == list(repro.METHODS)
    assert [m.key for m in repro.methods_for(second, args)] == ["asyncfl", "ca2fl", "mf8", "mf4"]
    poly = repro.hparams_for(repro.METHODS["fedasync_polynomial"], first, args)
    assert poly == {"client_lr": 0.1, "weight_decay": 1e-4, "prox_mu": 0.1, "alpha": 0.3, "staleness_a": 0.3}
    cnn = repro.parse_setting("cifar10/ca2fl_cnn/0.3")
    assert repro.hparams_for(repro.METHODS["fedasync_constant"], cnn, args)["alpha"] == 0.3
    assert repro.hparams_for(repro.METHODS["fedasync_polynomial"], cnn, args)["alpha"] == 0.5
    assert repro.hparams_for(repro.METHODS["ca2fl"], cnn, args)["server_lr"] == 1.0
    # The default ablation: the paper's two one-dimensional sweeps and the fixed delays; --grid: the full grid.
    names = [v.name for v in repro.ablation_variants(args)]
    assert names == ["Mc=15, M=10", "Mc=25, M=10", "Mc=20, M=5", "Mc=20, M=15", "fixed halfnorm(5)"]
    grid = repro.ablation_variants(repro.parse_settings(["--grid", "--no-fixed-delay"]))
    full = {(mc, m) for mc in (15, 20, 25) for m in (5, 10, 15)}
    assert {(v.concurrency, v.buffer) for v in grid} == full - {(20, 10)}
    # FedAsync gets rounds x M client updates, one per server step, with Mc clients in flight.
    sched = repro.schedule_for(repro.METHODS["fedasync_constant"], repro.main_variant(args), 3, 0, args)
    assert sched.num_steps == 30 and sched.buffer_width == 1
    sched = repro.schedule_for(repro.METHODS["ca2fl"], repro.main_variant(args), 3, 0, args)
    assert sched.num_steps == 3 and sched.buffer_width == 10 and sched.info["refill"] == "boundary"


def test_delay_tables_follow_the_boundary_refill_identity(repro):
    args = repro.parse_settings(["--seeds", "0", "1", "--delay-rounds", "300"])
    delays = repro.delay_tables(args)
    points = {(p["concurrency"], p["buffer"]): p for p in delays["protocol"]}
    assert set(points) == {(15, 10), (20, 10), (25, 10), (20, 5), (20, 15)} == set(repro.PAPER_DELAYS)
    for (mc, m), p in points.items():
        assert p["expected"] == (mc - m) / m
        assert abs(p["tau_avg"] - p["expected"]) < 0.05 * max(p["expected"], 1)  # tau_avg -> (Mc - M) / M
    dists = delays["distributions"]
    assert delays["uniform_scales_same_events"]  # scaling every s_i by one constant changes no event's order
    assert dists["U(0,5)"]["tau_avg"] == dists["U(0,1)"]["tau_avg"] == dists["U(0,0.5)"]["tau_avg"]
    # The digest's calibration (+5 per job) brings tau_max down towards the paper's 4, tau_avg unchanged (about).
    calibrated = dists["U(0,5) + 5 (digest calibration)"]
    assert calibrated["tau_max"] < dists["U(0,5)"]["tau_max"] and calibrated["tau_max"] <= 6
    assert abs(calibrated["tau_avg"] - dists["U(0,5)"]["tau_avg"]) < 0.05


def test_run_metrics_final_tail_best_and_rounds_to_target(repro):
    rec = {"rounds": [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100],
           "accuracy": [0.1, 0.3, 0.5, 0.6, 0.62, 0.7, 0.66, 0.68, 0.69, 0.7, 0.72]}
    m = repro.run_metrics(rec, 0.65)
    assert m["final"] == 0.72 and m["best"] == 0.72 and m["r_target"] == 50.0
    assert m["tail"] == pytest.approx((0.7 + 0.72) / 2)  # the evaluations in the last 10% of rounds
    assert repro.run_metrics(rec, 0.9)["r_target"] is None and repro.run_metrics(rec, None)["r_target"] is None


@pytest.mark.slow
def test_paper_path_reads_normalised_cifar_and_builds_the_paper_task(repro, tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    args = repro.parse_settings(["--scale", "paper", "--settings", "cifar10/ca2fl_cnn/0.1", "--clients", "4",
                                 "--concurrency", "2", "--buffer", "1", "--ablation-concurrency",
                                 "--ablation-buffer", "--data-dir", str(tmp_path)])
    # Not prepared: a clear error before anything runs, and no output folder.
    assert "cifar10 is not available" in repro.check_data(args)
    assert repro.main([*sys_args(args), "--out", str(tmp_path / "none")]) == 2
    assert not (tmp_path / "none").exists()
    with tfds.testing.mock_data(num_examples=200, policy=tfds.testing.MockPolicy.USE_CODE):
        ds = repro.load_setting_dataset("cifar10", args)
    mean, std = (np.asarray(v, np.float32) for v in CIFAR_STATS[repro.CIFAR_NORMALISATION])
    raw = (ds.train_x * std + mean)
    assert ds.input_shape == (32, 32, 3) and raw.min() >= -1e-5 and raw.max() <= 1 + 1e-5  # normalised per channel
    task, local, info = repro.make_setting_task(args.settings[0], ds, args)
    assert info["num_params"] == 2_218_314 and task.num_clients == 4  # the CA2FL CNN
    sizes = np.asarray(task.train.counts)
    assert local.steps == int(np.max(2 * np.ceil(sizes / 50))) and local.epochs == 2 and local.batch_size == 50


def sys_args(args: repro.Ca2flSettings) -> list[str]:
    return ["--scale", "paper", "--settings", *[s.key for s in args.settings], "--data-dir", args.data_dir]


@pytest.mark.slow
def test_quick_run_writes_every_output(tmp_path):
    """A small run end to end in a subprocess (Synthetic(1,1), 20 rounds, one seed, a short ablation)."""
    env = script_env()
    out = tmp_path / "ca2fl"
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--dataset", "synthetic", "--rounds", "20",
                           "--methods", "asyncfl", "ca2fl", "mf2", "fedasync_polynomial",
                           "--ablation-concurrency", "25", "--ablation-buffer", "5", "--delay-rounds", "100",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["ablation.png", "accuracy.png", "claims_synthetic_mlp_0.1.png", "fedasync.png",
                                       "results.json", "table.md"]
    table = (out / "table.md").read_text()
    assert table in proc.stdout
    # one seed: a verdict per claim and budget, never a win
    verdicts = json.loads((out / "results.json").read_text())["verdicts"]["synthetic/mlp/0.1"]
    assert {(v["claim"], v["budget"]) for v in verdicts} == {
        (c, b) for c in ("CA2FL above Async FL", "CA2FL above MF-CA2FL 2 bits")
        for b in ("equal uploads", "equal virtual time", "equal local computation")}
    assert all(v["outcome"] == "one seed" and v["needs_more_seeds"] for v in verdicts)
    assert "**Verdicts, synthetic/mlp/0.1, seeds [0]**" in table
    assert "Share of uploads made by the fastest 20% of the clients" in table
    for label in ("Async FL (FedBuff)", "CA2FL", "MF-CA2FL (2 bits)", "FedAsync (polynomial)"):
        assert f"| {label} |" in table
    assert "| gap CA2FL - Async FL |" in table and "| U(0,5) + 5 (digest calibration) |" in table
    data = json.loads((out / "results.json").read_text())
    rows = {(r["method"], r["variant"]): r for r in data["results"]}
    assert set(rows) == {("asyncfl", "main"), ("ca2fl", "main"), ("mf2", "main"), ("fedasync_polynomial", "main"),
                         *[(m, v) for m in ("asyncfl", "ca2fl")
                           for v in ("Mc=25, M=10", "Mc=20, M=5", "fixed halfnorm(5)")]}
    for row in rows.values():
        assert 0.0 <= row["final"] <= 1.0 and row["diverged"] == 0
    for run in data["runs"]:
        assert run["rounds"][0] == 0 and run["rounds"][-1] == 20
        expected = 20 * (10 if run["method"] == "fedasync_polynomial" else run["buffer"])
        assert run["uploads"][-1] == expected  # every method gets rounds x M client updates
    # The main point of Async FL and CA2FL: staleness about (Mc - M) / M.
    assert 0.6 < rows[("ca2fl", "main")]["tau_avg"] < 1.2
    assert data["delays"]["uniform_scales_same_events"] is True
    assert any(c.startswith("CA2FL above Async FL") for c in data["checks"])


def test_a_split_that_cannot_be_drawn_stops_before_any_training(tmp_path):
    """Dir(0.01) over 100 clients of 3,000 examples with 10 each: refused with the setting named, nothing run."""
    proc = subprocess.run([sys.executable, SCRIPT, "--dataset", "synthetic", "--settings", "synthetic/mlp/0.3",
                           "synthetic/mlp/0.01", "--train-subset", "3000", "--rounds", "2", "--seeds", "0",
                           "--no-ablation", "--delay-rounds", "5", "--out", str(tmp_path / "out")],
                          env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "setting synthetic/mlp/0.01: dirichlet: no split" in proc.stderr
    assert "replicas" not in proc.stderr  # no program ran, not even the first setting's
