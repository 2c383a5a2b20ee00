"""Give vLLM's CPU communicator ``all_gatherv`` and ``reduce_scatterv``, in gloo.

vLLM's ``CpuCommunicator`` inherits both from ``DeviceCommunicatorBase``,
where they raise ``NotImplementedError``. A MoE model at data-parallel size > 1
calls them in every MoE layer (``AgRsAll2AllManager.dispatch`` /
``dispatch_router_logits`` gather every DP rank's tokens, ``combine``
reduce-scatters the expert outputs back; vllm/distributed/device_communicators/
all2all.py, through ``GroupCoordinator.all_gatherv`` / ``reduce_scatterv`` of
the DP group), so on CPU such a model fails at its first forward.

Both functions below use only gloo collectives on the communicator's
``device_group`` (a gloo group on CPU), which every rank of the group calls
once per tensor, in the same order:

* :func:`all_gatherv`: per tensor, one ``all_gather`` of the tensors padded
  along ``dim`` to ``max(sizes)``; each rank's slice is cut back to its size.
* :func:`reduce_scatterv`: one ``all_reduce`` (sum) of the whole input, then
  this rank's slice ``sizes[:rank]`` .. ``+ sizes[rank]`` along ``dim``.

``sizes`` (one entry per rank, equal on every rank; ``None``: every rank has
the same size) is what vLLM's DP metadata gives. A rank whose tensor does not
have ``sizes[rank]`` rows raises before any collective. Both are written for
correctness on small CPU runs, not speed (the all-reduce moves the whole
tensor). :func:`install` sets them on ``CpuCommunicator``; the plugin's CPU
worker calls it, so nothing changes unless the plugin's worker is selected.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _check_sizes(
    sizes: list[int] | None, world: int, rank: int, local: int, what: str
) -> list[int]:
    if sizes is None:
        return [local] * world
    if len(sizes) != world:
        raise ValueError(f"{what}: sizes {sizes} has {len(sizes)} entries for {world} ranks")
    if sizes[rank] != local:
        raise ValueError(
            f"{what}: rank {rank} holds {local} rows along dim, sizes says {sizes[rank]}"
        )
    return list(sizes)


def _gather_one(comm, t: torch.Tensor, dim: int, sizes: list[int] | None) -> torch.Tensor:
    world, rank = comm.world_size, comm.rank_in_group
    d = dim + t.dim() if dim < 0 else dim
    full = _check_sizes(sizes, world, rank, t.shape[d], "all_gatherv")
    x = t.movedim(d, 0)
    pad = max(full) - x.shape[0]
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=comm.device_group)
    out = torch.cat([p[:n] for p, n in zip(parts, full, strict=True)])
    return out.movedim(0, d).contiguous()


def all_gatherv(
    self,
    input_: torch.Tensor | list[torch.Tensor],
    dim: int = 0,
    sizes: list[int] | None = None,
) -> torch.Tensor | list[torch.Tensor]:
    """Concatenate every rank's tensor (or each tensor of a list) along ``dim``."""
    if isinstance(input_, torch.Tensor):
        return _gather_one(self, input_, dim, sizes)
    return [_gather_one(self, t, dim, sizes) for t in input_]


def reduce_scatterv(
    self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None
) -> torch.Tensor:
    """Sum ``input_`` over the ranks; return this rank's ``sizes[rank]`` rows along ``dim``."""
    world, rank = self.world_size, self.rank_in_group
    d = dim + input_.dim() if dim < 0 else dim
    total = input_.shape[d]
    if sizes is None:
        if total % world:
            raise ValueError(f"reduce_scatterv: {total} rows do not split over {world} ranks")
        sizes = [total // world] * world
    if len(sizes) != world or sum(sizes) != total:
        raise ValueError(
            f"reduce_scatterv: sizes {sizes} do not split {total} rows over {world} ranks"
        )
    summed = input_.contiguous().clone()
    dist.all_reduce(summed, group=self.device_group)
    start = sum(sizes[:rank])
    return summed.narrow(d, start, sizes[rank]).contiguous()


def install(worker: object = None) -> None:
    """Give vLLM's ``CpuCommunicator`` these two methods (idempotent)."""
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    CpuCommunicator.all_gatherv = all_gatherv  # type: ignore[method-assign,assignment]
    CpuCommunicator.reduce_scatterv = reduce_scatterv  # type: ignore[method-assign,assignment]
