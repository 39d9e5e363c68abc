"""Token corpora on disk: document lengths for planning, token ids for the collate function.

Each source gives ``lengths`` (an integer numpy array, one entry per document, read without a
Python loop per document: int64, or for Megatron its int32 array memory-mapped) and ``source[i]`` (document i's token ids, a 1-D numpy array), so it drops into
``wlb.torch.PackedBatchSampler(source.lengths, ...)`` and a ``DataLoader(source, ...)``. Sources
reopen their files lazily in each DataLoader worker when pickled to it (spawn: the path travels,
not the data; fork shares the parent's memory).

- ``MegatronTokens(prefix)``: a Megatron-LM indexed dataset ``prefix.idx`` / ``prefix.bin``; the
  ``.idx`` is checked chunk by chunk by the C++ reader (``wlb.scan_megatron_index``, the reader
  behind ``wlb-plan --docs corpus.idx``) and its arrays memory-mapped (``lengths`` is int32, as
  Megatron stores it), tokens are read from the ``.bin`` through ``numpy.memmap``. One Megatron
  sequence is one document; any number of them (10^9 and more) opens in constant memory.
- ``ArrowTokens(source, column="input_ids")``: a list-of-integers column of a ``pyarrow.Table``,
  a Parquet file, an Arrow IPC file or stream (``.arrow``, as Hugging Face ``datasets`` caches
  them), a JSON-lines file (``.jsonl`` / ``.json``, also gzip or zstd compressed: ``.jsonl.gz``,
  ``.jsonl.zst``; read by ``pyarrow.json`` with its block sized from the longest line, so lines of
  any length read), several of those (a list of paths or a glob such as
  ``"shards/*.parquet"``: the files' rows in order, one table), a ``datasets``
  ``save_to_disk`` folder (its Arrow files, by its ``state.json``), or a Hugging Face
  ``datasets.Dataset``-like object through its ``.data`` Arrow table (``datasets`` itself is not
  imported). Lengths come from ``pyarrow.compute.list_value_length``.
- ``jsonl_lengths(path, field="length")``: lengths only, from an integer field of JSON lines.

Every source pickles by path: a DataLoader worker reopens the files. The one exception is a source
built from an in-memory ``pyarrow.Table`` or ``Dataset`` object, which is pickled whole into every
worker (build it from the files instead). Documents of length 0 are read as they are (Megatron's
builder writes them) and skipped, counted and reported once by ``PackedBatchSampler``.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Optional

import numpy as np

import wlb

# Megatron DType codes (megatron/core/datasets/indexed_dataset.py) as numpy dtypes.
_MEGATRON_DTYPES = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
    7: np.float32, 8: np.uint16,
}


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.ipc
        import pyarrow.json
        import pyarrow.parquet
    except ImportError as e:  # pragma: no cover - pyarrow is a test and training dependency
        raise ImportError("Arrow, Parquet and JSON-lines corpora need pyarrow (pip install "
                          "pyarrow)") from e
    return pyarrow


def as_int64(values: np.ndarray, what: str) -> np.ndarray:
    """An integer array as int64, range-checked before the conversion: an unsigned value above
    int64 is a ValueError naming it as given and its position (``what[i]``), never wrapped."""
    values = np.asarray(values)
    if values.dtype == np.uint64 and values.size:
        big = np.flatnonzero(values > np.uint64(np.iinfo(np.int64).max))
        if big.size:
            raise ValueError(f"{what}[{int(big[0])}] = {int(values[big[0]])} does not fit int64")
    return values.astype(np.int64, copy=False)


class _TokenSource:
    """What every source shares: ``lengths`` and bounds-checked ``source[i]``."""

    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < len(self.lengths):
            raise IndexError(f"document {index} is outside [0, {len(self.lengths)})")
        return self._tokens_of(int(index))

    def _tokens_of(self, index: int) -> np.ndarray:
        raise NotImplementedError


class MegatronTokens(_TokenSource):
    """A Megatron-LM indexed dataset: ``prefix.idx`` (lengths) and ``prefix.bin`` (tokens).

    The ``.idx`` is checked chunk by chunk by the C++ reader (``wlb.scan_megatron_index``) and
    its arrays are memory-mapped, never copied: ``lengths`` (int32, Megatron's own dtype),
    ``pointers`` and ``document_indices`` (int64) are ``numpy.memmap`` views of the file, so a
    corpus of 10^9 sequences opens in constant memory."""

    def __init__(self, prefix: str):
        self.prefix = os.fspath(prefix)
        self._open()

    def _open(self) -> None:
        path = self.prefix + ".idx"
        info = wlb.scan_megatron_index(path)
        code = info["dtype_code"]
        if code not in (1, 2, 3, 4, 5, 8):
            raise ValueError(f"Megatron index {path}: dtype code {code} holds floats, not token "
                             "ids")
        self.dtype = np.dtype(_MEGATRON_DTYPES[code])

        def mapped(dtype: str, offset: int, count: int) -> np.ndarray:
            if count == 0:
                return np.zeros(0, dtype=dtype)
            return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))

        self.lengths = mapped("<i4", info["lengths_offset"], info["sequences"])
        self.pointers = mapped("<i8", info["pointers_offset"], info["sequences"])
        self.document_indices = mapped("<i8", info["document_indices_offset"], info["documents"])
        self.empty_sequences = info["empty_sequences"]
        expected = info["bin_bytes"]
        size = os.path.getsize(self.prefix + ".bin")  # FileNotFoundError names the path
        if size != expected:
            raise ValueError(f"Megatron data {self.prefix}.bin has {size} bytes, its index "
                             f"describes {expected}")
        self._tokens: Optional[np.memmap] = None

    def __getstate__(self):
        return {"prefix": self.prefix}  # a worker maps the files itself (checked again there)

    def __setstate__(self, state):
        self.prefix = state["prefix"]
        self._open()

    def _tokens_of(self, index: int) -> np.ndarray:
        if self._tokens is None:
            self._tokens = np.memmap(self.prefix + ".bin", dtype=self.dtype, mode="r")
        start = int(self.pointers[index]) // self.dtype.itemsize
        return np.asarray(self._tokens[start:start + int(self.lengths[index])], dtype=np.int64)


_JSONL = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst")
_ARROW = (".arrow", ".feather", ".ipc")


def _json_input(path: str):
    """The file's bytes as an Arrow input stream (gzip and zstd decompressed by their suffix)."""
    pa = _pyarrow()
    compression = "gzip" if path.endswith(".gz") else "zstd" if path.endswith(".zst") else None
    return pa.input_stream(path, compression=compression)


def _longest_line(path: str, chunk: int = 1 << 24) -> int:
    """The longest line of a (possibly compressed) JSON-lines file in bytes, streamed in chunks."""
    longest, current = 0, 0
    with _json_input(path) as f:
        while True:
            data = np.frombuffer(f.read(chunk), dtype=np.uint8)
            if data.size == 0:
                return max(longest, current)
            ends = np.flatnonzero(data == 0x0A)
            if ends.size == 0:
                current += data.size
                continue
            longest = max(longest, current + int(ends[0]),
                          int(np.diff(ends).max()) if ends.size > 1 else 0)
            current = data.size - int(ends[-1]) - 1


def _read_json(path: str):
    """A JSON-lines file as a table; pyarrow's block (1 MiB by default, and no object may straddle
    two blocks) is sized from the file's longest line, so lines of any length read."""
    pa = _pyarrow()
    block = max(1 << 20, _longest_line(path) + 2)
    with _json_input(path) as f:
        return pa.json.read_json(f, read_options=pa.json.ReadOptions(block_size=block))


def _files(source: Any) -> Optional[list]:
    """The files of a path, a glob, a list of paths or a ``datasets`` ``save_to_disk`` folder
    (None when ``source`` is not one of those)."""
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("an empty list of files")
        return [f for item in source for f in _files(item)]
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = os.fspath(source)
    # An existing path is taken as written, even when its name holds '[', '?' or '*' (as a glob
    # it would match nothing, or another file); only a path that does not exist is a glob.
    if not os.path.exists(path) and any(c in path for c in "*?["):
        found = sorted(glob.glob(path))
        if not found:
            raise FileNotFoundError(f"no file matches {path!r}")
        return found
    if os.path.isdir(path):
        return _save_to_disk_files(path)
    return [path]


def _save_to_disk_files(path: str) -> list:
    """The data files a ``datasets`` ``save_to_disk`` folder's state.json lists, each checked
    (ValueError naming the folder and what is missing, never a raw KeyError)."""
    state = os.path.join(path, "state.json")
    if not os.path.isfile(state):
        raise ValueError(f"{path!r} is a folder without state.json (not a datasets "
                         "save_to_disk folder); give its files or a glob")
    try:
        with open(state) as f:
            listed = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{state!r} is not readable JSON: {e}") from e
    entries = listed.get("_data_files") if isinstance(listed, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{state!r} has no '_data_files' list of the folder's files (is it a "
                         "datasets save_to_disk folder?); give its files or a glob")
    files = []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or os.path.isabs(name):
            raise ValueError(f"{state!r}: '_data_files' entry {entry!r} has no relative "
                             "'filename'")
        files.append(os.path.join(path, name))
    return files


def _read_file(path: str):
    pa = _pyarrow()
    if path.endswith(".parquet"):
        return pa.parquet.read_table(path, memory_map=True)
    if path.endswith(_JSONL):
        return _read_json(path)
    if path.endswith(_ARROW):
        with pa.memory_map(path) as f:
            try:
                return pa.ipc.open_file(f).read_all()
            except pa.ArrowInvalid:  # Hugging Face caches are IPC streams
                f.seek(0)
                return pa.ipc.open_stream(f).read_all()
    raise ValueError(f"cannot tell the format of {path!r}: expected .parquet, .arrow, .feather, "
                     f".ipc, {', '.join(_JSONL)}")


def _read_table(source: Any):
    pa = _pyarrow()
    if isinstance(source, pa.Table):
        return source
    data = getattr(source, "data", None)  # datasets.Dataset: .data is a datasets.table.Table
    if data is not None:
        if getattr(source, "_indices", None) is not None:  # rows are data.take(indices)
            raise ValueError("this Dataset has an indices mapping (after select, shuffle, ...) that "
                             "its .data table does not apply; call .flatten_indices() first")
        table = getattr(data, "table", data)
        if isinstance(table, pa.Table):
            return table
    files = _files(source)
    if files is None:
        raise TypeError(f"expected a pyarrow.Table, a Dataset with an Arrow .data table, a file "
                        f"path, a glob, a list of paths or a save_to_disk folder, got "
                        f"{type(source).__name__}")
    tables = [_read_file(f) for f in files]
    if len(tables) == 1:
        return tables[0]
    try:  # one table over every file's chunks: no copy
        return pa.concat_tables(tables, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"the files {files} do not share a schema: {e}") from e


def _check_fill(fill: Any) -> Optional[int]:
    """``fill`` for ArrowTokens: None (nulls are an error) or an integer token id (not a bool)."""
    if fill is None:
        return None
    if isinstance(fill, (bool, np.bool_)) or not isinstance(fill, (int, np.integer)):
        raise TypeError(f"fill must be None or an integer token id, got {fill!r}")
    if not -(1 << 63) <= int(fill) < (1 << 63):
        raise ValueError(f"fill must be a token id within int64, got {fill!r}")
    return int(fill)


def _first_null_token(column_data) -> Optional[tuple]:
    """(row, position in the row) of the first null token id of a list column, or None."""
    pa = _pyarrow()
    row_base = 0
    for chunk in column_data.chunks:
        values = pa.compute.list_flatten(chunk)
        if values.null_count:
            first = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            parents = pa.compute.list_parent_indices(chunk).to_numpy(zero_copy_only=False)
            row = int(parents[first])
            start = int(np.searchsorted(parents, row, side="left"))
            return row_base + row, first - start
        row_base += len(chunk)
    return None


def _check_int64_tokens(column_data, column: str) -> None:
    """ValueError naming the row of the first uint64 token id above int64 (it would wrap)."""
    pa = _pyarrow()
    limit = np.iinfo(np.int64).max
    row_base = 0
    for chunk in column_data.chunks:
        values = pa.compute.list_flatten(chunk)
        above = pa.compute.fill_null(pa.compute.greater(values, pa.scalar(limit, pa.uint64())),
                                     False)  # nulls are refused or filled separately
        big = np.flatnonzero(above.to_numpy(zero_copy_only=False))
        if big.size:
            parents = pa.compute.list_parent_indices(chunk).to_numpy(zero_copy_only=False)
            raise ValueError(f"column {column!r}: document {row_base + int(parents[big[0]])} "
                             f"has token id {values[int(big[0])]}, above the int64 limit {limit}")
        row_base += len(chunk)


class ArrowTokens(_TokenSource):
    """Token ids in a list-of-integers column of an Arrow table (see the module docstring).

    A null inside a row's token list is a ValueError naming the row, unless ``fill`` gives the
    token id that replaces it (a null row, a missing document, is always an error)."""

    def __init__(self, source: Any, column: str = "input_ids", fill: Optional[int] = None):
        pa = _pyarrow()
        # Workers reopen the files (a path, glob, list or folder travels, never the tokens); an
        # in-memory table or Dataset object is pickled whole, the one exception.
        self._path = _files(source)
        self.column = column
        self.fill = _check_fill(fill)
        table = _read_table(source)
        if column not in table.column_names:
            raise KeyError(f"no column {column!r}; the table has {table.column_names}")
        kind = table.schema.field(column).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(
                kind.value_type):
            raise TypeError(f"column {column!r} must hold lists of integer token ids, got {kind}")
        if self.fill is not None:
            try:
                pa.scalar(self.fill, type=kind.value_type)
            except (pa.ArrowInvalid, OverflowError) as e:
                raise ValueError(f"fill {self.fill} is not a {kind.value_type} token id of column "
                                 f"{column!r}") from e
        column_data = table.column(column)
        lengths = pa.compute.list_value_length(column_data)
        if lengths.null_count:
            first = int(np.flatnonzero(lengths.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"column {column!r}: document {first} is null")
        self.lengths = lengths.to_numpy().astype(np.int64)
        if pa.types.is_uint64(kind.value_type):  # token ids are read as int64: none may wrap
            _check_int64_tokens(column_data, column)
        if self.fill is None:
            null = _first_null_token(column_data)
            if null is not None:
                raise ValueError(f"column {column!r}: document {null[0]} has a null token id at "
                                 f"position {null[1]}; pass fill=<token id> to replace nulls")
        self._load(table)

    def _load(self, table) -> None:
        # Chunk by chunk, zero-copy where Arrow allows (a memory-mapped file stays mapped).
        pa = _pyarrow()
        chunks = table.column(self.column).chunks
        self._chunk_rows = np.cumsum([0] + [len(c) for c in chunks]).astype(np.int64)
        self._offsets = [c.offsets.to_numpy() for c in chunks]  # the chunk's slice applied
        self._values = [(c.values if self.fill is None or not c.values.null_count else
                         pa.compute.fill_null(c.values, self.fill)).to_numpy(zero_copy_only=False)
                        for c in chunks]

    def __getstate__(self):
        state = dict(self.__dict__)
        if self._path is not None:  # workers reread the file (memory-mapped where it can be)
            for key in ("_chunk_rows", "_offsets", "_values"):
                state[key] = None
        return state

    def _tokens_of(self, index: int) -> np.ndarray:
        if self._values is None:
            self._load(_read_table(self._path))
        chunk = int(np.searchsorted(self._chunk_rows, index, side="right")) - 1
        row = index - int(self._chunk_rows[chunk])
        offsets = self._offsets[chunk]
        return self._values[chunk][offsets[row]:offsets[row + 1]].astype(np.int64, copy=False)


def jsonl_lengths(path: str, field: str = "length") -> np.ndarray:
    """Document lengths from an integer field of a JSON-lines file (int64 array)."""
    pa = _pyarrow()
    table = _read_json(os.fspath(path))
    if field not in table.column_names:
        raise KeyError(f"{path}: no field {field!r}; the lines have {table.column_names}")
    values = table.column(field)
    if not pa.types.is_integer(values.type):
        raise TypeError(f"{path}: field {field!r} must be an integer length, got {values.type}")
    if values.null_count:
        raise ValueError(f"{path}: field {field!r} is missing or null on {values.null_count} "
                         "lines")
    lengths = values.to_numpy().astype(np.int64)
    bad = np.flatnonzero(lengths < 0)
    if bad.size:
        raise ValueError(f"{path}: line {int(bad[0]) + 1} has length {int(lengths[bad[0]])}; "
                         "lengths must be >= 0 (PackedBatchSampler skips the empty ones)")
    return lengths
