"""``vllm`` in a fresh interpreter on a host, as a user's shell starts it.

A host's fork server (``node_init``) runs this module in a forked child with
``sys.argv`` the command line (``["vllm", "serve", ...]``); it replaces the
child by the venv's ``vllm`` executable: same pid, namespaces, environment
and log, but nothing of the fork server's interpreter (its imports, its
frozen garbage collector, its start-method hooks).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    vllm = str(Path(sys.executable).parent / "vllm")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(vllm, [vllm, *sys.argv[1:]])
