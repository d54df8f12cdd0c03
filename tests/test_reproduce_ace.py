"""asyncfl_jax.reproduce.ace (scripts/reproduce_ace.py): its pieces (ACED's active-set sizes from a schedule, the
dropout schedules, the budget and step-size rules of both scales, the claim checks) and a tiny end-to-end run of the
CPU and paper paths."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncfl_jax.reproduce import ace

from support import ROOT, script_env


# ------------------------------------------------------------------------------------------------ budget, step sizes
def test_cpu_defaults_give_every_method_the_same_uploads():
    args = ace.parse_settings([])
    assert (args.clients, args.alphas, args.betas, args.budget) == (100, [0.1], [30.0], "uploads")
    assert (args.model, args.seeds, args.skip_dropout) == ("mlp", [0, 1, 2, 3, 4], True)
    assert args.concurrency == args.asgd_concurrency == 100  # everyone always training
    assert {m: ace.server_steps(args, m) for m in ace.METHODS} == {
        "ace": 2000, "aced": 2000, "fedbuff": 200, "ca2fl": 200, "da_asgd": 2000, "vanilla_asgd": 2000}
    # the step sizes the documented sweep chose, each inside its grid; --tune sweeps the grid again
    assert {m: ace.lr_grid(args, m) for m in ace.METHODS} == {m: [v] for m, v in ace.CPU_DEFAULT_LR.items()}
    assert all(min(ace.CPU_GRIDS[m]) < v < max(ace.CPU_GRIDS[m]) for m, v in ace.CPU_DEFAULT_LR.items())
    tuned = ace.parse_settings(["--tune"])
    assert ace.lr_grid(tuned, "fedbuff") == ace.CPU_GRIDS["fedbuff"] and len(ace.lr_grid(tuned, "ace")) == 4
    assert not ace.parse_settings(["--no-skip-dropout"]).skip_dropout
    assert ace.lr_grid(ace.parse_settings(["--lr", "ace=0.5,0.7"]), "ace") == [0.5, 0.7]
    assert ace.parse_settings(["--dropout-fractions", "0.5", "0.2"]).dropout_fractions == [0.0, 0.2, 0.5]


def test_paper_defaults_follow_table_a4():
    args = ace.parse_settings(["--scale", "paper"])
    assert (args.dataset, args.model, args.budget, args.steps, args.seeds) == (
        "cifar10", "resnet18_gn", "steps", 500, [0, 1, 2, 3, 4])
    assert (args.concurrency, args.buffer_size, args.asgd_concurrency, args.client_lr) == (20, 10, 100, 0.05)
    assert (args.tau_algo, args.dropout_tau_algo, args.dropout_setting) == (50.0, 10.0, [0.3, 5.0])
    assert args.dropout_fractions == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    eta = 0.2 * math.sqrt(100 / 500)  # 0.0894, Tab. a.4
    assert all(ace.server_steps(args, m) == 500 for m in ace.METHODS)
    assert all(ace.lr_grid(args, m) == pytest.approx([eta]) for m in ace.METHODS)
    matched = ace.parse_settings(["--scale", "paper", "--delta-lr", "matched"])
    assert ace.lr_grid(matched, "ca2fl") == pytest.approx([eta / 0.05]) and ace.lr_grid(matched, "ace") == [eta]
    tuned = ace.parse_settings(["--scale", "paper", "--tune"])
    assert ace.lr_grid(tuned, "ace") == pytest.approx([c * math.sqrt(0.2) for c in ace.PAPER_C_GRID])
    c100 = ace.parse_settings(["--scale", "paper", "--dataset", "cifar100"])
    assert (c100.alphas, c100.betas) == ([0.1, 0.3, 1.0, 10.0], [1.0, 5.0, 20.0, 30.0])


def test_bad_arguments_and_unavailable_data_stop_before_running(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ace.parse_settings(["--concurrency", "5", "--buffer-size", "10"])
    with pytest.raises(SystemExit):
        ace.parse_settings(["--lr", "nope=1"])
    out = tmp_path / "none"
    assert ace.main(["--dataset", "20newsgroup", "--out", str(out)]) == 2
    assert "not available" in capsys.readouterr().err
    pytest.importorskip("tensorflow_datasets")
    # CIFAR-10 is not prepared in an empty TFDS folder: a clear error naming how to prepare it, nothing written
    assert ace.main(["--scale", "paper", "--data-dir", str(tmp_path / "tfds"), "--out", str(out)]) == 2
    assert "cifar10" in capsys.readouterr().err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ schedules
def test_delay_models_and_dropout_schedules():
    from asyncfl_jax.timing import make_schedule

    args = ace.parse_settings(["--clients", "12", "--uploads", "200"])
    model = ace.delay_model(args.delay_model, args.t_fix, 30.0)
    assert (model.speed, model.speed_value, model.noise, model.comm_time) == ("exponential", 30.0, "exponential", 1.0)
    literal = ace.delay_model("iid_exp", 1.0, 5.0)
    assert (literal.speed, literal.speed_value, literal.comm_time) == ("constant", 5.0, 0.0)
    for method in ("ace", "fedbuff", "vanilla_asgd"):
        steps = ace.server_steps(args, method)
        base = ace.make_method_schedule(args, method, 5.0, seed=3)
        dropped = ace.make_method_schedule(args, method, 5.0, seed=3, fraction=0.5)
        assert base.num_steps == dropped.num_steps == steps
        when = dropped.info["dropout_time"]
        assert when == base.step_times[steps // 2 - 1]  # the method's step T/2
        assert len(dropped.info["dropped_clients"]) == 6
        half = steps // 2
        np.testing.assert_array_equal(base.arrival_clients[:half], dropped.arrival_clients[:half])
        late = dropped.arrival_clients[dropped.step_times > when + 1e-9]
        assert not np.isin(late, dropped.info["dropped_clients"]).any()
    # every client always training: FedBuff (Mc = n, M = 10, refill on arrival) sees ACE's arrivals, 10 per step
    a, f = ace.make_method_schedule(args, "ace", 5.0, 0), ace.make_method_schedule(args, "fedbuff", 5.0, 0)
    np.testing.assert_array_equal(a.arrival_clients[:, 0], f.arrival_clients.reshape(-1))
    assert a.step_times[-1] == f.step_times[-1]
    delays = ace.delay_model(args.delay_model, args.t_fix, 5.0)
    assert make_schedule("all_active", 12, 5, delays, 0).info["protocol"] == "all_active"


def _active_counts_by_search(schedule, tau):
    """n_t from the definition: client i is in A(t) when it last reported at step s < t (s = -1: the initialization
    round) with t - (s + 1) <= tau."""
    out = []
    for t in range(schedule.num_steps):
        count = 0
        for i in range(schedule.num_clients):
            reported = np.flatnonzero((schedule.arrival_clients[:t] == i).any(axis=1))
            last = reported[-1] if reported.size else -1
            count += t - (last + 1) <= tau
        out.append(count)
    return np.asarray(out, dtype=float)


def test_aced_active_counts_equal_the_definition_and_the_algorithms_active_set():
    from asyncfl_jax.algorithms import ServerMeta, aced

    args = ace.parse_settings(["--clients", "12", "--uploads", "80"])
    schedule = ace.make_method_schedule(args, "aced", 5.0, seed=1, fraction=0.5)
    taus = [0.0, 1.0, 3.0, 10.0, 1000.0]
    counts = ace.aced_active_counts(schedule, taus)
    for tau, row in zip(taus, counts):
        np.testing.assert_array_equal(row, _active_counts_by_search(schedule, tau))
    assert np.all(counts[-1] == 12)  # tau beyond every age: all clients, dropped ones included (ACE)
    assert counts[2][-10:].max() <= 6  # tau = 3: the 6 dropped clients have left A(t)

    # The engine's ACED: with client i's gradient the unit vector e_i, the step -eta/|A| sum_A e_i has |A| non-zeros.
    n, lr = 12, 1.0
    algorithm = aced()
    hp = {"server_lr": jnp.float32(lr), "tau_algo": jnp.float32(3.0)}
    state = algorithm.init(jnp.zeros(n), n)
    eye = jnp.eye(n)
    state = algorithm.server(state, eye, ServerMeta(jnp.arange(n), jnp.ones(n, bool), jnp.zeros(n, jnp.int32),
                                                    jnp.int32(-1), jnp.float32(0), jax.random.PRNGKey(0)), hp)
    server = jax.jit(algorithm.server)
    seen = []
    for t in range(schedule.num_steps):
        clients = jnp.asarray(schedule.arrival_clients[t])
        mask = clients >= 0
        meta = ServerMeta(clients, mask, jnp.asarray(np.maximum(schedule.staleness[t], 0)), jnp.int32(t),
                          jnp.float32(0), jax.random.PRNGKey(t))
        new = server(state, eye[jnp.maximum(clients, 0)], meta, hp)
        seen.append(int(jnp.count_nonzero(new.x - state.x)))
        state = new
    np.testing.assert_array_equal(seen, counts[2])


def test_checks_compute_the_amplification_index_and_dropout_claims():
    args = ace.parse_settings(["--methods", "ace", "fedbuff", "--dropout-fractions", "0", "0.5", "--alphas", "0.1",
                               "0.3", "--betas", "5", "30"])
    acc = {("ace", 0.1, 5.0): 0.80, ("ace", 0.1, 30.0): 0.79, ("ace", 0.3, 5.0): 0.82, ("ace", 0.3, 30.0): 0.81,
           ("fedbuff", 0.1, 5.0): 0.78, ("fedbuff", 0.1, 30.0): 0.70, ("fedbuff", 0.3, 5.0): 0.80,
           ("fedbuff", 0.3, 30.0): 0.79}
    rows = [{"method": m, "alpha": a, "beta": b, "accuracy": v} for (m, a, b), v in acc.items()]
    drop = [{"method": m, "fraction": f, "accuracy": v} for m, f, v in
            (("ace", 0.0, 0.82), ("ace", 0.5, 0.70), ("aced", 0.0, 0.81), ("aced", 0.5, 0.79))]
    checks = ace.direction_checks(rows, drop, [], args)
    text = "\n".join(checks)
    assert "ACE has the highest final accuracy (Fig. 2, Tab. a.2): yes (4/4" in text
    assert "FedBuff +0.0700" in text and "ACE +0.0000" in text  # (0.78-0.70) - (0.80-0.79); (0.80-0.79)-(0.82-0.81)
    assert "keeps more of its accuracy than ACE from 0% to 50% dropout (Fig. 3a): yes" in text
    assert "ACED >= ACE at every dropout fraction > 0: yes" in text


@pytest.mark.slow
def test_a_program_over_the_memory_budget_runs_in_halves(monkeypatch, capsys):
    from asyncfl_jax.data import partition, synthetic_leaf
    from asyncfl_jax.models.core import make_model
    from asyncfl_jax.task import make_task

    from asyncfl_jax.reproduce import grid

    real = grid.simulate
    calls = []

    def budgeted(task, algorithm, schedules=None, **kwargs):
        calls.append(len(kwargs["replicas"]))
        if len(kwargs["replicas"]) > 1:
            raise MemoryError("the simulation state needs more than 90% of the device memory")
        return real(task, algorithm, schedules, **kwargs)

    monkeypatch.setattr(grid, "simulate", budgeted)  # the name the shared runner (run_grid) looks up
    args = ace.parse_settings(["--clients", "10", "--uploads", "40", "--seeds", "0", "1", "--betas", "5", "--evals",
                               "4"])
    data = synthetic_leaf(num_clients=30, seed=0)
    task = make_task(data, partition("dirichlet", data.train_y, 10, seed=0, alpha=0.3),
                     make_model("logreg", data.input_shape, data.num_classes))
    recs = ace.run_program(task, args, "fedbuff", ace.main_settings(args), "fedbuff", [2.0])
    assert calls == [2, 1, 1]
    assert [(r["seed"], r["server_lr"]) for r in recs] == [(0, 2.0), (1, 2.0)]
    assert "do not fit" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ end to end
def _env():
    return script_env()


@pytest.mark.slow
def test_quick_cpu_run_writes_the_figures_and_the_table_beside_table_a2(tmp_path):
    out = tmp_path / "ace"
    # alpha 0.3 = the dropout study's alpha and one tau_algo: the dropout runs share the main programs (6 programs)
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "reproduce_ace.py"), "--quick", "--dataset", "synthetic",
           "--clients", "12", "--uploads", "120", "--alphas", "0.3", "--tau-algo", "10", "--tau-ablation", "1", "100",
           "--out", str(out)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["accuracy.png", "accuracy_steps.png", "claims_a0.3_b30.png",
                                       "claims_a0.3_b5.png", "dropout.png", "results.json", "table.md"]
    table = (out / "table.md").read_text()
    assert table in proc.stdout
    # the verdict tables: every claim at the three equal budgets, with the fastest clients' share of the uploads
    assert "**Verdicts, Dir(α=0.3), β=30, seeds [0]**" in table and "share of uploads made by the fastest 20%" in \
        table.lower()
    verdicts = json.loads((out / "results.json").read_text())["verdicts"]["0.3/30"]
    assert {(v["claim"], v["budget"]) for v in verdicts} == {(c[0], b) for c in ace.CLAIMS for b in (
        "equal uploads", "equal virtual time", "equal local computation")}
    assert {v["outcome"] for v in verdicts} <= {"one seed", "diverged"}  # one seed: never a win
    for label in ace.LABELS.values():
        assert f"| {label}" in table
    assert "63.7 ± 1.7" in table and "49.3 ± 2.8" in table  # Tab. a.2's ACE and Vanilla ASGD, DistilBERT alpha 0.1
    assert "20Newsgroup itself is not reproduced" in table
    res = json.loads((out / "results.json").read_text())
    main = {(r["method"], r["beta"]): r for r in res["main"]}
    assert set(main) == {(m, b) for m in ace.METHODS for b in (5.0, 30.0)}
    for b in (5.0, 30.0):
        # the same uploads (ACE and ACED also upload in their initialization round) and the same virtual time
        assert {main[(m, b)]["uploads"] for m in ("fedbuff", "ca2fl", "da_asgd", "vanilla_asgd")} == {120}
        assert main[("ace", b)]["uploads"] == main[("aced", b)]["uploads"] == 120 + 12
        assert len({round(main[(m, b)]["virtual_time"], 9) for m in ace.METHODS}) == 1
        assert main[("fedbuff", b)]["server_steps"] == 12 and main[("ace", b)]["server_steps"] == 120
        for m in ace.METHODS:
            assert main[(m, b)]["server_lr"] in res["grids"][m]
            assert 0 <= main[(m, b)]["accuracy"] <= 1
    drop = {(r["method"], r["fraction"]): r for r in res["dropout"]}
    assert set(drop) == {(m, f) for m in ace.DROPOUT_METHODS for f in (0.0, 0.5)}
    assert all(drop[(m, 0.0)]["server_lr"] == drop[(m, 0.5)]["server_lr"] for m in ace.DROPOUT_METHODS)
    ablation = {(r["tau"], r["fraction"]): r for r in res["ablation"]}
    assert set(ablation) == {(t, f) for t in (1.0, 10.0, 100.0) for f in (0.0, 0.5)}
    active = {key: row["aced_active_after_dropout"] for key, row in ablation.items()}  # mean |A(t)|, second half
    assert active[(1.0, 0.0)] <= 2.0 < active[(10.0, 0.0)]
    assert ablation[(100.0, 0.0)]["aced_active_mean"] == 12.0  # tau beyond every age: ACE's all-n mean
    for run in res["dropout_runs"]:
        if run["fraction"] > 0:
            assert run["schedule"]["dropout_time"] > 0
    assert any(c.startswith("ACED (τ_algo=10) keeps more of its accuracy") for c in res["checks"])


@pytest.mark.slow
def test_paper_path_on_mock_cifar(tmp_path, capsys):
    """--scale paper end to end on TFDS's mock CIFAR-10 (random images): the Tab. a.4 settings (T server iterations
    for every method, eta = 0.2 sqrt(n/T)) with a small model and small Mc, M, and ACED's dropout study."""
    tfds = pytest.importorskip("tensorflow_datasets")
    out = tmp_path / "paper"
    argv = ["--scale", "paper", "--quick", "--model", "logreg", "--clients", "10", "--steps", "20", "--seeds", "0",
            "1", "--betas", "5", "--concurrency", "6", "--buffer-size", "3", "--methods", "ace", "fedbuff",
            "--dropout-methods", "aced", "--tau-ablation", "1", "--out", str(out)]
    with tfds.testing.mock_data(num_examples=200, policy=tfds.testing.MockPolicy.USE_CODE):
        assert ace.main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in res["main"]}
    assert set(rows) == {"ace", "fedbuff"} and rows["ace"]["server_steps"] == rows["fedbuff"]["server_steps"] == 20
    assert rows["fedbuff"]["uploads"] == 60 and rows["ace"]["uploads"] == 30  # 20 x M = 3; 20 + n = 10
    eta = 0.2 * math.sqrt(10 / 20)
    assert rows["ace"]["server_lr"] == pytest.approx(eta) and rows["fedbuff"]["server_lr"] == pytest.approx(eta)
    assert rows["ace"]["seeds"] == [0, 1] and rows["ace"]["accuracy_2se"] is not None
    # the dropout study at alpha 0.3 (not in the main grid): ACED's step size is selected on its own 0% runs
    assert res["dropout_server_lr"] == {"aced": pytest.approx(eta)}
    assert {(r["tau"], r["fraction"]) for r in res["ablation"]} == {(t, f) for t in (1.0, 10.0) for f in (0.0, 0.5)}
    assert {r["fraction"] for r in res["dropout"]} == {0.0, 0.5}
    assert sorted(os.listdir(out)) == ["accuracy.png", "accuracy_steps.png", "claims_a0.1_b5.png", "dropout.png",
                                       "results.json", "table.md"]
    assert "CIFAR-10" in capsys.readouterr().out
