"""The persistent compilation cache (``asyncfl_jax.compile_cache``): where it lives, how it is turned off, bad folders
refused, and results bit-identical with and without it (cold and warm)."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
import pytest

from asyncfl_jax import DelayModel, LocalConfig, cli, fedbuff, make_model, make_schedule, make_task, simulate
from asyncfl_jax.compile_cache import (ENV_VAR, CacheSettings, apply_settings, current_settings, default_cache_dir,
                                       enable_compile_cache, resolve_cache_dir)
from asyncfl_jax.config import ConfigError
from asyncfl_jax.data import synthetic_leaf


@pytest.fixture
def restore_cache_settings():
    """The test may change JAX's cache settings; the session's are put back afterwards."""
    saved = current_settings()
    yield saved
    apply_settings(saved)


@pytest.fixture
def no_jax_cache_dir(restore_cache_settings):
    """No folder set in JAX (the session's cache is off while the test runs)."""
    apply_settings(CacheSettings(None, restore_cache_settings.min_compile_time_secs,
                                 restore_cache_settings.min_entry_size_bytes))


def test_default_folder_is_the_user_cache_folder():
    assert default_cache_dir({"XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/asyncfl_jax/jax")
    assert default_cache_dir({}) == Path.home() / ".cache" / "asyncfl_jax" / "jax"
    assert default_cache_dir({"XDG_CACHE_HOME": "relative"}) == Path.home() / ".cache" / "asyncfl_jax" / "jax"


def test_precedence_path_then_env_then_jax_then_default(no_jax_cache_dir, tmp_path):
    env = {ENV_VAR: str(tmp_path / "env"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert resolve_cache_dir(tmp_path / "given", env) == tmp_path / "given"
    assert resolve_cache_dir(None, env) == tmp_path / "env"
    assert resolve_cache_dir(" ", env) == tmp_path / "env"  # blank counts as not given
    assert resolve_cache_dir(None, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == tmp_path / "xdg/asyncfl_jax/jax"
    assert resolve_cache_dir(None, {ENV_VAR: "", "XDG_CACHE_HOME": str(tmp_path / "xdg")}) == \
        tmp_path / "xdg/asyncfl_jax/jax"
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax"))
    assert resolve_cache_dir(None, {"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == tmp_path / "jax"
    assert resolve_cache_dir(None, env) == tmp_path / "env"


@pytest.mark.parametrize("word", ["off", "OFF", "0", "false", "no", "none"])
def test_off_words_turn_it_off(restore_cache_settings, tmp_path, word):
    assert resolve_cache_dir(word, {ENV_VAR: str(tmp_path)}) is None
    assert resolve_cache_dir(None, {ENV_VAR: word}) is None
    assert resolve_cache_dir(tmp_path, {ENV_VAR: word}) == tmp_path  # an explicit folder wins
    assert enable_compile_cache(None, environ={ENV_VAR: word}) is None
    assert current_settings().directory is None


def test_relative_folder_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_cache_dir(None, {ENV_VAR: "rel/cache"}) == tmp_path / "rel" / "cache"


def test_enable_creates_a_private_folder_and_sets_jax(restore_cache_settings, tmp_path):
    folder = enable_compile_cache(environ={ENV_VAR: str(tmp_path / "new" / "cache")}, min_compile_time_secs=0.5,
                                  min_entry_size_bytes=-1)
    assert folder == tmp_path / "new" / "cache" and folder.is_dir()
    assert folder.stat().st_mode & 0o077 == 0
    assert current_settings() == CacheSettings(str(folder), 0.5, -1)


def test_a_folder_that_cannot_be_used_is_refused(restore_cache_settings, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    before = current_settings()
    with pytest.raises(ConfigError,
                       match=r"invalid option \$ASYNCFL_COMPILE_CACHE = '.*afile/sub': cannot create the folder "
                             r".*'off'"):
        enable_compile_cache(environ={ENV_VAR: str(afile / "sub")})
    with pytest.raises(ConfigError,
                       match=r"invalid option compile cache folder = '.*afile': it exists and is not a folder"):
        enable_compile_cache(afile)
    assert current_settings() == before  # nothing changed


@pytest.mark.parametrize("kwargs, message", [
    ({"min_compile_time_secs": -1.0}, "min_compile_time_secs = -1.0: must be a number >= 0"),
    ({"min_compile_time_secs": float("nan")}, "min_compile_time_secs = nan"),
    ({"min_compile_time_secs": "1"}, "min_compile_time_secs = '1'"),
    ({"min_entry_size_bytes": -2}, "min_entry_size_bytes = -2: must be an integer >= -1"),
    ({"min_entry_size_bytes": 1.5}, "min_entry_size_bytes = 1.5"),
])
def test_bad_thresholds_are_refused(restore_cache_settings, tmp_path, kwargs, message):
    before = current_settings()
    with pytest.raises(ConfigError, match=message):
        enable_compile_cache(tmp_path / "never", **kwargs)
    assert not (tmp_path / "never").exists() and current_settings() == before


def test_importing_the_package_changes_no_jax_setting():
    import subprocess
    import sys

    code = ("import jax; before = (jax.config.jax_compilation_cache_dir, "
            "jax.config.jax_persistent_cache_min_compile_time_secs); import asyncfl_jax; "
            "assert before == (jax.config.jax_compilation_cache_dir, "
            "jax.config.jax_persistent_cache_min_compile_time_secs); print(before)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")
           and not k.startswith("JAX_PERSISTENT_CACHE")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(None, 1.0)"


class _CacheEvents:
    """Counts JAX's persistent-cache hits and misses while registered."""

    def __init__(self):
        self.counts = {"hits": 0, "misses": 0}

    def __call__(self, event: str, **kwargs) -> None:
        for kind in self.counts:
            if event == f"/jax/compilation_cache/cache_{kind}":
                self.counts[kind] += 1

    def __enter__(self):
        jax.monitoring.register_event_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_listener(self)


def _tiny_run():
    data = synthetic_leaf(num_clients=6, seed=2, max_samples=60)
    task = make_task(data, data.natural_partition, make_model("mlp", data.input_shape, data.num_classes, hidden=[8]))
    schedule = make_schedule("concurrent", 6, 12, DelayModel(), seed=0, concurrency=3, buffer_size=2, refill="boundary")
    return simulate(task, fedbuff(), schedule, LocalConfig(steps=2, batch_size=4), seeds=[0], eval_every=4,
                    progress=False)


def test_results_are_bit_identical_compiled_and_loaded_from_the_cache(restore_cache_settings, tmp_path):
    """The cold run compiles every program (as with no cache) and writes it; the warm run loads every one."""
    runs = {}
    enable_compile_cache(tmp_path / "cache")
    for name in ("cold", "warm"):
        jax.clear_caches()  # no executable kept in memory: each run compiles or loads from the folder
        with _CacheEvents() as events:
            runs[name] = _tiny_run()
        if name == "cold":
            assert events.counts["misses"] > 0 and events.counts["hits"] == 0
            assert len(os.listdir(tmp_path / "cache")) >= events.counts["misses"]
        else:
            assert events.counts["hits"] > 0 and events.counts["misses"] == 0  # every program loaded
    np.testing.assert_array_equal(runs["warm"].final_params, runs["cold"].final_params)
    assert runs["warm"].metrics.keys() == runs["cold"].metrics.keys()
    for k in runs["cold"].metrics:
        np.testing.assert_array_equal(runs["warm"].metrics[k], runs["cold"].metrics[k])


def test_cli_uses_the_env_folder_and_no_compile_cache_turns_it_off(restore_cache_settings, tmp_path, monkeypatch):
    """Three identical runs: compiled and written (cold), loaded (warm), compiled with the cache off: same files."""
    small = ["--set", "data.num_clients=8", "--set", "runs.arrivals=12", "--set", "local.steps=1", "--model",
             "logreg", "--set", "eval_points=2", "--no-progress", "--no-plot", "--no-checkpoint", "--algorithm",
             "fedbuff", "--concurrency", "4", "--buffer-size", "2"]
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env-cache"))
    counts = {}
    for name, extra in (("cold", []), ("warm", []), ("off", ["--no-compile-cache"])):
        jax.clear_caches()
        with _CacheEvents() as events:
            assert cli.main(["run", "--out", str(tmp_path / name), *small, *extra]) == 0
        counts[name] = dict(events.counts)
        expected = None if name == "off" else str(tmp_path / "env-cache")
        assert current_settings().directory == expected
    assert counts["cold"]["misses"] > 0 and counts["cold"]["hits"] == 0
    assert counts["warm"]["hits"] > 0 and counts["warm"]["misses"] == 0
    assert counts["off"] == {"hits": 0, "misses": 0}
    for name in ("warm", "off"):
        for file in ("metrics.csv", "schedules"):
            assert _contents(tmp_path / name / file) == _contents(tmp_path / "cold" / file)


def _contents(path: Path) -> dict[str, bytes]:
    """A file's bytes, or every file's bytes under a folder by relative path."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_cli_refuses_an_unusable_cache_folder(restore_cache_settings, tmp_path, monkeypatch, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv(ENV_VAR, str(afile))
    assert cli.main(["run", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "invalid option $ASYNCFL_COMPILE_CACHE" in err and "'off'" in err
    assert not (tmp_path / "out").exists()
