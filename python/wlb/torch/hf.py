"""Hugging Face ``transformers`` causal LMs on wlb's packing and context parallelism.

Packing: ``PackedCollate(format="hf")`` gives ``model(**batch)`` its packed inputs (see
``wlb.torch.collate``). Context parallelism: ``register()`` adds wlb's CP attention to
transformers' ``AttentionInterface`` as ``"wlb_cp"``; a decoder built with that implementation
(Llama, Qwen2, Mistral, ... any model whose attention goes through the interface; grouped-query
attention included) runs on one CP rank's shard of a packed micro-batch, and every attention
layer exchanges K/V with the other ranks as ``wlb.torch.cp_attention`` does:

    import wlb, wlb.torch.hf as wlb_hf
    wlb_hf.register()                                     # once per process
    model = AutoModelForCausalLM.from_config(config, attn_implementation="wlb_cp")
    for mb in loader:                                     # PackedCollate(format="hf") batches
        plan = wlb_hf.plan_shards(mb, cp=cp_size, strategy="adaptive")
        out = model(**wlb_hf.cp_inputs(mb, plan, cp_rank, group=cp_group))
        out.loss.backward()        # this rank's share; the CP ranks' gradients sum to the
                                   # micro-batch's (all_reduce them over the CP group)

``cp_inputs`` gives the rank its shard's tokens and position ids (shape ``[1, t]``), the targets
of its tokens as ``shift_labels`` (each token's next token in its piece, taken before sharding:
a rank's rows are not consecutive), ``num_items_in_batch`` (the labelled tokens of the micro-batch
or of what you pass, so that ``out.loss`` summed over the CP ranks is the micro-batch's
token-weighted mean) and ``packed_seq_params``: this rank's ``PackedSeqParams`` with the
``shard_plan``, which the attention function reads. Under a sliding-window model (Mistral's
``sliding_window``, Qwen2's sliding layers) the plan's mask must be ``"window:W"`` with the
model's W (``plan_shards`` picks it from the model config when given ``model=``). At cp = 1
no process group is needed (``cp_inputs(mb, plan_shards(mb, 1), 0)``: one rank, no exchange).

Cost. What a packed micro-batch costs depends on the model's attention implementation:
FlashAttention's varlen kernels and ``"wlb_cp"`` attend within each document (cost
sum a*d^2: the per-document family, where wlb's balance pays off), while ``sdpa`` and ``eager``
compute the whole T x T score matrix of a micro-batch of T tokens and mask it (cost a*T^2: the
dense family; balancing it is balancing tokens, which any full packing already does).
``attention_family(model)`` names the family and ``packing_cost(model)`` is the model's own
forward-FLOP cost under it (``wlb.CostModel.from_shape``), for ``PackedBatchSampler(cost=...)``;
``OnlineCalibration(attention=attention_family(model))`` fits measured times in the same family.

Training with ``transformers.Trainer``: ``WlbTrainer`` (``wlb.torch.hf_trainer``) builds the
loader from a ``PackedBatchSampler``, moves it from epoch to epoch, skips empty micro-batches and
checkpoints the loader with the Trainer's checkpoints.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

import wlb

from .._checks import integer
from ._common import require_torch, torch
from .cp import cp_slice, cp_varlen_args
from .cp_attention import CPAttention
from .packed import PackedSeqParams

NAME = "wlb_cp"

# attn_implementation -> attention family (wlb.CostModel.attention_families()). FlashAttention and
# flex attention skip what a packed mask hides (per tile); sdpa and eager compute all of it.
_PER_DOCUMENT_PREFIXES = ("flash_attention", "flex_attention", "paged|flash", NAME)
_DENSE = ("sdpa", "eager", "paged|sdpa", "paged|eager")


def register(name: str = NAME) -> str:
    """Registers wlb's CP attention with transformers' ``AttentionInterface`` under ``name``
    (idempotent) and returns the name for ``attn_implementation=``."""
    require_torch()
    try:
        from transformers import AttentionInterface
    except ImportError as e:
        raise ImportError("wlb.torch.hf needs transformers (pip install 'wlb[hf]')") from e
    AttentionInterface.register(name, cp_attention_forward)
    return name


def attention_family(model: Any) -> str:
    """``"per-document"`` or ``"dense"``: how ``model`` (a transformers model or config) computes
    a packed micro-batch's attention, from its ``attn_implementation`` (see the module
    docstring); ValueError for an implementation wlb does not know (give the family yourself)."""
    config = getattr(model, "config", model)
    name = getattr(config, "_attn_implementation", None) or "eager"
    if any(name == p or name.startswith(p) for p in _PER_DOCUMENT_PREFIXES):
        return "per-document"
    if name in _DENSE:
        return "dense"
    raise ValueError(f"attn_implementation {name!r}: wlb does not know whether it attends per "
                     "document or over the whole packed micro-batch; build the cost with "
                     "wlb.CostModel.from_shape(..., attention='per-document' or 'dense')")


def packing_cost(model: Any, attention: Optional[str] = None) -> wlb.CostModel:
    """``model``'s forward-FLOP cost (``wlb.CostModel.from_shape`` of its config's hidden size,
    intermediate size, heads, K/V heads and layers) under ``attention`` (default
    ``attention_family(model)``): the ``cost`` to give ``PackedBatchSampler``."""
    config = getattr(model, "config", model)
    heads = config.num_attention_heads
    return wlb.CostModel.from_shape(
        hidden=config.hidden_size, ffn=config.intermediate_size, heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        layers=config.num_hidden_layers, name=getattr(config, "model_type", "") or "custom",
        attention=attention if attention is not None else attention_family(config))


def __getattr__(name: str) -> Any:
    if name == "WlbTrainer":  # imports transformers' Trainer (and accelerate) on first use
        from .hf_trainer import WlbTrainer
        return WlbTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lengths(batch: Dict[str, Any]) -> np.ndarray:
    cu = batch.get("cu_seq_lens_q")
    ids = batch.get("input_ids")
    if not isinstance(cu, torch.Tensor) or not isinstance(ids, torch.Tensor) or ids.dim() != 2 \
            or ids.shape[0] != 1:
        raise ValueError("batch must be a PackedCollate(format='hf') batch (input_ids of shape "
                         f"[1, T] and cu_seq_lens_q), got keys {sorted(batch)}")
    lengths = np.diff(cu.cpu().numpy().astype(np.int64))
    if int(lengths.sum()) != ids.shape[1]:
        raise ValueError(f"cu_seq_lens_q ends at {int(lengths.sum())} but input_ids has "
                         f"{ids.shape[1]} tokens")
    return lengths


def plan_shards(batch: Dict[str, Any], cp: int, strategy: str = "adaptive", *,
                model: Any = None, **kwargs) -> wlb.ShardPlan:
    """``wlb.plan_shards`` for a ``PackedCollate(format="hf")`` micro-batch. ``model``: a
    transformers model or config; with a ``sliding_window`` (Mistral), the plan's mask is
    ``"window:W"`` unless ``layer_mix`` is given."""
    config = getattr(model, "config", model)
    window = getattr(config, "sliding_window", None) if config is not None else None
    if window and "layer_mix" not in kwargs and _uses_window(config):
        kwargs["layer_mix"] = f"window:{int(window)}"
    return wlb.plan_shards(_lengths(batch), cp, strategy, **kwargs)


def _uses_window(config: Any) -> bool:
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        kinds = set(layer_types)
        if kinds == {"sliding_attention"}:
            return True
        if "sliding_attention" in kinds:
            raise ValueError(f"the model mixes attention layer types {sorted(kinds)}; give "
                             "plan_shards a layer_mix and narrow the plan per layer yourself")
        return False
    return getattr(config, "use_sliding_window", True) is not False


def cp_inputs(batch: Dict[str, Any], plan: wlb.ShardPlan, rank: int, group: Any = None, *,
              num_items_in_batch: Optional[int] = None, ignore_index: int = -100
              ) -> Dict[str, Any]:
    """CP rank ``rank``'s ``model(**inputs)`` arguments for a ``PackedCollate(format="hf")``
    micro-batch under ``plan`` (see the module docstring). ``num_items_in_batch``: the loss's
    divisor (default: the micro-batch's labelled tokens; give the step's for gradient
    accumulation)."""
    require_torch()
    lengths = _lengths(batch)
    if plan.tokens != int(lengths.sum()):
        raise ValueError(f"the plan covers {plan.tokens} tokens but the micro-batch has "
                         f"{int(lengths.sum())}")
    rank = _check_cp_rank(rank, plan, group)
    ignore_index = integer("ignore_index", ignore_index, -2**63, 2**63 - 1)
    labels = batch["labels"][0]
    targets = torch.nn.functional.pad(labels[1:], (0, 1), value=ignore_index)
    if num_items_in_batch is None:
        num_items_in_batch = int((targets != ignore_index).sum())
    device = batch["input_ids"].device
    inputs = {
        "input_ids": cp_slice(batch["input_ids"][0], plan, rank)[None],
        "position_ids": cp_slice(batch["position_ids"][0], plan, rank)[None],
        "labels": cp_slice(labels, plan, rank)[None],  # not read: shift_labels are the targets
        "shift_labels": cp_slice(targets, plan, rank)[None],
    }
    if plan[rank].tokens == 0:
        # transformers' models cannot reshape 0 tokens: the rank runs one padding token that
        # attends to nothing (cp_attention_forward gives it a zero output) and has no target.
        inputs = {key: torch.full((1, 1), ignore_index if "labels" in key else 0,
                                  dtype=torch.int64, device=device) for key in inputs}
    inputs.update(num_items_in_batch=num_items_in_batch, use_cache=False,
                  packed_seq_params=cp_varlen_args(plan, rank, device, group))
    return inputs


def _check_cp_rank(rank: Any, plan: wlb.ShardPlan, group: Any) -> int:
    """``rank`` as an int in [0, cp_size); under an initialised torch.distributed it must be this
    process's rank in ``group`` (the default group when None): another rank's shard would run
    silently, with a wrong loss, wherever the shard sizes happen to match."""
    rank = integer("rank", rank, 0, plan.cp_size - 1)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        own = dist.get_rank(group)
        if own != rank:
            where = "the default group" if group is None else "the given group"
            raise ValueError(f"rank {rank} is not this process's rank in {where} ({own}); give "
                             "cp_inputs dist.get_rank(group) for the group it is passed")
    return rank


def _attention_module(params: PackedSeqParams, scale: Optional[float]) -> CPAttention:
    """One CPAttention per (record, scale), so its index tensors are built once per micro-batch
    and reused by every layer."""
    cache = params.__dict__.setdefault("_wlb_cp_modules", {})
    if scale not in cache:
        cache[scale] = CPAttention(params.shard_plan, params.cp_group, scale=scale)
    return cache[scale]


def cp_attention_forward(module: Any, query: "torch.Tensor", key: "torch.Tensor",
                         value: "torch.Tensor", attention_mask: Any, scaling: Optional[float] = None,
                         dropout: float = 0.0, **kwargs) -> Tuple["torch.Tensor", None]:
    """transformers' attention-interface signature: query (1, H_q, t, D), key and value
    (1, H_kv, t, D) of this rank's rows; returns (1, t, H_q, D) and no weights."""
    params = kwargs.get("packed_seq_params")
    if not isinstance(params, PackedSeqParams) or params.shard_plan is None:
        raise ValueError(f"attn_implementation {NAME!r} needs packed_seq_params from "
                         "wlb.torch.hf.cp_inputs (a PackedSeqParams with a shard_plan) in the "
                         f"model's keyword arguments, got {type(params).__name__}")
    plan = params.shard_plan
    # Checks that can fail on one rank alone go into the ranks' agreement (cp_attention's), so
    # that every rank raises the same error instead of the others hanging in a collective.
    problem = None
    window = kwargs.get("sliding_window")
    if window is None:
        window = getattr(module, "sliding_window", None)
    want = f"window:{int(window)}" if window else "causal"
    if dropout:
        problem = f"wlb's CP attention has no attention dropout, got dropout {dropout}"
    elif query.dim() != 4 or query.shape[0] != 1:
        problem = (f"wlb's CP attention takes one packed sequence (batch size 1), got query "
                   f"shape {tuple(query.shape)}")
    elif plan.mask != want:
        problem = (f"layer {getattr(module, 'layer_idx', '?')} attends under {want!r} but the "
                   f"shard plan's mask is {plan.mask!r} (plan with layer_mix={want!r}; "
                   "wlb.torch.hf.plan_shards(batch, cp, model=model) does)")
    if problem is not None:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(problem)  # no other rank to agree with
        _attention_module(params, None)(query, key, value, _problem=problem)  # raises everywhere
        raise ValueError(problem)  # not reached: the agreement raises it on every rank
    attention = _attention_module(params, scaling)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (t, heads, D)
    padding = q.shape[0] if plan[params.cp_rank].tokens == 0 and q.shape[0] == 1 else 0
    if padding:  # cp_inputs' padding token of a rank with no tokens
        q, k, v = q[:0], k[:0], v[:0]
    out = attention(q.contiguous(), k.contiguous(), v.contiguous())
    if padding:
        out = torch.cat([out, out.new_zeros((padding,) + tuple(out.shape[1:]))])
    return out[None], None
