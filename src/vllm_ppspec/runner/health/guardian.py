"""A worker's guardian: SIGKILL the worker when its peer watch stops beating.

Run by path, not imported (``heartbeat.Heartbeat.start_guardian``), with the
standard library only: ``python -I -S guardian.py WORKER_PID BOUND_S RANK FD``.
The worker's watch thread writes one byte to the pipe ``FD`` per beat. When
nothing arrives for ``BOUND_S`` seconds while the worker is still this
process's parent, the worker is stopped or frozen (its peers on other hosts
declare it gone after the same bound and end theirs): the guardian says so on
stderr and SIGKILLs it, so that vLLM's executor on this host sees its worker
die and stops the engine here. The guardian exits when the pipe closes (the
worker ended, or its watch ended) or its parent changes.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time


def main(argv: list[str]) -> int:
    worker, bound_s, rank, fd = int(argv[1]), float(argv[2]), argv[3], int(argv[4])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    poller = select.poll()  # the descriptor's number may be above 1024
    poller.register(fd, select.POLLIN)
    last = time.monotonic()
    while os.getppid() == worker:
        if poller.poll(500):
            try:
                data = os.read(fd, 4096)
            except OSError:
                return 0
            if not data:
                return 0  # the worker, or its watch, ended
            last = time.monotonic()
            continue
        silent = time.monotonic() - last
        if silent > bound_s and os.getppid() == worker:
            print(
                f"vllm-ppspec: the peer watch of PP rank {rank} (worker pid {worker}) has not "
                f"run for {silent:.0f} s: the worker is stopped or frozen, and its PP peers "
                "declare it gone; killing it so that vLLM stops the engine on this host",
                file=sys.stderr,
                flush=True,
            )
            os.kill(worker, signal.SIGKILL)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
