"""Counting the bytes a rank passes to torch.distributed's exchange collectives, for tests and
benches of ``wlb.torch.cp_attention`` (independent of the executor's own accounting,
``comm_volume``).

    with CollectiveBytes() as counter:
        out, lse = cp_attention(q, k, v, plan)
        sent, received, calls = counter.take()

While active it wraps ``torch.distributed.all_to_all_single``, ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` (every call through the module attribute, as cp_attention makes them) and
adds up what this rank sends to and receives from the other ranks: an all-to-all's input and
output less the part it sends itself, an all-gather's input to each other rank
and the others' parts of its output, a reduce-scatter's other ranks' parts of its input and their
parts of this rank's output.
"""

from __future__ import annotations

from ._common import require_torch, torch

if torch is not None:
    import torch.distributed as dist


class CollectiveBytes:
    """Counts the bytes this rank passes to the exchange collectives while active (patches
    torch.distributed's all_to_all_single, all_gather_into_tensor and reduce_scatter_tensor):
    "sent" to the other ranks and "received" from them, per collective kind in "calls"."""

    NAMES = ("all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor")

    def __init__(self):
        require_torch()
        self.sent = self.received = 0
        self.calls = []

    def _wrap(self, name, real):
        def counted(output, input, *args, **kwargs):
            world = dist.get_world_size(kwargs.get("group"))
            out_b = output.numel() * output.element_size()
            in_b = input.numel() * input.element_size()
            if name == "all_to_all_single":  # less what a rank sends itself
                me = dist.get_rank(kwargs.get("group"))
                splits = list(args[:2]) + [None] * (2 - len(args[:2]))
                out_splits = kwargs.get("output_split_sizes", splits[0])
                in_splits = kwargs.get("input_split_sizes", splits[1])
                own_out = (out_splits[me] * out_b // max(1, output.shape[0]) if out_splits
                           else out_b // world)  # no splits: equal parts
                own_in = (in_splits[me] * in_b // max(1, input.shape[0]) if in_splits
                          else in_b // world)
                sent, received = in_b - own_in, out_b - own_out
            elif name == "all_gather_into_tensor":
                sent, received = (world - 1) * in_b, out_b - in_b
            else:  # reduce_scatter_tensor: the other ranks' parts out, theirs of ours in
                sent, received = in_b - out_b, (world - 1) * out_b
            self.sent += sent
            self.received += received
            self.calls.append(name)
            return real(output, input, *args, **kwargs)
        return counted

    def __enter__(self):
        self._real = {n: getattr(dist, n) for n in self.NAMES}
        for n, real in self._real.items():
            setattr(dist, n, self._wrap(n, real))
        return self

    def __exit__(self, *exc):
        for n, real in self._real.items():
            setattr(dist, n, real)

    def take(self):
        """(sent, received, calls) since the last take; resets them."""
        out = (self.sent, self.received, self.calls)
        self.sent = self.received = 0
        self.calls = []
        return out
