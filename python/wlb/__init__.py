"""wlb: workload-balanced packing and context-parallel sharding for long-context LLM training.

The classes and functions below are bindings of the header-only C++ library (include/wlb): the
same packers, shard planners, cost and kernel models, with numpy arrays in and out.

    import wlb
    packer = wlb.Packer("wlb", context=131072, micro_batches=4)
    for step in packer.push(lengths):            # one step's document lengths
        for mb in step.micro_batches:
            mb.ids, mb.cu_seqlens, mb.position_ids  # numpy arrays
    state = packer.state_dict()                   # the C++ SaveState blob inside
"""

from ._wlb import (
    CostModel,
    Documents,
    KernelModel,
    MicroBatch,
    MicroBatchFit,
    Packer,
    PredictionError,
    RankShard,
    ShardPlan,
    StepPlan,
    __version__,
    assign_dp_ranks,
    default_max_tokens,
    default_thresholds,
    fit_micro_batch_cost,
    imbalance_degree,
    make_documents,
    micro_batch_stage_times,
    packer_names,
    plan_settings,
    parse_lengths,
    plan_shards,
    predict_cp_of_placement,
    read_megatron_index,
    scan_megatron_index,
    read_micro_batch_measurements,
    read_lengths,
    sample_default_lengths,
    shard_strategy_names,
    split_into_steps,
    summarize,
)

__all__ = [
    "CostModel",
    "Documents",
    "KernelModel",
    "MicroBatch",
    "MicroBatchFit",
    "Packer",
    "PredictionError",
    "RankShard",
    "ShardPlan",
    "StepPlan",
    "__version__",
    "assign_dp_ranks",
    "default_max_tokens",
    "default_thresholds",
    "fit_micro_batch_cost",
    "imbalance_degree",
    "make_documents",
    "micro_batch_stage_times",
    "packer_names",
    "plan_settings",
    "parse_lengths",
    "plan_shards",
    "predict_cp_of_placement",
    "read_megatron_index",
    "scan_megatron_index",
    "read_micro_batch_measurements",
    "read_lengths",
    "sample_default_lengths",
    "shard_strategy_names",
    "split_into_steps",
    "summarize",
]
