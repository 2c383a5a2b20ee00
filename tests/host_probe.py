"""A job for tests/test_e2e_two_hosts.py: what a process forked inside a host sees."""

from __future__ import annotations

import json
import os
import socket


def main() -> None:
    print(
        json.dumps(
            {
                "hostname": socket.gethostname(),
                "interfaces": sorted(os.listdir("/sys/class/net")),
                "net_ns": os.readlink("/proc/self/ns/net"),
                "pid_ns": os.readlink("/proc/self/ns/pid"),
                "pid": os.getpid(),
                "shm_dev": os.stat("/dev/shm").st_dev,
            }
        )
    )
