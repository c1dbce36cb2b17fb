"""The users' HDF5 file as a mel record source (one row of each dataset per audio file).

Layout (written by the users' ``leak_dataset_builder``): ``labels`` [F] int16,
``segments_waveform`` [F, num_long, num_short, short_window] float32,
``segments_mel`` [F, num_long, num_short, n_mels, t] float16, and string
attributes ``config_json``, ``labels_json`` (names in id order),
``label2id_json``. Which parameters are checked against the file's
``config_json``, and when, is :mod:`cachebuild.mel.h5_config`'s business.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import numpy as np

from cachebuild.errors import SourceError
from cachebuild.mel.config import MelConfig
from cachebuild.mel.h5_config import (
    FileParams,
    check_mel_shape,
    check_recompute,
    config_differences,
    read_file_params,
    stored_config,
)
from cachebuild.mel.records import build_records, check_range
from cachebuild.mel.spectrogram import log_mel

__all__ = ["H5Source", "StoredMelWarning", "H5_DEFAULT_DATASETS"]

#: Role -> dataset name in the users' layout (``--h5-dataset ROLE=NAME`` renames).
H5_DEFAULT_DATASETS = {"labels": "labels", "mel": "segments_mel", "waveform": "segments_waveform"}


class StoredMelWarning(UserWarning):
    """Stored mels are copied with parameters other than the config's (the records say which)."""


class H5Source:
    """Files stored in the users' HDF5 layout (one row of each dataset per file).

    Datasets (names overridable with ``datasets``; map a role to None to ignore
    it): ``labels`` [F] int; ``segments_mel`` [F, num_long, num_short, n_mels, t],
    copied as they are (cast to ``cfg.dtype``) when present; else the mel is
    recomputed from ``segments_waveform`` [F, num_long, num_short, short_window]
    (also read when ``store_waveform``). Label names come from the
    ``label2id_json`` attribute (else ``labels_json`` if it is a mapping or a
    list of names, else the ids as strings); with ``cfg.labels`` ids are
    remapped by name to the configured mapping.

    The file's ``config_json``: when mels are recomputed, every parameter it
    states that changes the numbers must equal the config's (else SourceError
    naming key, both values and the ``--set`` flag); when stored mels are copied,
    :attr:`cfg` becomes the config that describes them (ours, with every key the
    file states) and the records' JSON says so; :attr:`requested_cfg` keeps ours.

    Reads are one slice per dataset per ``records()`` call. The file is opened
    on first use in each process (the handle is never pickled) with a 64 MiB
    chunk cache that evicts fully read chunks first.
    """

    kind = "h5"
    RDCC_NBYTES = 64 * 2**20
    RDCC_NSLOTS = 100_003  # prime, ~ 100x the chunks that fit

    def __init__(self, path: str | os.PathLike[str], cfg: MelConfig, datasets: dict[str, str | None] | None = None) -> None:
        self.path = str(path)
        self.requested_cfg = self.cfg = cfg
        self.datasets = {**H5_DEFAULT_DATASETS, **(datasets or {})}
        self._named = {role for role, name in (datasets or {}).items() if name}  # roles the user named explicitly
        self._file: Any = None
        self._pid: int | None = None
        try:
            self._inspect(self._h5())
        except BaseException:
            self.close()
            raise

    def _inspect(self, f: Any) -> None:
        """Read labels and attributes, check shapes and parameters against the config."""
        self._mel_ds = self._dataset(f, "mel")
        self._wave_ds = self._dataset(f, "waveform")
        labels_name = self.datasets["labels"]
        if labels_name is None or labels_name not in f:
            has = ", ".join(sorted(f.keys())) or "no datasets"
            raise SourceError(f"{self.path}: no labels dataset '{labels_name or ''}' (--h5-dataset labels=NAME names it); the file has: {has}")
        if self._mel_ds is None and self._wave_ds is None:
            raise SourceError(f"{self.path}: neither '{self.datasets['mel']}' nor '{self.datasets['waveform']}' dataset found")
        raw_labels = np.asarray(f[labels_name][...]).reshape(-1)
        self._n = int(raw_labels.shape[0])
        self.file_config = _json_attr(f, "config_json", self.path)
        params = read_file_params(self.file_config, self.path)
        self._params_from_file = sorted(params.values)
        if self._mel_ds is not None:
            self._use_stored(f, params)
        else:
            assert self._wave_ds is not None
            check_recompute(self.cfg, params, self.path, self._wave_ds)
        self._check_waveform(f)
        self.label2id, self._labels, self._names = self._resolve_labels(f, raw_labels)

    def _use_stored(self, f: Any, params: FileParams) -> None:
        """Stored mels are copied: describe them with the file's parameters, check the shape."""
        self.cfg = stored_config(self.requested_cfg, params, self.path)
        assert self._mel_ds is not None  # called only when the file stores mels
        check_mel_shape(self._mel_ds, tuple(f[self._mel_ds].shape), self._n, self.cfg, params, self.path)
        stored, kept = np.dtype(f[self._mel_ds].dtype), np.dtype(self.cfg.dtype)
        if stored.kind == "f" and stored.itemsize > kept.itemsize:  # "copied as they are" does not hold: say so
            warnings.warn(
                f"{self.path}: dataset '{self._mel_ds}' is {stored}, stored as {kept} (the config's dtype), which rounds its values; pass --set dtype=float32 to keep float32 precision",
                StoredMelWarning,
                stacklevel=4,
            )
        diffs = config_differences(self.requested_cfg, self.cfg)
        if diffs:
            warnings.warn(
                f"{self.path}: copying the stored '{self._mel_ds}' as they are, made with other parameters than the config's ({'; '.join(diffs)}); the records state the stored ones",
                StoredMelWarning,
                stacklevel=4,
            )

    def _check_waveform(self, f: Any) -> None:
        cfg = self.cfg
        if cfg.store_waveform and self._wave_ds is None:
            raise SourceError(f"{self.path}: store_waveform is set but the file has no '{self.datasets['waveform']}' dataset")
        want = (self._n, cfg.num_long, cfg.num_short, cfg.short_window)
        if self._wave_ds is not None and tuple(f[self._wave_ds].shape) != want:
            raise SourceError(f"{self.path}: dataset '{self._wave_ds}' has shape {f[self._wave_ds].shape}, config expects {want} [files, num_long, num_short, short_window]")

    # -- pickling and lazy opening
    def __getstate__(self) -> dict[str, Any]:
        """What a worker gets: no open file, and the absolute path (a running Dask or Ray cluster's workers have
        their own working folders; records name the file by its base name, so they do not change)."""
        state = self.__dict__.copy()
        state["_file"], state["_pid"] = None, None
        state["path"] = os.path.abspath(self.path)
        return state

    def _h5(self) -> Any:
        if self._file is None or self._pid != os.getpid():
            import h5py  # imported here: only this source needs it

            try:
                self._file = h5py.File(self.path, "r", rdcc_nbytes=self.RDCC_NBYTES, rdcc_nslots=self.RDCC_NSLOTS, rdcc_w0=1.0)
            except OSError as exc:
                if not os.path.exists(self.path):  # h5py's own text is five clauses of C error state
                    raise SourceError(f"{self.path}: no such file") from exc
                raise SourceError(f"{self.path}: cannot open HDF5 file: {exc}") from exc
            self._pid = os.getpid()
        return self._file

    def close(self) -> None:
        """Close this process's handle (it is reopened on the next read)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file, self._pid = None, None

    def _dataset(self, f: Any, role: str) -> str | None:
        name = self.datasets.get(role)  # None or "" (``--h5-dataset mel=``): ignore the role
        if name and role in self._named and name not in f:  # a typo must not silently fall back to another dataset
            raise SourceError(f"{self.path}: no dataset '{name}' (--h5-dataset {role}={name}); the file has: {', '.join(sorted(f.keys()))}")
        return name if name and name in f else None

    def _resolve_labels(self, f: Any, raw: np.ndarray) -> tuple[dict[str, int], np.ndarray, list[str]]:
        id2name = _file_id2name(f, raw, self.path)
        file_map = {name: i for i, name in id2name.items()}
        unknown = sorted(set(np.unique(raw).tolist()) - set(id2name))
        if unknown:
            first = int(np.flatnonzero(raw == unknown[0])[0])
            raise SourceError(f"{self.path}: label {unknown[0]} of file {first} is not in the file's label mapping {file_map}")
        target = self.cfg.label2id or {name: idx for idx, name in sorted(id2name.items())}
        missing = sorted(set(id2name.values()) - set(target))
        if missing:
            raise SourceError(f"{self.path}: label names {missing} are not in the config's labels {target}")
        lut = {old: target[name] for old, name in id2name.items()}
        labels = np.array([lut[int(v)] for v in raw], dtype=np.int16)
        names = [id2name[int(v)] for v in raw]
        return dict(target), labels, names

    def input_files(self) -> list[str]:
        """The HDF5 file (for the builder's changed-input note)."""
        return [self.path]

    # -- MelSource
    def __len__(self) -> int:
        return self._n

    def records(self, start: int, stop: int) -> list[dict[str, Any]]:
        """Records of files ``[start, stop)``: one slice read per dataset."""
        check_range(start, stop, self._n)
        f = self._h5()
        wave = None
        try:
            if self._wave_ds is not None and (self.cfg.store_waveform or self._mel_ds is None):
                wave = np.asarray(f[self._wave_ds][start:stop], dtype=np.float32)
            if self._mel_ds is not None:
                mel = np.asarray(f[self._mel_ds][start:stop]).astype(self.cfg.dtype, copy=False)
            else:
                assert wave is not None
                mel = log_mel(wave, self.cfg).astype(self.cfg.dtype, copy=False)
        except OSError as exc:
            raise SourceError(f"{self.path}: cannot read files [{start}, {stop}): {exc}") from exc
        name = os.path.basename(self.path)  # records must not depend on where the file lives
        paths = [f"{name}#{i}" for i in range(start, stop)]
        return build_records(self.cfg, start, mel, self._labels[start:stop], paths, self._names[start:stop], wave, self.mel_from)

    @property
    def mel_from(self) -> str:
        """``"stored"`` (the file's mels copied) or ``"computed"`` (from its waveforms)."""
        return "stored" if self._mel_ds else "computed"

    def describe(self) -> dict[str, Any]:
        counts = {name: int(np.sum(self._labels == idx)) for name, idx in self.label2id.items()}
        return {
            "kind": self.kind,
            "path": self.path,
            "n_files": self._n,
            "label2id": self.label2id,
            "label_counts": counts,
            "mel_from": self.mel_from,
            "mel_params_from_file": self._params_from_file,
            "datasets": self.datasets,
            "file_config": self.file_config,
        }


def _as_id(value: Any) -> int | None:
    """``value`` as a label id (an int, or a string of one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _mapping_id2name(table: dict[Any, Any], attr: str, path: str) -> dict[int, str]:
    """A label mapping in either direction (``{"LEAK": 0}`` or ``{"0": "LEAK"}``) -> ``{id: name}``."""
    if all(_as_id(v) is not None for v in table.values()):
        return {_as_id(v): str(k) for k, v in table.items()}  # type: ignore[misc]
    if all(_as_id(k) is not None and isinstance(v, str) for k, v in table.items()):
        return {_as_id(k): v for k, v in table.items()}  # type: ignore[misc]
    raise SourceError(f"{path}: attribute {attr} must map label names to integer ids (or ids to names), got {json.dumps(table)[:200]}")


def _file_id2name(f: Any, raw: np.ndarray, path: str) -> dict[int, str]:
    """The file's label ids -> names: ``label2id_json``, else ``labels_json`` (a mapping or names in id order), else the ids."""
    for attr in ("label2id_json", "labels_json"):
        table = _json_attr(f, attr, path)
        if isinstance(table, dict) and table:
            return _mapping_id2name(table, attr, path)
        if attr == "labels_json" and isinstance(table, list) and table and all(isinstance(s, str) for s in table) and len(set(table)) == len(table):
            return dict(enumerate(table))
    return {int(v): str(int(v)) for v in np.unique(raw)}


def _json_attr(f: Any, name: str, path: str) -> Any:
    """A JSON string attribute of the file, parsed; None when absent."""
    if name not in f.attrs:
        return None
    raw = f.attrs[name]
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    try:
        return json.loads(str(raw))
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: attribute {name} is not valid JSON: {exc}") from exc
