"""``PackedDataset``: one item per training step, the step's N packed micro-batches.

Each micro-batch holds the documents' tokens concatenated (``input_ids``), positions restarting at
0 per document piece (``position_ids``) and ``cu_seqlens`` (int32), as FlashAttention's varlen
functions and PyTorch take them. ``state_dict()`` / ``load_state_dict()`` resume exactly where
iteration stopped (torchdata's StatefulDataLoader calls them on the dataset), so a restart neither
loses nor repeats a document.

    ds = PackedDataset(token_sequences, packer=wlb.Packer("wlb", context=8192, micro_batches=4))
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    for step in loader:
        for mb in step["micro_batches"]:
            model(mb["input_ids"], position_ids=mb["position_ids"], cu_seqlens=mb["cu_seqlens"])
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np

import wlb
from wlb.formats import as_int64

from ._common import require_torch, torch

_IterableDataset = torch.utils.data.IterableDataset if torch is not None else object

_STATE_VERSION = 1


class PackedDataset(_IterableDataset):
    """One item per training step: ``{"step", "drain", "imbalance", "micro_batches": [...]}``.

    ``dataset[i]`` must give document i's token ids (a 1-D sequence, numpy array or tensor, or a
    dict holding ``input_ids``); the document id is its index. Documents are read in order and
    cut into steps of N x S tokens exactly as ``wlb.split_into_steps`` does (a piece belongs to
    the step of its first token); documents longer than S become pieces of at most S tokens.
    Each micro-batch is a dict of tensors: ``input_ids`` and ``position_ids`` (int64, one row per
    packed token), ``cu_seqlens`` (int32), ``max_seqlen``, ``document_ids``, ``pieces``,
    ``offsets`` and ``lengths`` (one row per piece).

    The packer plans one global stream, so use ``num_workers=0`` or 1.
    """

    def __init__(self, dataset: Sequence[Any], packer: Optional[wlb.Packer] = None, **packer_args):
        require_torch()
        if packer is not None and packer_args:
            raise TypeError("give either a wlb.Packer or the arguments to build one, not both")
        self.dataset = dataset
        self._packer_args = packer_args
        self._template = packer if packer is not None else wlb.Packer(**packer_args)
        # The packer as given, before any step: every iteration starts from this state.
        self._initial = self._template.state_dict()
        self._tokens_per_step = self._template.context * self._template.micro_batches
        self._resume: Optional[Dict[str, Any]] = None
        self._state: Dict[str, Any] = self._start_state()

    def _start_state(self) -> Dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "packer": copy.deepcopy(self._initial),
            "document": 0,
            "piece": 0,
            "offset": 0,
            "yielded": 0,
        }

    def state_dict(self) -> Dict[str, Any]:
        """Where iteration stands after the last item it gave (the packer's C++ state inside)."""
        return copy.deepcopy(self._state)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next iteration resumes right after the item this state was taken at."""
        if not isinstance(state, dict) or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"PackedDataset state must be a dict with version {_STATE_VERSION}, got "
                f"{state.get('version') if isinstance(state, dict) else type(state).__name__}"
            )
        for key in ("document", "piece", "offset", "yielded"):
            value = state.get(key)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"PackedDataset state '{key}' must be an integer >= 0, got {value!r}")
        self._template.load_state_dict(state["packer"])  # rejects a bad blob now
        self._resume = copy.deepcopy(state)
        self._state = copy.deepcopy(state)

    def _tokens(self, index: int) -> np.ndarray:
        item = self.dataset[index]
        if isinstance(item, dict):
            item = item["input_ids"]
        if torch is not None and isinstance(item, torch.Tensor):
            item = item.cpu().numpy()
        tokens = np.asarray(item)
        if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
            raise TypeError(
                f"dataset[{index}] must be a 1-D sequence of integer token ids, got "
                f"{tokens.dtype} with shape {tokens.shape}"
            )
        return as_int64(tokens, f"dataset[{index}] token ids")

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise RuntimeError(
                f"PackedDataset plans one global stream; use num_workers <= 1, got {info.num_workers}"
            )
        state = self._resume if self._resume is not None else self._start_state()
        self._resume = None
        packer = self._template  # one iteration at a time: it restarts from `state`
        packer.load_state_dict(state["packer"])
        document, piece, offset = state["document"], state["piece"], state["offset"]
        skip = state["yielded"]
        cache: Dict[int, np.ndarray] = {}
        pieces_of = -1  # the document whose pieces are in p_len / p_piece / p_off
        p_len: List[int] = []
        p_piece: List[int] = []
        p_off: List[int] = []
        n = len(self.dataset)
        while True:
            before = {"packer": packer.state_dict(), "document": document, "piece": piece,
                      "offset": offset}
            step_index = offset // self._tokens_per_step
            ids: List[int] = []
            lengths: List[int] = []
            piece_ids: List[int] = []
            offsets: List[int] = []
            while document < n:
                if pieces_of != document:
                    if document not in cache:
                        cache[document] = self._tokens(document)
                    pieces = wlb.make_documents([cache[document].size], packer.context,
                                                first_id=document)
                    p_len, p_piece, p_off = (pieces.lengths.tolist(), pieces.pieces.tolist(),
                                             pieces.offsets.tolist())
                    pieces_of = document
                if offset // self._tokens_per_step != step_index:
                    break
                ids.append(document)
                lengths.append(p_len[piece])
                piece_ids.append(p_piece[piece])
                offsets.append(p_off[piece])
                offset += p_len[piece]
                piece += 1
                if piece == len(p_len):
                    document, piece = document + 1, 0
            final = not ids
            if final:
                ready = packer.flush()
            else:
                ready = packer.push(wlb.Documents(ids, lengths, piece_ids, offsets))
            for i, step in enumerate(ready):
                if i < skip:
                    continue
                item = self._assemble(step, cache)
                self._state = dict(before, version=_STATE_VERSION, yielded=i + 1)
                yield item
            skip = 0
            if final:
                return
            # Keep only the tokens of documents still held back or partly read.
            keep = set(packer.pending.ids.tolist())
            keep.add(document)
            cache = {doc: tokens for doc, tokens in cache.items() if doc in keep}

    def _assemble(self, step: wlb.StepPlan, cache: Dict[int, np.ndarray]) -> Dict[str, Any]:
        micro_batches = []
        for mb in step.micro_batches:
            ids, offsets, lengths = mb.ids, mb.offsets, mb.lengths
            parts = []
            for doc, start, length in zip(ids.tolist(), offsets.tolist(), lengths.tolist()):
                if doc not in cache:
                    cache[doc] = self._tokens(doc)
                parts.append(cache[doc][start:start + length])
            input_ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            micro_batches.append({
                "input_ids": torch.from_numpy(input_ids),
                "position_ids": torch.from_numpy(mb.position_ids),
                "cu_seqlens": torch.from_numpy(mb.cu_seqlens),
                "max_seqlen": mb.max_seqlen,
                "document_ids": torch.from_numpy(ids),
                "pieces": torch.from_numpy(mb.pieces),
                "offsets": torch.from_numpy(offsets),
                "lengths": torch.from_numpy(lengths),
            })
        return {
            "step": step.step,
            "drain": step.drain,
            "imbalance": step.imbalance,
            "micro_batches": micro_batches,
        }
