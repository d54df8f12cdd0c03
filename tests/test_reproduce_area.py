"""asyncfl_jax.reproduce.area (scripts/reproduce_area.py): the paper's tables, the Poisson event model, the horizon cut,
the metrics, and a tiny end-to-end run (the wrapper that keeps the state at empty steps is tested in
test_algorithm_wrappers.py)."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from asyncfl_jax.algorithms import skip_empty_steps
from asyncfl_jax.reproduce import area as area_module
from asyncfl_jax.timing import client_rates, poisson_delays

from support import ROOT, script_env

SCRIPT = os.path.join(ROOT, "scripts", "reproduce_area.py")


@pytest.fixture(scope="module")
def area():
    return area_module


def _env():
    return script_env()  # XLA's backend optimizations off in the child: less compile time (one program per method)


# ------------------------------------------------------------------------------------------------ the paper's tables
def test_paper_tables_hold_every_printed_row(area):
    paper = area.PAPER
    assert {t for t, _, _ in paper} == set(range(3, 11))
    for table in range(3, 11):
        for method in area.PAPER_METHODS:
            for std in (0.0, 5.0):
                rows = paper[(table, method, std)]
                expected = 1 if (table, method, std) == (7, "AREA", 0.0) else 2  # Table 7 prints "-" there
                assert len(rows) == expected, (table, method, std)
                for row in rows.values():
                    assert row["acc_min"] <= row["acc"] <= row["acc_max"]
                    assert row["loss_min"] <= row["loss"] <= row["loss_max"]
    assert paper[(3, "AREA", 0.0)][1e3] == {"rho": 0.09, "acc": 87.54, "acc_min": 79.38, "acc_max": 91.41,
                                             "loss": 0.59, "loss_min": 0.47, "loss_max": 0.91}
    assert paper[(4, "S-FedAvg", 5.0)][1e3]["rho"] is None  # ">1"
    assert paper[(7, "AREA", 5.0)][1e2]["acc"] == 84.14
    assert paper[(10, "FedBuff", 5.0)][1e-1]["loss_max"] == 0.92
    # The settings name the tables of each split.
    assert {s["tables"]["dirichlet"] for s in area.SETTINGS.values()} == {3, 4, 5, 6}
    assert {s["tables"]["iid"] for s in area.SETTINGS.values()} == {7, 8, 9, 10}
    assert area.paper_best("n128_m1", "dirichlet", 0.0, "acc") == ("AREA", 87.54)
    assert area.paper_best("n4_m1", "dirichlet", 0.0, "rho") == ("FedBuff", 0.05)


def test_every_paper_method_maps_to_a_project_algorithm(area):
    from asyncfl_jax.algorithms import REGISTRY

    for method in (*area.PAPER_METHODS, *area.EXTRA_METHODS):
        name, options, kind, fixed = area.METHODS[method]
        assert name in REGISTRY and kind in ("synchronous", "buffered", "per_arrival")
        skip_empty_steps(REGISTRY[name](**options))


# ------------------------------------------------------------------------------------------------ event model
def test_rates_are_a_truncated_normal_shared_by_every_protocol(area):
    uniform = client_rates(64, 10.0, 0.0, seed=3)
    assert np.all(uniform == 10.0)
    rates = client_rates(2000, 10.0, 5.0, seed=0)
    assert rates.min() > 0.0
    assert abs(np.median(rates) - 10.0) < 0.5 and 4.3 < rates.std() < 5.2  # N(10, 5^2) truncated at 0
    np.testing.assert_array_equal(rates, client_rates(2000, 10.0, 5.0, seed=0))
    assert not np.array_equal(rates, client_rates(2000, 10.0, 5.0, seed=1))
    # The schedules of one trial carry the same rates whatever the protocol (common random numbers).
    setting = {"n": 16, "horizon": 2.0, "buffer": 4, "participants": 4}
    levels = [poisson_delays(10.0, 5.0)]
    lam = [area.horizon_schedules(kind, setting, levels, [7])[0].info["poisson_rates"]["lambda"]
           for kind in ("synchronous", "buffered", "per_arrival")]
    assert lam[0] == lam[1] == lam[2]
    np.testing.assert_allclose(lam[0], client_rates(16, 10.0, 5.0, seed=7))


def test_arrivals_are_poisson_processes_with_the_client_rates(area):
    n, horizon = 32, 40.0
    setting = {"n": n, "horizon": horizon, "buffer": 4, "participants": 4}
    for std in (0.0, 5.0):
        (sched,) = area.horizon_schedules("buffered", setting, [poisson_delays(10.0, std)], [0])
        lam = np.asarray(sched.info["poisson_rates"]["lambda"])
        real = sched.arrival_clients >= 0
        counts = np.bincount(sched.arrival_clients[real], minlength=n)
        # Each client's count is Poisson(lambda_i t_h) (minus at most the one job in flight at the horizon).
        expected = lam * horizon
        assert abs(counts.sum() / expected.sum() - 1.0) < 0.03
        z = (counts - expected) / np.sqrt(expected)
        assert np.abs(z).max() < 4.5 and abs(z.mean()) < 0.6
        # Delta = 4 arrivals per server step, up to the horizon; the mean staleness of all-active clients is about
        # n / Delta server steps.
        per_step = real.sum(axis=1)
        assert set(per_step[per_step > 0]) == {4}
        stale = sched.staleness[real]
        assert 0.75 * n / 4 < stale.mean() < 1.25 * n / 4


def test_the_horizon_cut_empties_the_late_steps_and_keeps_the_early_ones(area):
    setting = {"n": 8, "horizon": 3.0, "buffer": 4, "participants": 4}
    levels = [poisson_delays(10.0, 0.0), poisson_delays(10.0, 5.0)]
    for kind in ("buffered", "synchronous", "per_arrival"):
        cut = area.horizon_schedules(kind, setting, levels, [0, 1, 2])
        assert len(cut) == 6 and len({c.num_steps for c in cut}) == 1
        assert len({(c.buffer_width, c.dispatch_width) for c in cut}) == 1
        for c in cut:
            c.validate()
            real = c.arrival_clients >= 0
            assert np.all(c.arrival_times[real] <= 3.0)
            steps = real.any(axis=1)
            keep = int(np.searchsorted(c.step_times, 3.0, side="right"))
            assert np.all(steps[:keep]) and not np.any(steps[keep:])
            assert np.all(c.dispatch_clients[keep:] == -1)
        # The kept steps are exactly those of a plain schedule of the same trial.
        plain = area.build_schedule(kind, 8, 4, 4, levels[1], 2, cut[-1].num_steps)
        keep = int(np.searchsorted(plain.step_times, 3.0, side="right"))
        np.testing.assert_array_equal(cut[-1].arrival_clients[:keep, :plain.buffer_width],
                                      plain.arrival_clients[:keep])
        np.testing.assert_array_equal(cut[-1].step_times, plain.step_times)


# ------------------------------------------------------------------------------------------------ data
def test_the_papers_iid_splits(area):
    mnist_counts = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    labels = np.repeat(np.arange(10), mnist_counts)
    parts = area.split_data(labels, 128, "iid", 0.1)
    per_class = np.array([np.bincount(labels[p], minlength=10) for p in parts])
    assert np.all(per_class[:127] == [46, 52, 46, 47, 45, 42, 46, 48, 45, 46])  # digest section 3.3
    assert per_class[127].tolist() == [81, 138, 116, 162, 127, 87, 76, 169, 136, 107]
    parts4 = area.split_data(labels, 4, "iid", 0.1)
    per_class4 = np.array([np.bincount(labels[p], minlength=10) for p in parts4])
    assert np.all(per_class4.max(axis=0) - per_class4.min(axis=0) <= 1)
    for split in (parts, parts4, area.split_data(labels, 128, "dirichlet", 0.1)):
        everything = np.sort(np.concatenate(split))
        np.testing.assert_array_equal(everything, np.arange(labels.size))  # a partition of all the examples
        assert min(len(p) for p in split) >= 10


# ------------------------------------------------------------------------------------------------ metrics
def _record(method, alpha, trial, acc, loss, times=(0.0, 1.0, 2.0), diverged=-1):
    return {"setting": "n4_m1", "method": method, "alpha": alpha, "rate_std": 0.0, "trial": trial,
            "times": list(times), "accuracy": list(acc), "final_accuracy": acc[-1], "final_loss": loss,
            "diverged_at": diverged, "uploads": 10, "staleness_mean": 1.0}


def test_rho_retained_alphas_and_the_table(area):
    args = area.parse_settings(["--settings", "n4_m1", "--rate-stds", "0", "--methods", "AREA", "FedBuff",
                                "--trials", "2", "--horizon", "2"])
    assert args.target == 0.75  # the cpu scale's Fashion-MNIST target
    args = dataclasses.replace(args, target=0.8)  # the settings are frozen
    recs = [
        _record("AREA", 1.0, 0, [0.1, 0.7, 0.9], 0.5), _record("AREA", 1.0, 1, [0.1, 0.95, 0.9], 0.6),
        _record("AREA", 10.0, 0, [0.1, 0.5, 0.85], 0.7), _record("AREA", 10.0, 1, [0.1, 0.5, 0.77], 0.9),
        _record("AREA", 0.1, 0, [0.1, 0.2, 0.3], 2.0), _record("AREA", 0.1, 1, [0.1, 0.2, 0.3], 2.1),
        _record("AREA", 100.0, 0, [0.1, 0.1, 0.1], math.nan, diverged=5),
        _record("AREA", 100.0, 1, [0.1, 0.9, 0.9], 0.4),
        _record("FedBuff", 1.0, 0, [0.1, 0.3, 0.4], 1.5), _record("FedBuff", 1.0, 1, [0.1, 0.3, 0.5], 1.4),
    ]
    rows = {(r["method"], r["alpha"]): r for r in area.summarize(recs, args)}
    a1, a10, a01, a100 = (rows[("AREA", a)] for a in (1.0, 10.0, 0.1, 100.0))
    assert a1["acc"] == pytest.approx(90.0) and a1["acc_min"] == pytest.approx(90.0)
    assert a1["loss"] == pytest.approx(0.55)
    # Trial-mean curve: 0.1, 0.825, 0.9 at times 0, 1, 2 -> first reaches 0.8 at t = 1 (grid point at or after it).
    assert a1["rho"] == pytest.approx(0.5, abs=0.01)
    assert a1["rho_per_trial"][0] == pytest.approx(1.0, abs=0.01) and a1["rho_per_trial"][1] == pytest.approx(0.5,
                                                                                                           abs=0.01)
    assert a10["rho"] == pytest.approx(1.0, abs=0.01)  # mean 0.81 only at the horizon
    assert a01["rho"] is None  # never: ">1"
    assert a100["finite_trials"] == 1 and not a100["retained"]  # a diverged trial: not retained
    assert a1["retained"] and a10["retained"] and not a01["retained"]  # the two largest finite alphas
    assert a1["best"] and not a10["best"]
    assert rows[("FedBuff", 1.0)]["retained"] and rows[("FedBuff", 1.0)]["best"]
    table = area.format_tables(list(rows.values()), args, 1.0)
    assert "(paper Table 5)" in table
    assert "| AREA | 1 | yes * | 0.50 | 0.15 | 90.00 (90.00-90.00) | 89.30 (88.87-89.69) |" in table
    assert "| FedBuff | 0.1 | not run | - | >1 |" in table  # a paper row we did not run
    checks = area.direction_checks(list(rows.values()), args)
    assert any("highest final accuracy AREA" in c and "Paper (MNIST): highest FedBuff (90.80%)" in c for c in checks)


# ------------------------------------------------------------------------------------------------ end to end
def test_unavailable_dataset_is_a_clear_error(tmp_path):
    out = tmp_path / "none"
    proc = subprocess.run([sys.executable, SCRIPT, "--dataset", "mnist", "--data-dir", str(tmp_path / "missing"),
                           "--out", str(out)], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "mnist not found" in proc.stderr
    assert not out.exists()


def test_reproduce_area_runs_end_to_end_on_a_tiny_setting(tmp_path, area):
    out = tmp_path / "area"
    # The embedded Synthetic(1, 1) data, 6 clients, t_h = 2, two trials, two alphas, the paper's four methods.
    proc = subprocess.run([sys.executable, SCRIPT, "--dataset", "synthetic", "--clients", "6", "--horizon", "2",
                           "--trials", "2", "--alphas", "0.1", "1", "--evals", "10", "--rate-stds", "0", "5",
                           "--out", str(out)],
                          env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["claims_n128_m1_sd0.png", "claims_n128_m1_sd5.png", "curves_n128_m1.png",
                                       "heterogeneity_n128_m1.png", "results.json", "table.md"]
    table = (out / "table.md").read_text()
    assert table in proc.stdout
    for method in ("S-FedAvg", "AS-FedAvg", "FedBuff", "AREA"):
        assert table.count(f"| {method} | 0.1 |") == 2 and table.count(f"| {method} | 1 |") == 2  # both levels
    data = json.loads((out / "results.json").read_text())
    assert len(data["runs"]) == 4 * 2 * 2 * 2  # methods x levels x trials x alphas
    for run in data["runs"]:
        assert run["times"][0] == 0.0 and max(run["times"]) <= 2.0
        assert 0.0 <= run["final_accuracy"] <= 1.0 and run["uploads"] > 0
    rows = {(r["method"], r["rate_std"], r["alpha"]): r for r in data["rows"]}
    assert len(rows) == 16 and all(r["finite_trials"] == 2 for r in rows.values())
    assert rows[("S-FedAvg", 0.0, 0.1)]["staleness_mean"] == 0.0
    assert rows[("AREA", 0.0, 0.1)]["uploads"] == rows[("FedBuff", 0.0, 0.1)]["uploads"]  # the same events
    assert set(data["rates"]["n128_m1"]) == {"0", "5"} and len(data["rates"]["n128_m1"]["5"]) == 2
    assert data["client_sizes"]["n128_m1"] and sum(data["client_sizes"]["n128_m1"]) > 0
    # the verdicts: two trials, so a noise estimate; equal virtual time, uploads and local steps; uniform rates give
    # about uniform participation (the fastest 20% of the clients: about 20% of the uploads), skewed ones more
    verdicts = data["verdicts"]["n128_m1, rate sd 5"]
    assert {v["claim"] for v in verdicts} == {c[0] for c in area.CLAIMS}
    assert {v["budget"] for v in verdicts} == {"equal virtual time", "equal uploads", "equal local computation"}
    assert all(v["seeds"] == 2 and v["outcome"] != "one seed" for v in verdicts)
    assert "**Verdicts, n128_m1, rate sd 5, trials [0, 1]**" in table
    assert all(run["fastest_share"] > 0.2 for run in data["runs"] if run["rate_std"] == 5.0)
