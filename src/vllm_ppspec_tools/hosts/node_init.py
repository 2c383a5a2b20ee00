"""Process 1 of a "host"'s pid namespace (``two_hosts``).

Runs the fork server (``vllm_ppspec_tools.fixtures.forkserver``) as its child,
on this process's stdin / stdout, and reaps every process of the namespace
that ends (orphans come to process 1). When the fork server ends, or on
SIGTERM, it exits, and the kernel then kills every process left in the
namespace: the host is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main() -> None:
    child = subprocess.Popen([sys.executable, "-m", "vllm_ppspec_tools.fixtures.forkserver"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        pid, _ = os.wait()
        if pid == child.pid:
            sys.exit(0)


if __name__ == "__main__":
    main()
