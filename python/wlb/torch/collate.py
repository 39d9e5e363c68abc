"""Fetching and collating the pieces ``PackedBatchSampler`` yields (in DataLoader workers).

``PackedPieces(dataset)`` turns a map-style token dataset (``dataset[i]``: document i's token ids,
a 1-D sequence, numpy array, tensor or a dict holding ``input_ids``; e.g. ``wlb.formats``'
sources) into one indexed by ``(document, offset, length)`` pieces. ``PackedCollate()`` packs a
micro-batch's pieces into FlashAttention's varlen layout:

- ``input_ids`` (int64, the pieces' tokens concatenated), ``position_ids`` (int64, restarting at 0
  per piece), ``cu_seqlens`` (int32, prefix sums of piece lengths from 0), ``max_seqlen`` (int);
- ``labels`` (int64): the next token of the same piece, ``ignore_index`` at each piece's last token
  (no attention crosses a piece boundary, so nothing predicts across one);
- ``document_ids``, ``offsets``, ``lengths`` (int64, one row per piece).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from wlb.formats import as_int64

from ._common import require_torch, torch


class PackedPieces:
    """``pieces[(document, offset, length)]``: that piece of ``dataset[document]``."""

    def __init__(self, dataset: Sequence[Any]):
        require_torch()
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, piece: Tuple[int, int, int]) -> Tuple[int, int, np.ndarray]:
        document, offset, length = piece
        item = self.dataset[document]
        if isinstance(item, dict):
            item = item["input_ids"]
        if isinstance(item, torch.Tensor):
            item = item.cpu().numpy()
        tokens = np.asarray(item)
        if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
            raise TypeError(f"dataset[{document}] must be a 1-D sequence of integer token ids, got "
                            f"{tokens.dtype} with shape {tokens.shape}")
        if offset < 0 or length < 1 or offset + length > tokens.size:
            raise ValueError(f"piece (offset {offset}, length {length}) of document {document} "
                             f"is outside its {tokens.size} tokens (do the lengths given to the "
                             "sampler match the dataset?)")
        return document, offset, as_int64(tokens[offset:offset + length],
                                          f"dataset[{document}] token ids from offset {offset}")


class PackedCollate:
    """Packs a micro-batch's fetched pieces (see the module docstring)."""

    def __init__(self, ignore_index: int = -100):
        require_torch()
        self.ignore_index = ignore_index

    def __call__(self, pieces: List[Tuple[int, int, np.ndarray]]) -> Dict[str, Any]:
        lengths = np.array([p[2].size for p in pieces], dtype=np.int64)
        input_ids = (np.concatenate([p[2] for p in pieces]) if pieces
                     else np.zeros(0, dtype=np.int64))
        cu_seqlens = np.zeros(len(pieces) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu_seqlens[1:])
        starts = np.repeat(cu_seqlens[:-1].astype(np.int64), lengths)
        position_ids = np.arange(input_ids.size, dtype=np.int64) - starts
        labels = np.full(input_ids.size, self.ignore_index, dtype=np.int64)
        labels[:-1] = input_ids[1:]
        labels[cu_seqlens[1:] - 1] = self.ignore_index  # a piece's last token predicts nothing
        return {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(position_ids),
            "cu_seqlens": torch.from_numpy(cu_seqlens),
            "max_seqlen": int(lengths.max()) if pieces else 0,
            "document_ids": torch.tensor([p[0] for p in pieces], dtype=torch.int64),
            "offsets": torch.tensor([p[1] for p in pieces], dtype=torch.int64),
            "lengths": torch.from_numpy(lengths),
        }
