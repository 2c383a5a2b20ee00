"""Remove the names of vLLM's CPU shared-memory segments once every rank has them open.

vLLM's CPU communicator (``_CPUSHMDistributed._init_cpu_shm``,
vllm/distributed/device_communicators/cpu_communicator.py) gives each PP / TP
group one shared-memory segment per rank, ``/dev/shm/<group name>_<rank>``:
each rank creates its own, then opens every other rank's, with a barrier on
the group after each step. The names are removed only by the C++ manager's
destructor, which a worker ended by a signal or ``os._exit`` never runs, so
each stopped engine leaves its segments in ``/dev/shm`` (8 MB each, one per rank
and group). A later group that gets the same name then fails with "create shm
in SHMManager failed. errno: 17" (names follow ``VLLM_DIST_IDENT``: the port,
or the init file's name).

The wrapper :func:`install` puts in its place calls vLLM's function unchanged
and then removes this rank's own name. After the function's second barrier every rank has mapped
every segment, and a mapping outlives the name: the collectives run as before,
and the memory is freed when the last rank's process ends, however it ends.
The destructor's later ``shm_unlink`` finds no name and changes nothing.
The plugin's CPU worker calls :func:`install` before vLLM builds its groups.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

SHM_DIR = Path("/dev/shm")
_WRAPPED = "_vllm_ppspec_unlinks_names"


def segment_name(group_name: str, rank: int) -> str:
    """The file name in /dev/shm of ``rank``'s segment of ``group_name``: vLLM's
    SHM manager opens ``<group name>_<rank>`` (csrc/cpu/shm.cpp, ``SHMManager``),
    and glibc's ``shm_open`` drops the name's leading slashes (under vLLM's
    external launcher the init method is ``env://`` and the group name starts
    with ``//``)."""
    return f"{group_name}_{rank}".lstrip("/")


def remove_own_name(group_name: str, rank: int, shm_dir: Path = SHM_DIR) -> bool:
    """Remove this rank's segment name; True if it was there."""
    try:
        os.unlink(shm_dir / segment_name(group_name, rank))
    except FileNotFoundError:
        return False
    return True


def _wrap(init_cpu_shm: Any) -> Any:
    @functools.wraps(init_cpu_shm)
    def wrapper(self: Any) -> int:
        handle = init_cpu_shm(self)  # ends with a barrier after every rank joined
        remove_own_name(self.group_name, self.communicator.rank)  # the rank vLLM named it by
        return handle

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def install(worker: Any = None) -> bool:
    """Wrap ``_CPUSHMDistributed._init_cpu_shm``; False if it is wrapped already."""
    from vllm.distributed.device_communicators import cpu_communicator

    cls = cpu_communicator._CPUSHMDistributed
    if getattr(cls._init_cpu_shm, _WRAPPED, False):
        return False
    cls._init_cpu_shm = _wrap(cls._init_cpu_shm)  # type: ignore[method-assign]
    return True
