"""tests/distributed.run_ranks: its ranks' vLLM groups never meet an earlier call's memory.

vLLM's CPU communicator creates shared-memory segments named after
``VLLM_DIST_IDENT`` and fails with "create shm in SHMManager failed. errno: 17"
when one of that name exists. Ranks end with ``os._exit``, which leaves the
segments behind; the harness gives each call its own ident and removes them.
"""

from __future__ import annotations

import os
from pathlib import Path

# Loads vLLM's CPU kernels in each rank (this module is imported there to find
# the rank's function), so its pp group uses the shared-memory communicator
# where the kernels have one (cpu_shm_kernels).
import vllm._custom_ops  # noqa: F401

from tests.distributed import cpu_shm_kernels, remove_shm_segments, run_ranks

SHM = Path("/dev/shm")


def _ident_and_segments(rank: int, world: int) -> tuple[str, list[str], str]:
    import torch.distributed as dist
    from vllm.distributed import get_pp_group

    ident = os.environ["VLLM_DIST_IDENT"]
    shm = type(get_pp_group().device_communicator.dist_module).__name__
    segments = sorted(p.name for p in SHM.glob(f"{ident}-*"))
    dist.barrier()  # rank 0 holds the store: it ends after every rank has its groups
    return ident, segments, shm


def test_each_call_has_its_own_shm_segments_and_removes_them():
    shm_kernels = cpu_shm_kernels()
    first = run_ranks(_ident_and_segments, world=2, vllm_groups=True)
    second = run_ranks(_ident_and_segments, world=2, vllm_groups=True)
    for results in (first, second):
        assert [r.error for r in results] == [None, None], [r.message for r in results]
        (ident, segments, shm), (ident1, _, shm1) = (r.value for r in results)
        assert ident == ident1  # both ranks name the same segments
        if shm_kernels:
            assert shm == shm1 == "_CPUSHMDistributed"
            assert segments, "the pp group made no shared-memory segment"
        else:  # vLLM's AVX2 kernels: torch.distributed, no segment
            assert (shm, shm1, segments) == ("module", "module", [])
        assert not list(SHM.glob(f"{ident}-*")), "the call left its segments behind"
    assert first[0].value[0] != second[0].value[0]


def test_removing_segments_touches_only_that_ident(tmp_path):
    for name in ("a-pp:0-[0-1]-cpushm_0", "a-pp:0-[0-1]-cpushm_1", "ab-pp:0-[0-1]-cpushm_0"):
        (tmp_path / name).write_bytes(b"")
    assert sorted(remove_shm_segments("a", tmp_path)) == [
        "a-pp:0-[0-1]-cpushm_0",
        "a-pp:0-[0-1]-cpushm_1",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["ab-pp:0-[0-1]-cpushm_0"]
