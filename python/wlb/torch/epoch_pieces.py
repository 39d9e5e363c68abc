"""An epoch's pieces for ``PackedBatchSampler``, streamed from a cursor: the document lengths'
chunked checks, the epoch's document order, the pieces cut from it (as ``wlb.make_documents``
cuts them; steps as in ``_EpochPieces.take``) and one planning push. Every scan over the corpus goes
``_SCAN_CHUNK`` documents at a time, so no temporary is the size of the corpus."""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

import wlb

_COLUMNS = ("ids", "lengths", "pieces", "offsets")


def _columns(docs: Any) -> Dict[str, List[int]]:
    """A Documents / MicroBatch's pieces as plain int lists (picklable state)."""
    return {c: np.asarray(getattr(docs, c), dtype=np.int64).tolist() for c in _COLUMNS}


def _join(parts: Sequence[Dict[str, Any]]) -> Dict[str, np.ndarray]:
    return {c: np.concatenate([np.asarray(p[c], dtype=np.int64) for p in parts] or
                              [np.zeros(0, np.int64)]) for c in _COLUMNS}


_SCAN_CHUNK = 1 << 22  # documents per chunk of a scan over the corpus (bounded temporaries)


def _index_dtype(count: int) -> type:
    """The dtype of document indices into a corpus of `count` documents: 4 bytes while they fit."""
    return np.uint32 if count <= np.iinfo(np.uint32).max else np.int64


def _checked_lengths(lengths: Any) -> Tuple[np.ndarray, int, Optional[int]]:
    """Document lengths range-checked before any conversion, chunk by chunk (no whole-corpus
    temporaries): a 1-D integer array (no bools, no floats), every length >= 0 (empty documents
    are skipped) and within int64 as given (an unsigned length above int64 is named as given,
    not wrapped), and their sum within int64. Returns the array as given (no copy: a memmap
    stays one; a list becomes int64), the number of empty documents and the first of them."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and (not np.issubdtype(lengths.dtype, np.integer) or
                                               lengths.dtype == np.bool_)):
        raise TypeError(f"lengths must be a 1-D integer array, got {lengths.dtype} with shape "
                        f"{lengths.shape}")
    if lengths.size == 0:
        return lengths.astype(np.int64), 0, None
    limit = np.iinfo(np.int64).max
    total, empty, first_empty = 0, 0, None
    for start in range(0, len(lengths), _SCAN_CHUNK):
        part = lengths[start:start + _SCAN_CHUNK]
        if lengths.dtype == np.uint64:
            big = np.flatnonzero(part > np.uint64(limit))
            if big.size:
                raise ValueError(f"document {start + int(big[0])} has length "
                                 f"{int(part[big[0]])}, above the int64 limit {limit}")
        part = part.astype(np.int64, copy=False)
        bad = np.flatnonzero(part < 0)
        if bad.size:
            raise ValueError(f"document {start + int(bad[0])} has length {int(part[bad[0]])}; "
                             "lengths must be >= 0")
        zeros = np.flatnonzero(part == 0)
        if zeros.size and first_empty is None:
            first_empty = start + int(zeros[0])
        empty += int(zeros.size)
        top = int(part.max())
        total += int(part.sum()) if top <= limit // len(part) else sum(int(x) for x in part)
        if total > limit:
            raise ValueError(f"the lengths add up to more than {limit} tokens")
    return lengths, empty, first_empty


def _nonzero_indices(lengths: np.ndarray, count: int) -> np.ndarray:
    """The indices of the `count` non-empty documents, filled chunk by chunk (4 bytes each while
    the corpus has under 2^32 documents)."""
    out = np.empty(count, dtype=_index_dtype(len(lengths)))
    at = 0
    for start in range(0, len(lengths), _SCAN_CHUNK):
        hit = np.flatnonzero(lengths[start:start + _SCAN_CHUNK] != 0)
        out[at:at + hit.size] = hit + start
        at += hit.size
    return out

def _epoch_order(count: int, documents: int, seed: int, epoch: int, shuffle: bool,
                 planned: Optional[np.ndarray]) -> np.ndarray:
    """Epoch `epoch`'s order of the `count` planned documents of a corpus of `documents`:
    Generator.permutation(count)'s order at 4 bytes a document (while they fit), mapped through
    `planned` (the non-empty documents' indices; None: all documents) chunk by chunk."""
    order = np.arange(count, dtype=_index_dtype(documents))
    if shuffle:
        np.random.default_rng([seed, epoch]).shuffle(order)
    if planned is not None:
        for start in range(0, count, _SCAN_CHUNK):
            part = order[start:start + _SCAN_CHUNK]
            part[:] = planned[part]
    return order


class _Cursor(NamedTuple):
    """A position in an epoch's pieces: before piece `piece` of the epoch (the state's
    "consumed"), which is piece `part` of the document at position `doc` of the epoch's order
    and starts at token `token` of the epoch."""
    piece: int
    doc: int
    part: int
    token: int


class _EpochPieces:
    """An epoch's pieces (its documents in `order`, cut at S as wlb.make_documents cuts them),
    made on demand from a cursor: the sampler holds the order (4 or 8 bytes a document) and the
    pieces of the steps in flight, never the whole epoch's pieces."""

    def __init__(self, epoch: int, lengths: np.ndarray, order: np.ndarray, context: int):
        self.epoch, self.lengths, self.order, self.context = epoch, lengths, order, context
        self._want = 64  # documents to cut per take; adapts to the documents a step holds
        self._known: Dict[int, _Cursor] = {0: _Cursor(0, 0, 0, 0)}

    def __len__(self) -> int:
        return len(self.order)

    def _lengths(self, start: int, stop: int) -> np.ndarray:
        return self.lengths[self.order[start:stop]].astype(np.int64)

    def seek(self, consumed: int) -> _Cursor:
        """The cursor before piece `consumed` (scanning the order chunk by chunk from the start,
        once per distinct value). ValueError naming the value past the epoch's last piece."""
        if consumed in self._known:
            return self._known[consumed]
        piece = token = doc = 0
        while doc < len(self.order):
            lengths = self._lengths(doc, doc + _SCAN_CHUNK)
            counts = np.cumsum(-(-lengths // self.context))
            if piece + int(counts[-1]) <= consumed:
                piece += int(counts[-1])
                token += int(lengths.sum())
                doc += len(lengths)
                continue
            j = int(np.searchsorted(counts, consumed - piece, side="right"))
            part = consumed - piece - (int(counts[j - 1]) if j else 0)
            cursor = _Cursor(consumed, doc + j, part, token + int(lengths[:j].sum()) +
                             part * self.context)
            break
        else:
            if consumed != piece:
                raise ValueError(f"state 'consumed' must be an integer [0, {piece}], "
                                 f"got {consumed!r}")
            cursor = _Cursor(consumed, doc, 0, token)
        if len(self._known) > 8:
            self._known = {0: self._known[0]}
        self._known[consumed] = cursor
        return cursor

    def take(self, cursor: _Cursor, tokens: int) -> Tuple[Dict[str, np.ndarray], _Cursor]:
        """The pieces from `cursor` whose first token lies before cursor.token + `tokens` (a piece
        goes to the step of its first token, as in wlb.split_into_steps; the window starts at
        `cursor`, the end of the previous step's pieces, not at a multiple of `tokens`), and the
        cursor after them."""
        limit = cursor.token + tokens
        parts: List[Dict[str, np.ndarray]] = []
        piece, doc, part, token = cursor
        first_doc = doc
        while doc < len(self.order) and token < limit:
            count = min(len(self.order) - doc, self._want)
            cut = wlb.make_documents(self._lengths(doc, doc + count), self.context)
            columns = {c: np.asarray(getattr(cut, c), dtype=np.int64)[part:] for c in _COLUMNS}
            starts = token + np.cumsum(columns["lengths"]) - columns["lengths"]
            k = int(np.searchsorted(starts, limit, side="left"))
            rows = {c: columns[c][:k] for c in _COLUMNS}
            rows["ids"] = self.order[doc + rows["ids"]].astype(np.int64)
            parts.append(rows)
            piece += k
            if k < len(starts):
                doc, part, token = doc + int(columns["ids"][k]), int(columns["pieces"][k]), \
                    int(starts[k])
                break
            doc, part = doc + count, 0
            token = int(starts[-1] + columns["lengths"][-1]) if len(starts) else token
            self._want = min(2 * self._want, _SCAN_CHUNK)
        self._want = max(64, min(_SCAN_CHUNK, 2 * (doc - first_doc + 1)))
        return _join(parts), _Cursor(piece, doc, part, token)

    def arrived(self, cursor: _Cursor, ids: np.ndarray, pieces: np.ndarray) -> np.ndarray:
        """Whether each (document, piece) lies before `cursor` in the epoch (a scan of the order
        up to the cursor's document, chunk by chunk)."""
        position: Dict[int, int] = {}
        wanted = np.unique(ids)
        stop = min(cursor.doc + 1, len(self.order))
        for start in range(0, stop, _SCAN_CHUNK):
            chunk = self.order[start:min(start + _SCAN_CHUNK, stop)]
            for h in np.flatnonzero(np.isin(chunk, wanted)).tolist():
                position[int(chunk[h])] = start + h
        out = np.zeros(len(ids), dtype=bool)
        for row in range(len(ids)):
            at = position.get(int(ids[row]))
            out[row] = at is not None and (at < cursor.doc or
                                          (at == cursor.doc and int(pieces[row]) < cursor.part))
        return out


def _push(packer: Any, pieces: _EpochPieces, cursor: _Cursor, queued: Dict[str, Any],
          tokens_per_step: int) -> Tuple[List[Any], _Cursor, bool]:
    """One planning push (``_plan``'s, and the state check's replay of it): the queued pieces,
    then the pieces arriving in the next N x S tokens from `cursor` (a piece arrives in the step
    its first token lies in; see _EpochPieces.take); at the end of the epoch, the packer's flush.
    Returns (ready steps, the cursor after the pieces taken, whether it was the flush)."""
    taken, end = pieces.take(cursor, tokens_per_step)
    arrivals = _join([queued, taken])
    final = len(arrivals["ids"]) == 0
    ready = packer.flush() if final else packer.push(wlb.Documents(**arrivals))
    return ready, end, final
