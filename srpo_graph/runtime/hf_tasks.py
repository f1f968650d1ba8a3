"""Task files read through Hugging Face ``datasets``: Parquet files and ``save_to_disk`` folders.

Runtime stage. Consumes a path; produces ``(row number, object)`` rows that
:func:`srpo_graph.runtime.tasks.tasks_from_rows` validates with the same field checks as a
JSONL file (a missing or ill-typed field names ``file:row N`` and the field; rows count from 1
like JSONL lines). Only local data: a ``.parquet`` file (``Dataset.from_parquet``), or a folder
written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``load_from_disk``; a
``DatasetDict``'s ``train`` split, or ``FOLDER@split``) -- never the hub. JSONL stays with the
plain reader (which knows line and column). ``datasets`` is the optional extra ``datasets``
(``pip install 'srpo-graph[datasets]'``); without it such a path is an error saying so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

from srpo_graph.errors import RuntimeFailure

PARQUET = (".parquet", ".pq")


def _split(path: str | os.PathLike) -> tuple[Path, str | None]:
    text = str(path)
    if "@" in text and Path(text.rsplit("@", 1)[0]).is_dir():
        folder, split = text.rsplit("@", 1)
        return Path(folder), split
    return Path(text), None


def is_dataset_path(path: str | os.PathLike) -> bool:
    """Whether ``path`` is read through ``datasets`` (a Parquet file, a ``save_to_disk`` folder).

    >>> is_dataset_path("tasks/coord.jsonl"), is_dataset_path("tasks/coord.parquet")
    (False, True)
    """
    p, _ = _split(path)
    return p.suffix.lower() in PARQUET or (p.is_dir() and any(
        (p / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")))


def _datasets() -> Any:
    try:
        import datasets  # type: ignore[import-untyped]
    except ImportError:
        raise RuntimeFailure("reading Parquet files and `save_to_disk` folders needs Hugging Face `datasets`: "
                             "pip install 'srpo-graph[datasets]' (or give a JSONL task file)") from None
    return datasets


def read_dataset_rows(path: str | os.PathLike) -> tuple[Iterator[tuple[int, Any]], Callable[[int], str]]:
    """The rows of a dataset task file, numbered from 1, and how an error names a row.

    Raises:
        RuntimeFailure: ``datasets`` missing, the file or folder does not load, or a
            ``DatasetDict`` without the split asked for (naming the splits it has).
    """
    ds_lib = _datasets()
    p, split = _split(path)
    try:
        if p.suffix.lower() in PARQUET:
            ds = ds_lib.Dataset.from_parquet(str(p))
        else:
            ds = ds_lib.load_from_disk(str(p))
    except Exception as exc:  # noqa: BLE001 - pyarrow, fsspec, datasets: any damage is the file's, named
        raise RuntimeFailure.at(str(path), f"cannot read task dataset: {type(exc).__name__}: {exc}") from None
    if isinstance(ds, ds_lib.DatasetDict):
        name = split or ("train" if "train" in ds else (next(iter(ds)) if len(ds) == 1 else None))
        if name not in ds:
            raise RuntimeFailure.at(str(path), f"the dataset has splits {sorted(ds)}; "
                                    f"{'no split ' + repr(split) if split else 'which one?'}",
                                    fix=f"name one: {p}@{sorted(ds)[0]}")
        ds, label = ds[name], f"{p}@{name}"
    elif split is not None:
        raise RuntimeFailure.at(str(path), f"split {split!r} asked for, but the folder holds one dataset (no splits)")
    else:
        label = str(p)

    def rows() -> Iterator[tuple[int, Any]]:
        for i, row in enumerate(ds, 1):
            yield i, row

    return rows(), lambda n: f"{label}:row {n}"
