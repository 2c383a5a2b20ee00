"""An orderly stop of node 0 across two hosts: the plugin's against vLLM's own PP.

    .venv/bin/python scripts/stop_noise_two_hosts.py [--stress] CASE...

CASE is ``DRAFTER:SIGNAL:MODE[:compiled]``: DRAFTER a tiny drafter
(``draft_copy``) or ``none`` (vLLM's own PP=2, its own worker, no spec);
SIGNAL ``SIGINT`` (a Ctrl-C: node 0's process group) or ``SIGTERM`` (its main
process); MODE ``sync`` or ``async``. vLLM's own PP=2 needs ``compiled``: with
``--enforce-eager`` its PP rank 1 fails the first request on CPU
(``assert self.intermediate_tensors is not None``). Each case: two hosts
(``vllm_ppspec_tools.hosts``), one request, 1 s idle, the stop; prints when
each host was empty (a host left running after 30 s is said so, then
killed), the exit codes, and each log's noise kinds
(``fixtures.server.noise_kind``). ``--stress``: three busy processes for 4 s
from the stop, as other jobs on a loaded machine (the API server's race of
``fixtures.server.API_SERVER_STOP_ERROR`` shows then). Needs root.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_ppspec_tools.fixtures.server import (
    greedy_completion,
    noise,
    noise_kind,
    openai_client,
    send_stop,
    stop_args,
)
from vllm_ppspec_tools.fixtures.tiny_models import build_all
from vllm_ppspec_tools.hosts.two_hosts import Pipeline, two_hosts

REPO = Path(__file__).resolve().parent.parent
BUSY = "import time\nt = time.time()\nwhile time.time() - t < 4: pass"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--stress", action="store_true")
    args = ap.parse_args()
    models = build_all(REPO / ".cache" / "models")
    with two_hosts("sn") as hosts, tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(args.cases):
            drafter, sig, mode, *compiled = case.split(":")
            logs = Path(tmp) / str(i)
            logs.mkdir()
            extra = stop_args(sig, mode)
            pipe = Pipeline(
                hosts, models, None if drafter == "none" else drafter, logs, *extra,
                eager=not compiled,
            )  # fmt: skip
            try:
                pipe.wait_ready()
                greedy_completion(openai_client(pipe.base, timeout=60), "tiny", [5, 6, 7], 16)
                time.sleep(1.0)
                if args.stress:
                    for _ in range(3):
                        subprocess.Popen([sys.executable, "-c", BUSY])  # ends in 4 s
                t = time.monotonic()
                send_stop(hosts.nodes[0].root_pid(pipe.jobs[0].pid), sig)
                empty: dict[int, float] = {}
                while len(empty) < 2 and time.monotonic() - t < 30:
                    for r, node in enumerate(hosts.nodes):
                        if r not in empty and not node.vllm_pids():
                            empty[r] = round(time.monotonic() - t, 1)
                    time.sleep(0.1)
                codes = [j.poll() for j in pipe.jobs]
            finally:
                pipe.stop()
            print(f"{case}: hosts empty after {empty} s (others left after 30 s); exit {codes}")
            for r, log in enumerate(p.read_text() for p in pipe.logs):
                kinds = sorted({noise_kind(line) for line in noise(log)})
                print(f"  host {r}: {len(noise(log))} noise lines, kinds {kinds}")


if __name__ == "__main__":
    main()
