"""cpu_moe_collectives: vLLM's CpuCommunicator gains all_gatherv / reduce_scatterv.

Each case runs on spawned gloo ranks (tests/distributed.py) through a real
``CpuCommunicator`` over the world group, with unequal sizes per rank, and
compares with the result computed locally from every rank's (seeded) input.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_ranks

SIZES = {2: [3, 5], 3: [4, 0, 2]}


def _comm():
    import torch.distributed as dist
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    from vllm_ppspec import cpu_moe_collectives

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


def _gather_case(rank: int, world: int):
    comm = _comm()
    sizes = SIZES[world]
    out = {}
    for dim in (0, 1, -1):
        d = dim % 3
        mine = _input(rank, sizes[rank], d)
        out[f"single{dim}"] = comm.all_gatherv(mine, dim=dim, sizes=sizes)
        ids = mine.to(torch.int32)
        out[f"list{dim}"] = comm.all_gatherv([mine, ids], dim=dim, sizes=sizes)
    equal = _input(rank, 2, 0)
    out["nosizes"] = comm.all_gatherv(equal, dim=0)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_all_gatherv_with_unequal_sizes_matches_concatenation(world):
    results = run_ranks(_gather_case, world=world, timeout=90)
    sizes = SIZES[world]
    for r in results:
        assert r.error is None and not r.hung, r.message
        for dim in (0, 1, -1):
            d = dim % 3
            inputs = [_input(q, sizes[q], d) for q in range(world)]
            want = torch.cat(inputs, dim=d)
            assert torch.equal(r.value[f"single{dim}"], want)
            got_f, got_i = r.value[f"list{dim}"]
            assert torch.equal(got_f, want)
            assert got_i.dtype == torch.int32
            assert torch.equal(got_i, torch.cat([t.to(torch.int32) for t in inputs], dim=d))
        assert torch.equal(r.value["nosizes"], torch.cat([_input(q, 2, 0) for q in range(world)]))


def _scatter_case(rank: int, world: int):
    comm = _comm()
    sizes = SIZES[world]
    total = sum(sizes)
    out = {}
    for dim in (0, 1):
        out[dim] = comm.reduce_scatterv(_input(rank, total, dim), dim=dim, sizes=sizes)
    # vLLM's combine_into_output goes through the base class's reduce_scatterv_into_output.
    dest = torch.empty(sizes[rank], 6, 7)
    comm.reduce_scatterv_into_output(_input(rank, total, 0), dest, dim=0, sizes=sizes)
    out["into"] = dest
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatterv_with_unequal_sizes_matches_sum_then_split(world):
    results = run_ranks(_scatter_case, world=world, timeout=90)
    sizes = SIZES[world]
    total = sum(sizes)
    for r in results:
        assert r.error is None and not r.hung, r.message
        start = sum(sizes[: r.rank])
        for dim in (0, 1):
            summed = sum(_input(q, total, dim) for q in range(world))
            want = summed.narrow(dim, start, sizes[r.rank])
            torch.testing.assert_close(r.value[dim], want, rtol=1e-6, atol=1e-5)
        want0 = sum(_input(q, total, 0) for q in range(world)).narrow(0, start, sizes[r.rank])
        torch.testing.assert_close(r.value["into"], want0, rtol=1e-6, atol=1e-5)


def _bad_sizes_case(rank: int, world: int):
    comm = _comm()
    # Every rank sees the same wrong sizes list: both raise before any collective.
    comm.all_gatherv(torch.zeros(3, 4), dim=0, sizes=[1, 1])


def test_wrong_sizes_raise_on_every_rank_without_a_collective():
    results = run_ranks(_bad_sizes_case, world=2, timeout=60)
    for r in results:
        assert r.error == "ValueError" and "sizes says 1" in r.message, r
