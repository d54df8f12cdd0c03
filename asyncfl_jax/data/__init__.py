"""Datasets (host arrays), client data (device arrays) and partitioners.

* :class:`Dataset`, :class:`ClientData` — the data contract (``client_data.py``).
* :func:`synthetic_leaf` — LEAF/FedProx Synthetic(α, β), procedural, the embedded default dataset.
* :func:`load_leaf` — LEAF FEMNIST (writers) and Shakespeare (speaking roles) from LEAF JSON or Flower parquet files.
* :func:`load_fashion_mnist`, :func:`load_mnist`, :func:`find_idx_dir` — MNIST-format IDX files.
* :func:`partition` and the partitioners :func:`iid`, :func:`dirichlet`, :func:`shards`, :func:`power_law`, with
  :func:`partition_summary` and :func:`plot_partition`.
"""

from asyncfl_jax.data.client_data import ClientData, Dataset
from asyncfl_jax.data.idx import (
    DatasetNotFoundError,
    IdxFormatError,
    find_idx_dir,
    load_fashion_mnist,
    load_idx_dataset,
    load_mnist,
    read_idx,
)
from asyncfl_jax.data.leaf import (
    ALL_LETTERS,
    LEAF_DATASETS,
    LeafFormatError,
    choose_clients,
    encode_text,
    find_leaf_files,
    load_leaf,
)
from asyncfl_jax.data.partition import (
    PARTITIONERS,
    dirichlet,
    iid,
    partition,
    partition_options,
    partition_summary,
    plot_partition,
    power_law,
    shards,
)
from asyncfl_jax.data.synthetic import DEFAULT_MAX_SAMPLES, synthetic_leaf
from asyncfl_jax.data.tfds_data import (
    TFDS_DATASETS,
    TfdsNotPreparedError,
    default_tfds_data_dir,
    find_tfds_dir,
    load_tfds,
    tfds_name,
)

__all__ = [
    "ClientData",
    "Dataset",
    "DatasetNotFoundError",
    "IdxFormatError",
    "find_idx_dir",
    "load_fashion_mnist",
    "load_idx_dataset",
    "load_mnist",
    "read_idx",
    "ALL_LETTERS",
    "LEAF_DATASETS",
    "LeafFormatError",
    "choose_clients",
    "encode_text",
    "find_leaf_files",
    "load_leaf",
    "PARTITIONERS",
    "dirichlet",
    "iid",
    "partition",
    "partition_options",
    "partition_summary",
    "plot_partition",
    "power_law",
    "shards",
    "DEFAULT_MAX_SAMPLES",
    "synthetic_leaf",
    "TFDS_DATASETS",
    "TfdsNotPreparedError",
    "default_tfds_data_dir",
    "find_tfds_dir",
    "load_tfds",
    "tfds_name",
]
