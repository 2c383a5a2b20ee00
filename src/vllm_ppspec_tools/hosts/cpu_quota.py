"""A host held to part of a core: the cgroup v1 ``cpu`` controller's CFS quota.

``cpu_quota(share)`` makes a cgroup under ``/sys/fs/cgroup/cpu`` whose
processes together run at most ``share`` of one core (``cpu.cfs_quota_us``
over ``cpu.cfs_period_us``, 100 ms), :func:`join` moves processes into it (their
children inherit it: a host's fork server moved in forks its ``vllm serve``
there), and the group is emptied and removed on exit. Used by the measured
layer split's tests and bench (tests/test_e2e_slow_host.py,
``scripts/bench_slow_host.py``).

Elsewhere: cgroup v2's ``cpu.max`` (``"50000 100000"``) does the same; without
cgroups, a busy loop pinned to the host's core (``taskset``) halves it less
exactly.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def available() -> bool:
    return (ROOT / "cpu.cfs_quota_us").is_file() and os.access(ROOT, os.W_OK)


def join(group: Path, pids: Iterable[int]) -> None:
    """Move each process (with all its threads) into ``group``; gone ones are skipped."""
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass
        except OSError as e:
            if e.errno != 3:  # ESRCH: the process ended
                raise


@contextmanager
def cpu_quota(share: float, tag: str = "host") -> Iterator[Path]:
    """A cgroup whose processes run at most ``share`` of a core; removed on exit."""
    if not available():
        raise RuntimeError(f"no writable cgroup v1 cpu controller at {ROOT}")
    group = ROOT / f"ppspec-{tag}-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(share * PERIOD_US)))
        yield group
    finally:
        deadline = time.monotonic() + 10
        while True:  # processes forked meanwhile join it: move until it stays empty
            left = (group / "cgroup.procs").read_text().split()
            join(ROOT, (int(p) for p in left))
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
