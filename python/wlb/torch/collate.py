"""Fetching and collating the pieces ``PackedBatchSampler`` yields (in DataLoader workers).

``PackedPieces(dataset)`` turns a map-style token dataset (``dataset[i]``: document i's token ids,
a 1-D sequence, numpy array, tensor or a dict holding ``input_ids``; e.g. ``wlb.formats``'
sources) into one indexed by ``(document, offset, length)`` pieces. ``PackedCollate()`` packs a
micro-batch's pieces into FlashAttention's varlen layout (``format="varlen"``, the default):

- ``input_ids`` (int64, the pieces' tokens concatenated), ``position_ids`` (int64, restarting at 0
  per piece), ``cu_seqlens`` (int32, prefix sums of piece lengths from 0), ``max_seqlen`` (int);
- ``packed_seq_params``: the same ``cu_seqlens`` and ``max_seqlen`` as a typed
  ``wlb.torch.PackedSeqParams`` (for queries and keys; ``to_megatron()``, ``hf_kwargs()``);
- ``labels`` (int64): the next token of the same piece, ``ignore_index`` at each piece's last token
  (no attention crosses a piece boundary, so nothing predicts across one);
- ``document_ids``, ``offsets``, ``lengths`` (int64, one row per piece).

``PackedCollate(format="hf")`` returns what a Hugging Face causal LM takes as ``model(**batch)``:
``input_ids``, ``position_ids`` and ``labels`` of shape ``[1, T]``, the labels unshifted (the
model shifts them) with ``ignore_index`` at each piece's first token, so that no token predicts
across a piece boundary, and ``cu_seq_lens_q``, ``cu_seq_lens_k``, ``max_length_q``,
``max_length_k`` (the FlashAttention paths read them; sdpa and eager find the pieces from the
position ids), and ``use_cache=False``: with a KV cache (transformers' default, even in training
mode) sdpa and eager skip the packed-sequence mask and let every piece attend to the pieces
before it. ``model(**batch).loss`` is the token-weighted mean loss of the pieces.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from wlb.formats import as_int64

from .._checks import integer
from ._common import require_torch, torch
from .packed import PackedSeqParams

FORMATS = ("varlen", "hf")


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

    def __init__(self, ignore_index: int = -100, format: str = "varlen"):
        require_torch()
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        # Written into int64 labels: a float or bool would be cast silently (1.5 and True -> 1).
        self.ignore_index = integer("ignore_index", ignore_index, -2**63, 2**63 - 1)
        self.format = format

    def __call__(self, pieces: List[Tuple[int, int, np.ndarray]]) -> Dict[str, Any]:
        lengths = np.array([p[2].size for p in pieces], dtype=np.int64)
        input_ids = (np.concatenate([p[2] for p in pieces]) if pieces
                     else np.zeros(0, dtype=np.int64))
        cu_seqlens = np.zeros(len(pieces) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu_seqlens[1:])
        starts = np.repeat(cu_seqlens[:-1].astype(np.int64), lengths)
        position_ids = np.arange(input_ids.size, dtype=np.int64) - starts
        max_seqlen = int(lengths.max()) if pieces else 0
        cu = torch.from_numpy(cu_seqlens)
        params = PackedSeqParams(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max_seqlen,
                                 max_seqlen_kv=max_seqlen)
        if self.format == "hf":
            labels = input_ids.copy()
            labels[cu_seqlens[:-1]] = self.ignore_index  # a piece's first token: no predecessor
            return {"input_ids": torch.from_numpy(input_ids)[None],
                    "position_ids": torch.from_numpy(position_ids)[None],
                    "labels": torch.from_numpy(labels)[None], **params.hf_kwargs(),
                    "use_cache": False}
        labels = np.full(input_ids.size, self.ignore_index, dtype=np.int64)
        labels[:-1] = input_ids[1:]
        labels[cu_seqlens[1:] - 1] = self.ignore_index  # a piece's last token predicts nothing
        return {
            "input_ids": torch.from_numpy(input_ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(position_ids),
            "cu_seqlens": cu,
            "max_seqlen": max_seqlen,
            "packed_seq_params": params,
            "document_ids": torch.tensor([p[0] for p in pieces], dtype=torch.int64),
            "offsets": torch.tensor([p[1] for p in pieces], dtype=torch.int64),
            "lengths": torch.from_numpy(lengths),
        }
