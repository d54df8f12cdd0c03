"""asyncfl_jax.reproduce.asyncfeded at ``--scale cpu`` (Fashion-MNIST, the MLP): its arguments and refusals, the
learning-rate sweep's choice, the verdict rows, and a tiny run end to end. (The Synthetic path's run end to end is in
test_scripts.py.)"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from asyncfl_jax.reproduce import asyncfeded
from asyncfl_jax.reproduce.settings import SettingsError

from support import ROOT, script_env

SCRIPT = os.path.join(ROOT, "scripts", "reproduce_asyncfeded.py")


def test_cpu_scale_is_fashion_mnist_and_paper_scale_is_synthetic(capsys):
    cpu = asyncfeded.parse_args([])
    assert (cpu.task, cpu.alpha, cpu.budget, cpu.probs, cpu.seeds) == ("fashion_mnist", 0.3, 60.0, [0.1, 0.5, 0.9],
                                                                        [0, 1, 2, 3, 4])
    assert cpu.client_lrs == asyncfeded.CPU_LR and cpu.feded_lambda == asyncfeded.CPU_LAMBDA
    assert cpu.ablation_prob in cpu.probs  # the ablation shares AsyncFedED's runs at P = 0.1
    synthetic = asyncfeded.parse_args(["--task", "synthetic"])  # the earlier cpu scale, unchanged
    assert (synthetic.budget, synthetic.probs, synthetic.seeds, synthetic.client_lrs) == (40.0, [0.0, 0.5, 0.9],
                                                                                          [0, 1], None)
    assert asyncfeded.parse_args(["--scale", "paper"]).task == "synthetic"
    sweep = asyncfeded.parse_args(["--sweep"])
    assert (sweep.probs, sweep.seeds, sweep.ablation_k, sweep.ablation_prob, sweep.feded_lambda) == (
        [asyncfeded.SWEEP_PROB], asyncfeded.SWEEP_SEEDS, [], asyncfeded.SWEEP_PROB, None)
    for bad, says in ((["--task", "synthetic", "--alpha", "0.1"], "--alpha apply only to --task fashion_mnist"),
                      (["--task", "synthetic", "--sweep"], "--sweep apply only"),
                      (["--scale", "paper", "--data-dir", "x"], "--data-dir apply only"),
                      (["--scale", "paper", "--task", "fashion_mnist"], "cpu-scale stand-in"),
                      (["--alpha", "0"], "--alpha must be > 0"),
                      (["--sweep", "--seeds", "0", "1"], "--sweep runs its own P")):
        with pytest.raises(SystemExit):
            asyncfeded.parse_args(bad)
        assert says in capsys.readouterr().err
    synthetic = asyncfeded.AsyncfededSettings.from_keywords(task="synthetic", quick=True)
    assert synthetic == asyncfeded.parse_settings(["--task", "synthetic", "--quick"]) and synthetic.alpha is None
    with pytest.raises(SettingsError, match="--alpha apply only to --task fashion_mnist"):
        asyncfeded.AsyncfededSettings.from_keywords(task="synthetic", alpha=0.1)


def test_sweep_chooses_the_best_mean_and_never_a_diverged_value():
    assert asyncfeded.sweep_choice({0.01: [0.6, 0.62], 0.03: [0.7, 0.66], 0.1: [0.65, 0.7]}) == 0.03
    assert asyncfeded.sweep_choice({0.01: [0.6, 0.62], 0.03: [0.9, math.nan]}) == 0.01
    times = [0.0, 5.0, 9.5, 10.0, 12.0]
    runs = [{"method": "FedAvg", "client_lr": 0.1, "times": times, "accuracy": [0.1, 0.5, 0.6, 0.8, 0.99]}]
    assert asyncfeded.sweep_scores(runs, 10.0) == {"FedAvg": {0.1: [pytest.approx(0.7)]}}  # last 10% of t <= 10


def record(method: str, prob: float, seed: int, level: float, steps_per_upload: int = 10) -> dict:
    """A run whose accuracy rises to ``level`` (plus a seed offset) over virtual time 0-12 (evaluated past the
    budget of 10, as the event clock's runs are; each seed's clock a little different)."""
    times = np.linspace(0.0, 12.0, 25) * (1 + 0.01 * seed)
    accuracy = level * (1 - np.exp(-times)) + 0.002 * seed
    uploads = np.round(8 * times)
    return {"method": method, "prob": prob, "seed": seed, "times": list(times), "accuracy": list(accuracy),
            "uploads": list(uploads), "local_steps": list(steps_per_upload * uploads)}


def test_cpu_verdict_rows_per_p_across_p_and_for_the_ablation():
    args = asyncfeded.parse_settings(["--quick", "--seeds", "0", "1", "2", "--probs", "0.1", "0.9", "--ablation-k",
                                      "5", "--budget", "10", "--methods", "AsyncFedED", "FedAsync+Constant"])
    levels = {("AsyncFedED", 0.1): 0.8, ("AsyncFedED", 0.9): 0.8, ("FedAsync+Constant", 0.1): 0.7,
              ("FedAsync+Constant", 0.9): 0.5, ("AsyncFedED K=5", 0.1): 0.85}
    records = [record(m, p, s, level, 5 if m.endswith("K=5") else 10) for (m, p), level in levels.items()
               for s in args.seeds]
    verdicts = asyncfeded.cpu_verdicts(records, args)
    assert list(verdicts) == ["Verdicts, P = 0.1, seeds [0, 1, 2]", "Verdicts, P = 0.9, seeds [0, 1, 2]",
                              "Verdicts across P (equal virtual time), seeds [0, 1, 2]",
                              "Verdicts, ablation at P = 0.1, seeds [0, 1, 2]"]
    at_p = verdicts["Verdicts, P = 0.1, seeds [0, 1, 2]"]
    assert [(v.claim, v.budget) for v in at_p] == [
        ("AsyncFedED above FedAsync+Constant", "equal uploads"),
        ("AsyncFedED above FedAsync+Constant", "equal virtual time"),
        ("AsyncFedED above FedAsync+Constant", "equal local computation"),
        ("AsyncFedED above FedAsync+Constant at t = 2.5 (faster)", "equal virtual time")]
    end = at_p[1]  # cut at the budget (10), not at the runs' last evaluation (12)
    assert end.method == pytest.approx(0.8 * (1 - math.exp(-10)) + 0.002, abs=1e-4)
    assert end.gap == pytest.approx(0.1 * (1 - math.exp(-10)), abs=1e-4) and end.outcome == "holds"
    assert end.seeds == 3 and end.flattened
    assert not at_p[3].flattened  # at t = 2.5 the curves still rise
    across = verdicts["Verdicts across P (equal virtual time), seeds [0, 1, 2]"]
    assert [(v.claim, v.outcome) for v in across] == [
        ("AsyncFedED at P = 0.9 not below P = 0.1", "within noise"),  # stable: the same curve
        ("FedAsync+Constant lower at P = 0.9 than at P = 0.1", "holds")]  # 0.7 at P = 0.1 against 0.5
    ablation = verdicts["Verdicts, ablation at P = 0.1, seeds [0, 1, 2]"]
    assert [(v.claim, v.budget, v.outcome) for v in ablation] == [
        ("adaptive K above constant K = 5", "equal uploads", "reversed"),
        ("adaptive K above constant K = 5", "equal virtual time", "reversed"),
        ("adaptive K above constant K = 5", "equal local computation", "reversed")]
    # at equal local computation K = 5 has had twice the uploads: the common budget is AsyncFedED's 10-step runs' end
    assert ablation[2].baseline == pytest.approx(0.85 * (1 - math.exp(-10)) + 0.002, abs=1e-3)


@pytest.mark.slow
def test_cpu_quick_run_writes_the_verdicts_and_the_figures(tmp_path):
    """A tiny Fashion-MNIST run in a subprocess: two methods, two seeds, no ablation, budget 2 (about 30 s, mostly
    compiling)."""
    if asyncfeded.check_dataset("fashion_mnist"):
        pytest.skip("Fashion-MNIST IDX files are not installed (apt-get install dataset-fashion-mnist)")
    out = tmp_path / "afed"
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--budget", "2", "--evals", "4", "--probs", "0.1",
                           "0.9", "--ablation-k", "--methods", "AsyncFedED", "FedAsync+Constant", "--out", str(out)],
                          env=script_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["accuracy.png", "claims_p0.1.png", "claims_p0.9.png", "metrics_vs_p.png",
                                       "results.json", "table.md"]
    table = (out / "table.md").read_text()
    assert table in proc.stdout and "Fashion-MNIST, 10 clients Dir(0.3), MLP 784-200-200-10" in table
    data = json.loads((out / "results.json").read_text())
    assert list(data["verdicts"]) == ["Verdicts, P = 0.1, seeds [0, 1]", "Verdicts, P = 0.9, seeds [0, 1]",
                                      "Verdicts across P (equal virtual time), seeds [0, 1]"]
    rows = data["verdicts"]["Verdicts, P = 0.9, seeds [0, 1]"]
    assert {v["budget"] for v in rows} == {"equal uploads", "equal virtual time", "equal local computation"}
    assert all(v["seeds"] == 2 and v["method"] is not None for v in rows)
    assert "| AsyncFedED above FedAsync+Constant | equal local computation |" in table
    for run in data["runs"]:  # every run has the three axes of the comparison, and covers the budget
        assert len(run["local_steps"]) == len(run["times"]) and run["times"][-1] > 2
        assert run["local_steps"][-1] >= run["uploads"][-1]  # at least one local step per upload
