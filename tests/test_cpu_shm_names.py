"""patches/worker/cpu_shm_names.py: vLLM's CPU SHM segments lose their names once mapped.

Two gloo ranks build vLLM's ``CpuCommunicator`` for a "pp" group (its
shared-memory communicator), with and without the patch: with it, no
``/dev/shm`` name of the group is left while the group is alive, and its
all-reduce and send / receive through the segments still give the right
tensors; without it, both names are there (vLLM removes them only in a
destructor that a signalled or os._exit-ed worker never runs). Where vLLM's
CPU kernels have no shared-memory communicator (its AVX2 build: CPUs without
AVX-512), the group uses torch.distributed and names no segment, patched or
not, and the patch still wraps the communicator's set-up.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Loads vLLM's CPU kernels in each rank (this module is imported there to find
# the rank's function), so the group uses the shared-memory communicator
# where the kernels have one (cpu_shm_kernels).
import vllm._custom_ops  # noqa: F401

from tests.distributed import cpu_shm_kernels, run_ranks
from vllm_ppspec.patches.worker import cpu_shm_names

SHM = Path("/dev/shm")


def _rank(patched: bool, rank: int, world: int) -> dict:
    import torch.distributed as dist
    from vllm.distributed.device_communicators.cpu_communicator import (
        CpuCommunicator,
        _CPUSHMDistributed,
    )

    if patched:
        cpu_shm_names.install()
    group = dist.group.WORLD
    comm = CpuCommunicator(
        cpu_group=group, device=torch.device("cpu"), device_group=group, unique_name="pp:9"
    )
    shm = comm.dist_module
    prefix = f"{os.environ['VLLM_DIST_IDENT']}-pp:9-"
    x = torch.full((4096,), float(rank + 1))
    comm.all_reduce(x)
    dist.barrier()  # each rank removed its own name before this
    names = sorted(p.name for p in SHM.glob(prefix + "*"))
    dist.barrier()  # the group lives until both ranks have looked
    return {
        "shm": type(shm).__name__,
        "names": names,
        "sum": x.unique().tolist(),
        "wrapped": getattr(_CPUSHMDistributed._init_cpu_shm, "_vllm_ppspec_unlinks_names", False),
        "prefix": prefix,
    }


@pytest.mark.parametrize("patched", [True, False])
def test_segment_names_are_removed_once_every_rank_mapped_them(patched):
    import functools

    shm_kernels = cpu_shm_kernels()
    results = run_ranks(functools.partial(_rank, patched), world=2)
    assert [r.error for r in results] == [None, None], [r.message for r in results]
    r0, r1 = (r.value for r in results)
    assert r0["sum"] == r1["sum"] == [3.0]  # 1 + 2 through the segments (or gloo)
    assert r0["wrapped"] is r1["wrapped"] is patched
    if not shm_kernels:  # vLLM's AVX2 kernels: torch.distributed, no segment
        assert r0["shm"] == r1["shm"] == "module"
        assert r0["names"] == r1["names"] == []
        return
    assert r0["shm"] == r1["shm"] == "_CPUSHMDistributed"
    if patched:
        assert r0["names"] == r1["names"] == [], "names left while the group is alive"
    else:
        # vLLM's own behaviour: one name per rank while the group lives, removed
        # only by a destructor that os._exit skips (run_ranks removes them).
        assert r0["names"] == [r0["prefix"] + "[0-1]-cpushm_0", r0["prefix"] + "[0-1]-cpushm_1"]


def test_removing_a_name_twice_is_harmless(tmp_path):
    (tmp_path / "g_1").write_bytes(b"")
    assert cpu_shm_names.remove_own_name("g", 1, tmp_path) is True
    assert cpu_shm_names.remove_own_name("g", 1, tmp_path) is False
    assert not list(tmp_path.iterdir())


def test_a_name_with_leading_slashes_is_the_file_shm_open_made(tmp_path):
    # Under the external launcher vLLM's ident is "//" (from "env://").
    (tmp_path / "-pp:0-[0-1]-cpushm_0").write_bytes(b"")
    assert cpu_shm_names.segment_name("//-pp:0-[0-1]-cpushm", 0) == "-pp:0-[0-1]-cpushm_0"
    assert cpu_shm_names.remove_own_name("//-pp:0-[0-1]-cpushm", 0, tmp_path) is True
    assert not list(tmp_path.iterdir())
