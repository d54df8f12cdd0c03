"""LEAF FEMNIST (writers) and Shakespeare (speaking roles) from tiny LEAF JSON and parquet files the tests write."""

from __future__ import annotations

import io
import json
import os
import sys

import numpy as np
import pytest

from asyncfl_jax import cli
from asyncfl_jax.cli import config_from_argv
from asyncfl_jax.config import ConfigError, validate
from asyncfl_jax.data import ALL_LETTERS, DatasetNotFoundError, LeafFormatError, encode_text, load_leaf

# LEAF's models/utils/language_utils.py, written out here independently of the package.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"

WRITERS = {"f0003_12": (5, 2), "f0001_40": (3, 1), "f0002_07": (4, 2), "f0000_14": (6, 1)}  # (train, test)
ROLES = {"THE_TEMPEST_PROSPERO": (4, 1), "HAMLET_OPHELIA": (3, 2), "KING_LEAR_FOOL": (5, 1)}
PARQUET_WRITERS = {"f0000_14": 10, "f0001_40": 3, "f0002_07": 7}
PARQUET_ROLES = {"HAMLET_OPHELIA": 10, "KING_LEAR_FOOL": 4}


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


def _texts(rng: np.random.Generator, n: int, length: int) -> list[str]:
    return ["".join(LEAF_LETTERS[i] for i in rng.integers(0, len(LEAF_LETTERS), length)) for _ in range(n)]


def _write_leaf(folder, files: dict[str, dict[str, dict]]) -> None:
    """LEAF's layout: folder/{train,test}/<file>.json, each {"users", "num_samples", "user_data"}."""
    for rel, user_data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"users": list(user_data), "num_samples": [len(d["y"]) for d in
                                                                               user_data.values()],
                                    "user_data": user_data}))


@pytest.fixture
def femnist_json(tmp_path):
    """Returns (folder, {writer: (train_x [n,28,28], train_y, test_x, test_y)}); writers over two train files."""
    rng = np.random.default_rng(1)
    truth, train, test = {}, [{}, {}], {}
    for k, (writer, (n_train, n_test)) in enumerate(WRITERS.items()):
        x = _images(rng, n_train + n_test) / 255.0
        y = rng.integers(0, 62, n_train + n_test)
        truth[writer] = (x[:n_train], y[:n_train], x[n_train:], y[n_train:])
        train[k % 2][writer] = {"x": x[:n_train].reshape(n_train, -1).tolist(), "y": y[:n_train].tolist()}
        test[writer] = {"x": x[n_train:].reshape(n_test, -1).tolist(), "y": y[n_train:].tolist()}
    folder = tmp_path / "femnist" / "data"
    _write_leaf(folder, {"train/all_data_0_train.json": train[0], "train/all_data_1_train.json": train[1],
                         "test/all_data_0_test.json": test})
    return folder, truth


@pytest.fixture
def shakespeare_json(tmp_path):
    rng = np.random.default_rng(2)
    truth, train, test = {}, {}, {}
    for role, (n_train, n_test) in ROLES.items():
        x = _texts(rng, n_train + n_test, 80)
        y = _texts(rng, n_train + n_test, 1)
        truth[role] = (x[:n_train], y[:n_train], x[n_train:], y[n_train:])
        train[role] = {"x": x[:n_train], "y": y[:n_train]}
        test[role] = {"x": x[n_train:], "y": y[n_train:]}
    folder = tmp_path / "shakespeare" / "data"
    _write_leaf(folder, {"train/train.json": train, "test/test.json": test})
    return folder, truth


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def femnist_parquet(tmp_path):
    """Flower's flwrlabs/femnist columns (image as the `datasets` Image struct); rows of the writers interleaved."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    rows = [(w, j) for w, n in PARQUET_WRITERS.items() for j in range(n)]
    rows = [rows[i] for i in rng.permutation(len(rows))]
    images = _images(rng, len(rows))
    labels = rng.integers(0, 62, len(rows))
    table = pa.table({
        "image": [{"bytes": _png(img), "path": None} for img in images],
        "writer_id": [w for w, _ in rows],
        "hsf_id": [0] * len(rows),
        "character": labels.tolist(),
    })
    folder = tmp_path / "femnist_parquet"
    (folder / "data").mkdir(parents=True)
    half = len(rows) // 2
    pq.write_table(table.slice(0, half), folder / "data" / "train-00000-of-00002.parquet")
    pq.write_table(table.slice(half), folder / "data" / "train-00001-of-00002.parquet")
    truth = {w: (images[[i for i, r in enumerate(rows) if r[0] == w]] / np.float32(255.0),
                 labels[[i for i, r in enumerate(rows) if r[0] == w]]) for w in PARQUET_WRITERS}
    return folder, truth


@pytest.fixture
def shakespeare_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    ids = [r for r, n in PARQUET_ROLES.items() for _ in range(n)]
    x, y = _texts(rng, len(ids), 80), _texts(rng, len(ids), 1)
    folder = tmp_path / "shakespeare_parquet"
    folder.mkdir()
    pq.write_table(pa.table({"character_id": ids, "x": x, "y": y}), folder / "train.parquet")
    truth = {r: ([a for a, i in zip(x, ids) if i == r], [b for b, i in zip(y, ids) if i == r]) for r in PARQUET_ROLES}
    return folder, truth


def _ids(text: str) -> list[int]:
    return [LEAF_LETTERS.index(c) for c in text]


def _rows(x: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in np.asarray(x, np.float32)}


# ------------------------------------------------------------------------------------------------- vocabulary
def test_vocabulary_is_leafs_and_encoding_matches_a_plain_reference():
    assert ALL_LETTERS == LEAF_LETTERS and len(set(ALL_LETTERS)) == 80
    text = "To be, or not to be: that is the question.\n[Exit HAMLET] }"
    assert encode_text(text).tolist() == _ids(text)
    with pytest.raises(LeafFormatError, match="'ö' is not in LEAF's 80-character"):
        encode_text("schön")


# ------------------------------------------------------------------------------------------------- LEAF JSON
def test_femnist_json_gives_writers_as_clients(femnist_json):
    folder, truth = femnist_json
    ds = load_leaf("leaf/femnist", folder, num_clients=len(WRITERS), seed=0)
    assert (ds.name, ds.num_classes, ds.input_shape) == ("leaf/femnist", 62, (28, 28, 1))
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
    order = sorted(WRITERS)  # every writer, sorted by id
    assert [len(p) for p in ds.natural_partition] == [WRITERS[w][0] for w in order]
    for part, writer in zip(ds.natural_partition, order):
        x, y, _, _ = truth[writer]
        np.testing.assert_array_equal(ds.train_x[part][..., 0], x.astype(np.float32))
        np.testing.assert_array_equal(ds.train_y[part], y)
    np.testing.assert_array_equal(ds.test_x[..., 0], np.concatenate([truth[w][2] for w in order]).astype(np.float32))
    np.testing.assert_array_equal(ds.test_y, np.concatenate([truth[w][3] for w in order]))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_clients_are_drawn_with_the_data_seed_and_sorted(femnist_json, seed):
    folder, truth = femnist_json
    ds = load_leaf("leaf/femnist", folder, num_clients=2, seed=seed)
    ids = sorted(WRITERS)
    expected = sorted(ids[i] for i in np.random.default_rng(seed).choice(len(ids), 2, replace=False))
    got = []
    for part in ds.natural_partition:
        first = ds.train_x[part][0, ..., 0]
        got.append(next(w for w in ids if np.array_equal(truth[w][0][0].astype(np.float32), first)))
    assert got == expected
    np.testing.assert_array_equal(ds.test_y, np.concatenate([truth[w][3] for w in expected]))
    again = load_leaf("leaf/femnist", folder, num_clients=2, seed=seed)
    np.testing.assert_array_equal(again.train_x, ds.train_x)


def test_shakespeare_json_gives_roles_and_next_character_ids(shakespeare_json):
    folder, truth = shakespeare_json
    ds = load_leaf("leaf/shakespeare", folder.parent, num_clients=3, seed=5)  # the parent with a data/ subfolder
    assert (ds.num_classes, ds.input_shape, ds.train_x.dtype) == (80, (80,), np.float32)
    for part, role in zip(ds.natural_partition, sorted(ROLES)):
        x, y, _, _ = truth[role]
        assert ds.train_x[part].astype(int).tolist() == [_ids(s) for s in x]
        assert ds.train_y[part].tolist() == [_ids(c)[0] for c in y]
    assert ds.test_y.tolist() == [_ids(c)[0] for r in sorted(ROLES) for c in truth[r][3]]


def test_json_user_split_and_bad_entries_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    train = {"A": {"x": _texts(rng, 2, 80), "y": ["a", "b"]}}
    _write_leaf(tmp_path / "user_split", {"train/t.json": train,
                                          "test/t.json": {"B": {"x": _texts(rng, 1, 80), "y": ["c"]}}})
    with pytest.raises(LeafFormatError, match="-t sample"):
        load_leaf("leaf/shakespeare", tmp_path / "user_split", num_clients=1)
    _write_leaf(tmp_path / "short", {"train/t.json": {"A": {"x": ["too short"], "y": ["a"]}},
                                     "test/t.json": {"A": {"x": _texts(rng, 1, 80), "y": ["c"]}}})
    with pytest.raises(LeafFormatError, match="string of 80 characters"):
        load_leaf("leaf/shakespeare", tmp_path / "short", num_clients=1)
    _write_leaf(tmp_path / "label", {"train/t.json": {"A": {"x": [[0.5] * 784], "y": [62]}},
                                     "test/t.json": {"A": {"x": [[0.5] * 784], "y": [0]}}})
    with pytest.raises(LeafFormatError, match=r"integer in \[0, 62\)"):
        load_leaf("leaf/femnist", tmp_path / "label", num_clients=1)


def test_too_many_clients_and_missing_files_are_refused(femnist_json, tmp_path, monkeypatch):
    folder, _ = femnist_json
    with pytest.raises(ValueError, match="has 4 clients with training samples; choose between 1 and 4"):
        load_leaf("leaf/femnist", folder, num_clients=5)
    monkeypatch.delenv("ASYNCFL_FEMNIST_DIR", raising=False)
    monkeypatch.setenv("ASYNCFL_DATA_DIR", str(tmp_path / "nothing"))
    with pytest.raises(DatasetNotFoundError, match="flwrlabs/femnist") as info:
        load_leaf("leaf/femnist", None)
    assert "preprocess.sh" in str(info.value) and str(tmp_path / "nothing" / "femnist") in str(info.value)
    monkeypatch.setenv("ASYNCFL_DATA_DIR", str(folder.parent.parent))  # <parent>/femnist/data/{train,test}
    assert load_leaf("leaf/femnist", None, num_clients=4).train_x.shape[0] == sum(n for n, _ in WRITERS.values())


# ------------------------------------------------------------------------------------------------- parquet
def test_femnist_parquet_holds_out_ten_percent_of_each_writer(femnist_parquet):
    folder, truth = femnist_parquet
    ds = load_leaf("leaf/femnist", folder, num_clients=3, seed=7)
    order = sorted(PARQUET_WRITERS)
    rng = np.random.default_rng(7)  # the documented rule: one permutation per client, in sorted id order
    test_rows = []
    for part, writer in zip(ds.natural_partition, order):
        x, y = truth[writer]
        n = len(y)
        n_train = max(1, int(0.9 * n))
        perm = rng.permutation(n)
        keep, held = np.sort(perm[:n_train]), np.sort(perm[n_train:])
        assert len(part) == n_train
        np.testing.assert_array_equal(ds.train_x[part][..., 0], x[keep])
        np.testing.assert_array_equal(ds.train_y[part], y[keep])
        test_rows.append((x[held], y[held]))
    np.testing.assert_array_equal(ds.test_x[..., 0], np.concatenate([t[0] for t in test_rows]))
    np.testing.assert_array_equal(ds.test_y, np.concatenate([t[1] for t in test_rows]))
    assert len(ds.test_y) == sum(n - max(1, int(0.9 * n)) for n in PARQUET_WRITERS.values())


def test_shakespeare_parquet(shakespeare_parquet):
    folder, truth = shakespeare_parquet
    ds = load_leaf("leaf/shakespeare", folder, num_clients=2, seed=0)
    for part, role in zip(ds.natural_partition, sorted(PARQUET_ROLES)):
        pairs = {(tuple(_ids(a)), _ids(b)[0]) for a, b in zip(*truth[role])}
        got = {(tuple(r), int(t)) for r, t in zip(ds.train_x[part].astype(int).tolist(), ds.train_y[part])}
        assert len(got) == len(part) and got <= pairs
    assert len(ds.test_y) == sum(n - max(1, int(0.9 * n)) for n in PARQUET_ROLES.values())


def test_parquet_without_the_columns_or_without_pyarrow_is_refused(shakespeare_parquet, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder, _ = shakespeare_parquet
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(pa.table({"speaker": ["A"], "x": ["a" * 80], "y": ["b"]}), bad / "t.parquet")
    with pytest.raises(LeafFormatError, match=r"missing \['character_id'\]"):
        load_leaf("leaf/shakespeare", bad, num_clients=1)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    cfg = config_from_argv(["--preset", "asyncfeded/shakespeare/fedavg", "--set", f"data.path={folder}"])
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[leaf\]" from a clone'):
        validate(cfg)


# ------------------------------------------------------------------------------------------------- config and CLI
def test_config_refuses_mismatched_models_and_partitions(femnist_json, shakespeare_json):
    femnist, shakespeare = str(femnist_json[0]), str(shakespeare_json[0])
    cases = [
        (["--dataset", "leaf/shakespeare", "--data-dir", shakespeare, "--model", "mlp"], "use shakespeare_lstm"),
        (["--dataset", "leaf/shakespeare", "--data-dir", shakespeare, "--model", "femnist_cnn"], "needs image data"),
        (["--dataset", "synthetic", "--model", "shakespeare_lstm"], "needs data.name = 'leaf/shakespeare'"),
        (["--dataset", "leaf/femnist", "--data-dir", femnist, "--model", "shakespeare_lstm"], "reads character ids"),
        (["--dataset", "leaf/femnist", "--data-dir", femnist, "--partition", "iid"], "keeps its natural clients"),
    ]
    for argv, message in cases:
        with pytest.raises(ConfigError, match=message):
            validate(config_from_argv(["--algorithm", "fedbuff", *argv]))
    validate(config_from_argv(["--algorithm", "fedbuff", "--dataset", "leaf/femnist", "--data-dir", femnist,
                               "--model", "femnist_cnn"]))


SMALL_RUN = ["--set", "local.steps=1", "--set", "local.batch_size=2", "--seeds", "0", "--no-progress", "--no-plot",
             "--no-checkpoint"]


def test_femnist_preset_runs_on_leaf_json(femnist_json, tmp_path, capsys):
    folder, _ = femnist_json
    out = tmp_path / "out"
    argv = ["run", "--preset", "asyncfeded/femnist/fedavg", "--set", f"data.path={folder}", "--set",
            "data.num_clients=3", "--set", "runs.arrivals=6", "--out", str(out), *SMALL_RUN]
    assert cli.main(argv) == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())
    assert (saved["data"]["name"], saved["data"]["num_clients"], saved["model"]["name"]) == (
        "leaf/femnist", 3, "femnist_cnn")
    assert os.path.exists(out / "metrics.csv")


def test_shakespeare_preset_runs_on_parquet(shakespeare_parquet, tmp_path, capsys):
    folder, _ = shakespeare_parquet
    out = tmp_path / "out"
    argv = ["run", "--preset", "asyncfeded/shakespeare/fedavg", "--set", f"data.path={folder}", "--set",
            "data.num_clients=2", "--set", "runs.arrivals=2", "--out", str(out), *SMALL_RUN]
    assert cli.main(argv) == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())
    assert (saved["data"]["name"], saved["model"]["name"]) == ("leaf/shakespeare", "shakespeare_lstm")


@pytest.mark.parametrize("task", ["femnist", "shakespeare"])
def test_preset_without_files_exits_2_with_how_to_get_them(task, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(f"ASYNCFL_{task.upper()}_DIR", raising=False)
    monkeypatch.delenv("ASYNCFL_DATA_DIR", raising=False)
    code = cli.main(["run", "--preset", f"asyncfeded/{task}/fedavg", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"leaf/{task}" in err and "the dataset files are missing" in err
    assert f"flwrlabs/{task}" in err and "preprocess.sh" in err
    assert not (tmp_path / "out").exists()
