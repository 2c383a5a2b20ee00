"""Cost of one speculative round's exchange (async scheduling), two local gloo ranks.

    python -m vllm_ppspec.transport_bench [--rounds 300]

Times ``send_round`` / ``recv_round`` (header all-reduce + one broadcast) at
16 and 256 requests with k=3 and k=7 over 127.0.0.1 and prints the median and
minimum microseconds per round as seen by the last rank. Sync scheduling
exchanges nothing per round (docs/design.md), so this is the async path's cost.
Between hosts each collective adds a network round trip.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time

CASES = [(16, 3), (16, 7), (256, 3), (256, 7)]


def _rank(rank: int, port: int, rounds: int, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from vllm_ppspec.transport import recv_round, send_round

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.group.WORLD
    results = {}
    for rows, k in CASES:
        sampled = torch.randint(0, 500, (rows, k + 1), dtype=torch.int32)
        drafts = torch.randint(0, 500, (rows, k), dtype=torch.int32)
        times = []
        for _ in range(rounds):
            dist.barrier()
            start = time.perf_counter()
            if rank == 1:
                send_round(group, 1, rows, k, sampled, drafts)  # type: ignore[arg-type]
            else:
                recv_round(group, 1, rows, k)  # type: ignore[arg-type]
            times.append((time.perf_counter() - start) * 1e6)
        results[(rows, k)] = (statistics.median(times), min(times))
    if rank == 1:
        out.put(results)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, args.rounds, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = out.get(timeout=600)
    for p in procs:
        p.join(timeout=30)
    print(f"round exchange over gloo on 127.0.0.1 (async), {args.rounds} rounds per case")
    for (rows, k), (med, low) in results.items():
        print(f"  {rows:4d} requests, k={k}: median {med:7.1f} us, min {low:7.1f} us per round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
