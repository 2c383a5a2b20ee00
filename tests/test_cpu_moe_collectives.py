"""cpu_moe_collectives: vLLM's CpuCommunicator gains all_gatherv / reduce_scatterv.

Each world size runs on spawned gloo ranks (tests/distributed.py) through a
real ``CpuCommunicator`` over the world group, with unequal sizes per rank
(one rank holding none at world 3), and compares with the result computed
locally from every rank's (seeded) input.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_ranks

SIZES = {2: [3, 5], 3: [4, 0, 2]}


def _comm():
    import torch.distributed as dist
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    from vllm_ppspec.patches.worker import cpu_moe as cpu_moe_collectives

    cpu_moe_collectives.install()
    world = dist.group.WORLD
    return CpuCommunicator(
        cpu_group=world, device=torch.device("cpu"), device_group=world, unique_name="dp"
    )


def _input(rank: int, rows: int, dim: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    shape = [rows, 6, 7]
    shape[0], shape[dim] = shape[dim], shape[0]
    return (torch.randn(*shape, generator=g) * 10).to(dtype)


def _case(rank: int, world: int):
    comm = _comm()
    sizes = SIZES[world]
    total = sum(sizes)
    out: dict[str, object] = {}
    for dim in (0, 1, -1):
        mine = _input(rank, sizes[rank], dim % 3)
        out[f"single{dim}"] = comm.all_gatherv(mine, dim=dim, sizes=sizes)
        out[f"list{dim}"] = comm.all_gatherv([mine, mine.to(torch.int32)], dim=dim, sizes=sizes)
    out["nosizes"] = comm.all_gatherv(_input(rank, 2, 0), dim=0)
    for dim in (0, 1):
        out[f"rs{dim}"] = comm.reduce_scatterv(_input(rank, total, dim), dim=dim, sizes=sizes)
    # vLLM's combine_into_output goes through the base class's reduce_scatterv_into_output.
    dest = torch.empty(sizes[rank], 6, 7)
    comm.reduce_scatterv_into_output(_input(rank, total, 0), dest, dim=0, sizes=sizes)
    out["into"] = dest
    # Sizes that do not match this rank's rows: raised on every rank, before any collective.
    try:
        comm.all_gatherv(torch.zeros(3, 4), dim=0, sizes=[1] * world)
    except ValueError as e:
        out["bad"] = str(e)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_gatherv_and_reduce_scatterv_with_unequal_sizes_match_local_reference(world):
    results = run_ranks(_case, world=world, timeout=90)
    sizes = SIZES[world]
    total = sum(sizes)
    for r in results:
        assert r.error is None and not r.hung, r.message
        got = r.value
        for dim in (0, 1, -1):
            d = dim % 3
            inputs = [_input(q, sizes[q], d) for q in range(world)]
            want = torch.cat(inputs, dim=d)
            assert torch.equal(got[f"single{dim}"], want)
            got_f, got_i = got[f"list{dim}"]
            assert torch.equal(got_f, want)
            assert got_i.dtype == torch.int32
            assert torch.equal(got_i, torch.cat([t.to(torch.int32) for t in inputs], dim=d))
        assert torch.equal(got["nosizes"], torch.cat([_input(q, 2, 0) for q in range(world)]))
        start = sum(sizes[: r.rank])
        for dim in (0, 1):
            summed = sum(_input(q, total, dim) for q in range(world))
            want = summed.narrow(dim, start, sizes[r.rank])
            torch.testing.assert_close(got[f"rs{dim}"], want, rtol=1e-6, atol=1e-5)
        want0 = sum(_input(q, total, 0) for q in range(world)).narrow(0, start, sizes[r.rank])
        torch.testing.assert_close(got["into"], want0, rtol=1e-6, atol=1e-5)
        assert "holds 3 rows" in got["bad"] and "sizes says 1" in got["bad"]
