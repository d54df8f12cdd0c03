"""Options an algorithm or protocol does not read are refused; the comparison figure; ``asyncfl plot``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asyncfl_jax import LocalConfig, cli, load_results, make_model, make_schedule, make_task, simulate
from asyncfl_jax.algorithms import ace
from asyncfl_jax.config import ConfigError, ExperimentConfig, validate
from asyncfl_jax.data import synthetic_leaf
from asyncfl_jax.figures import fitted_ylim, method_curves, plot_comparison, setting_title
from asyncfl_jax.results import History
from asyncfl_jax.timing import DelayModel

TINY = ["--set", "data.num_clients=20", "--set", "data.synthetic_max_samples=60", "--model", "logreg",
        "--set", "eval_points=2", "--no-progress", "--no-checkpoint"]


# ---------------------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("argv,expected", [
    (["--algorithm", "ace", "--concurrency", "20"], "protocol.concurrency = 20: not read by runs[0] (ace)"),
    (["--algorithm", "ace", "--refill", "immediate"], "protocol.refill"),
    (["--algorithm", "ace", "--local-steps", "5"], "local.steps = 5: not read by runs[0] (ace): ace uploads one"),
    (["--algorithm", "asgd", "--option", "upload=gradient", "--concurrency", "4", "--local-steps", "3"],
     "local.steps"),
    (["--algorithm", "ace", "--lr", "0.1"], "local.lr"),
    (["--algorithm", "ace", "--hparam", "client_lr=0.1"], "runs[0].hparams.client_lr"),
    (["--algorithm", "asyncfeded", "--local-steps", "3"], "sets each job's number of local steps"),
    (["--algorithm", "area", "--option", "lr_schedule=decreasing", "--lr", "0.1"], "replaces the client learning"),
    (["--algorithm", "fedbuff", "--participants", "3"], "protocol.participants"),
    (["--algorithm", "fedavg", "--buffer-size", "3"], "protocol.buffer_size = 3: not read by runs[0] (fedavg)"),
    (["--algorithm", "fedbuff", "--set", "runs.protocol.aggregation=periodic", "--set", "runs.protocol.period=1.0",
      "--refill", "immediate", "--buffer-size", "5", "--steps", "3"], "a server clock"),
    (["--algorithm", "ace", "--staleness", "hinge"], "staleness"),
    (["--algorithm", "ace", "--set", "local.steps=10"], "local.steps = 10"),  # the default value, given explicitly
    (["--algorithm", "ace", "--option", "cache_rounding=nearest"], "applies to the int caches"),
    (["--algorithm", "asyncfeded", "--option", "adaptive_steps=false", "--option", "min_steps=2"], "options.min_steps"),
    (["--algorithm", "asyncfeded", "--option", "adaptive_steps=false", "--hparam", "kappa=2"], "hparams.kappa"),
])
def test_an_option_that_would_be_ignored_is_refused_before_anything_runs(tmp_path, capsys, argv, expected):
    out = tmp_path / "out"
    assert cli.main(["run", *TINY, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.startswith("asyncfl: error: invalid option"), err
    assert not out.exists()


def test_a_configuration_file_key_that_would_be_ignored_is_refused():
    run = {"algorithm": "ace", "arrivals": 6, "protocol": {"name": "all_active", "concurrency": 5}}
    with pytest.raises(ConfigError, match=r"protocol.concurrency = 5: not read by runs\[0\] \(ace\)"):
        validate(ExperimentConfig.from_dict({"runs": [run]}))
    # a shared local option is refused only when no run reads it
    runs = [{"algorithm": "ace", "arrivals": 6, "protocol": {"name": "all_active"}}, {"algorithm": "fedbuff",
                                                                                       "arrivals": 20}]
    validate(ExperimentConfig.from_dict({"local": {"steps": 3}, "runs": runs}))
    with pytest.raises(ConfigError, match="local.steps = 3"):
        validate(ExperimentConfig.from_dict({"local": {"steps": 3}, "runs": runs[:1]}))


def test_from_python_a_sweep_or_setting_that_would_be_ignored_is_refused():
    data = synthetic_leaf(num_clients=4, seed=1, max_samples=60)
    task = make_task(data, data.natural_partition, make_model("logreg", data.input_shape, data.num_classes))
    schedule = make_schedule("all_active", 4, 3, DelayModel(), seed=0)
    with pytest.raises(ValueError, match="client_lr is swept over"):
        simulate(task, ace(), schedule, LocalConfig(steps=1, batch_size=4), hparams={"client_lr": [0.1, 0.2]},
                 progress=False)
    with pytest.raises(ValueError, match="local.epochs"):
        simulate(task, ace(), schedule, LocalConfig(steps=1, batch_size=4, epochs=1.0), progress=False)


@pytest.mark.parametrize("argv", [
    ["--algorithm", "fedasync", "--buffer-size", "2"],  # read: the step's arrivals are mixed in one at a time
    ["--algorithm", "ace", "--local-steps", "1"],  # states what a gradient upload does
    ["--protocol", "all_active"],  # the default runs' concurrent-only fields go back to their defaults
    ["--algorithm", "fedavg", "--participants", "3"],
])
def test_legitimate_combinations_are_accepted(capsys, argv):
    assert cli.main(["run", *TINY, *argv, "--print-config"]) == 0, capsys.readouterr().err


def test_every_resolved_configuration_is_accepted_again():
    """What ``config.json`` holds (every default written out) and ``--resume`` reads back sets nothing unread."""
    from asyncfl_jax.algorithms import REGISTRY
    from asyncfl_jax.cli import config_from_argv
    from asyncfl_jax.config import resolve
    from asyncfl_jax.presets import PRESETS

    cases = [["--algorithm", a] for a in sorted(REGISTRY)] + [["--preset", p] for p in PRESETS] + [
        [], ["--algorithm", "asyncfeded", "--option", "adaptive_steps=false"],
        ["--algorithm", "area", "--option", "lr_schedule=decreasing"]]
    for argv in cases:
        cfg = config_from_argv(argv)
        validate(cfg, check_files=False)
        validate(ExperimentConfig.from_dict(json.loads(json.dumps(resolve(cfg).to_dict()))), check_files=False)


# ---------------------------------------------------------------------------------------------- figures
def _history(label, seeds, level, spread=0.02, evaluations=6) -> History:
    """A run of ``seeds`` whose accuracy starts at chance (0.1) and then stays near ``level``."""
    rng = np.random.default_rng(len(label))
    steps = np.arange(evaluations) * 10
    acc = level + spread * rng.standard_normal((len(seeds), evaluations))
    acc[:, 0] = 0.1
    r = len(seeds)
    return History(label=label, algorithm=label, algorithm_options={}, steps=steps,
                   times=np.tile(steps * 0.5, (r, 1)).astype(float), uploads=np.tile(steps * 10, (r, 1)),
                   metrics={"test_accuracy": acc}, seeds=list(seeds), hparams=[{"server_lr": 1.0}] * r,
                   diverged_at=-np.ones(r, int), schedule_stats=[{}], num_steps=int(steps[-1]),
                   local_steps=np.tile(steps * 100.0, (r, 1)))


def test_the_comparison_figure(tmp_path):
    histories = [_history("fedbuff", [0, 1, 2], 0.80), _history("fedasync", [0, 1], 0.76),
                 _history("ace", [0], 0.70)]
    fig = plot_comparison(histories, str(tmp_path / "fig"), title="synthetic, n=6")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.pdf", "fig.png"]
    panels = fig.axes
    assert [ax.get_xlabel() for ax in panels] == ["client uploads (results received)",
                                                  "virtual time (delay-model time units)",
                                                  "local computation (local steps trained)"]
    for ax in panels:
        assert len(ax.get_lines()) == 3  # one line per method
        assert len(ax.collections) == 2  # a band for the methods with at least two seeds
        assert ax.get_legend() is None and ax.get_ylabel() == "test accuracy"
        low, high = ax.get_ylim()
        assert 0.6 < low < 0.7 and 0.8 < high < 0.9  # fitted to the data, not to the initial 0.1
    colours = [[line.get_color() for line in ax.get_lines()] for ax in panels]
    assert colours[0] == colours[1] == colours[2] and len(set(colours[0])) == 3  # a colour per method, kept
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["fedbuff (3 seeds)", "fedasync (2 seeds)",
                                                                  "ace (1 seed)"]
    assert fig._suptitle.get_text().startswith("synthetic, n=6\ntest accuracy")


def test_the_band_over_seeds():
    h = _history("fedbuff", [0, 1, 2], 0.8)
    values = h.metrics["test_accuracy"]
    (minmax,) = method_curves(h, band="minmax")
    (std,) = method_curves(h, band="std")
    np.testing.assert_allclose(minmax["lo"], values.min(axis=0))
    np.testing.assert_allclose(std["hi"], values.mean(axis=0) + values.std(axis=0))
    low, high = fitted_ylim([minmax])
    assert low < values[:, 1:].min() and high > values[:, 1:].max() and low > 0.1


def test_setting_title():
    config = ExperimentConfig().to_dict()
    config["data"].update(name="fashion_mnist", partition="dirichlet", dirichlet_alpha=0.1)
    title = setting_title(config)
    assert title.startswith("fashion_mnist, n=100, dirichlet(0.1), mlp; K=10, B=32; delays: speed uniform[0.5, 5]")


def test_a_run_folder_its_figure_and_asyncfl_plot(tmp_path, capsys):
    """One tiny run of FedBuff (K = 2 local steps per upload) against ACE (one gradient per upload, the
    initialization round's included; local.steps is shared and read by FedBuff, so it is accepted): the local steps in
    the History and metrics.csv, accuracy.png, and ``asyncfl plot`` on the folder (PNG and PDF)."""
    config = {"local": {"steps": 2, "batch_size": 8},
              "runs": [{"algorithm": "fedbuff", "arrivals": 20},
                       {"algorithm": "ace", "arrivals": 20, "protocol": {"name": "all_active"}}]}
    (tmp_path / "c.json").write_text(json.dumps(config))
    out = tmp_path / "run"
    assert cli.main(["run", *TINY, "--config", str(tmp_path / "c.json"), "--seeds", "0,1", "--out", str(out)]) == 0, \
        capsys.readouterr().err
    assert (out / "accuracy.png").is_file()
    fedbuff, ace_run = load_results(str(out))
    np.testing.assert_array_equal(fedbuff.local_steps, 2.0 * fedbuff.uploads)  # K = 2 local steps per upload
    np.testing.assert_array_equal(ace_run.local_steps, ace_run.uploads)  # one gradient per upload
    assert ace_run.uploads[0, -1] == 20 + 20  # the initialization round's 20 gradients, then 20 uploads
    fig_path = tmp_path / "figs" / "compare"
    assert cli.main(["plot", str(out), "--out", str(fig_path), "--band", "std"]) == 0
    assert sorted(p.name for p in fig_path.parent.iterdir()) == ["compare.pdf", "compare.png"]
    assert cli.main(["plot", str(tmp_path / "figs"), "--out", str(tmp_path / "x.png")]) == 2
    assert "not a finished results folder" in capsys.readouterr().err
    assert cli.main(["plot", str(out), "--out", str(tmp_path / "x.svg")]) == 2
    assert cli.main(["plot", str(out), "--out", str(tmp_path / "x.png"), "--metric", "nonsense"]) == 2


def test_local_steps_of_every_kind_of_job():
    """``local_steps_at``: K per upload, one per gradient upload, each job's own K under the event clock, and
    ``K_i = min(K, ceil(epochs ceil(n_i / B)))`` of the arriving clients with local.epochs."""
    from types import SimpleNamespace

    from asyncfl_jax.engine.history import local_steps_at

    schedule = make_schedule("concurrent", 4, 6, DelayModel(), seed=0, concurrency=2, buffer_size=1,
                             refill="immediate")
    steps = np.array([0, 3, 6])
    uploads = np.concatenate([[0], np.cumsum(schedule.uploads_per_step)])[steps]
    train = SimpleNamespace(counts=np.array([10, 20, 30, 40]))

    def run(upload="delta", **local):
        return SimpleNamespace(algorithm=SimpleNamespace(upload=upload), task=SimpleNamespace(train=train),
                               local=LocalConfig(batch_size=8, **local))

    np.testing.assert_array_equal(local_steps_at(run(steps=3), [schedule], steps, None, 0)[0], 3.0 * uploads)
    np.testing.assert_array_equal(local_steps_at(run("gradient"), [schedule], steps, None, 4)[0], uploads + 4)
    job_steps = np.array([[5, 1, 2, 7, 3, 4]])
    np.testing.assert_array_equal(local_steps_at(run(), [schedule], steps, job_steps, 0)[0], [0, 8, 22])
    per_client = np.minimum(np.ceil(1.0 * np.ceil(train.counts / 8)), 4)  # K_i = 2, 3, 4, 4
    arrived = [per_client[row[row >= 0]].sum() for row in schedule.arrival_clients]
    expected = np.concatenate([[0], np.cumsum(arrived)])[steps]
    np.testing.assert_array_equal(local_steps_at(run(steps=4, epochs=1.0), [schedule], steps, None, 0)[0], expected)
