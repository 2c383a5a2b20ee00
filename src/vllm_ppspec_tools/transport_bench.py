"""Cost of one speculative round's exchange (async scheduling), two local gloo ranks.

    python -m vllm_ppspec_tools.transport_bench [--rounds 300]

Times one round as seen by the last rank at 16 and 256 requests with k=3 and
k=7 (``max_num_seqs`` 256, vLLM's default), over 127.0.0.1, for:

* ``one``: :class:`transport.RoundChannel`, the plugin's protocol: one
  ``all_reduce`` of a static-size message (header + payload);
* ``two``: the protocol it replaced, kept here as the reference: a header
  ``all_reduce``, then a ``broadcast`` of a payload sized by it.

Prints the median and minimum microseconds per round, the two protocols
interleaved. On one host both are a few hundred microseconds, the static
message slightly slower (it always carries ``max_num_seqs`` rows). Between
hosts each rendezvous adds network latency that a loopback run cannot show
(this machine has no netem): the receiver waits for an all-reduce and then a
broadcast under ``two``, for one all-reduce under ``one``. Sync scheduling
exchanges nothing per round (docs/design.md).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time
from typing import Any

CASES = [(16, 3), (16, 7), (256, 3), (256, 7)]
CAPACITY = 256


def _two_rendezvous(rank: int, rows: int, k: int, payload: Any) -> None:
    """The previous protocol: header all_reduce, then a payload broadcast sized by it."""
    import torch
    import torch.distributed as dist

    header = torch.tensor([rows, -rows, 0, k, -k], dtype=torch.int32)
    dist.all_reduce(header, op=dist.ReduceOp.MAX)
    buf = payload if rank == 1 else torch.empty((rows, 2 * k + 1), dtype=torch.int32)
    dist.broadcast(buf, src=1)


def _rank(rank: int, port: int, rounds: int, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from vllm_ppspec.protocol.rounds import RoundChannel

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.group.WORLD
    results = {}
    for rows, k in CASES:
        sampled = torch.randint(0, 500, (rows, k + 1), dtype=torch.int32)
        drafts = torch.randint(0, 500, (rows, k), dtype=torch.int32)
        payload = torch.cat([sampled, drafts], dim=1)
        channel = RoundChannel(group, 1, CAPACITY, k)  # type: ignore[arg-type]
        times: dict[str, list[float]] = {"one": [], "two": []}
        for _ in range(rounds):
            for proto in ("one", "two"):  # interleaved
                dist.barrier()
                start = time.perf_counter()
                if proto == "two":
                    _two_rendezvous(rank, rows, k, payload)
                elif rank == 1:
                    channel.send(rows, sampled, drafts)
                else:
                    channel.recv(rows)
                times[proto].append((time.perf_counter() - start) * 1e6)
        results[(rows, k)] = {proto: (statistics.median(t), min(t)) for proto, t in times.items()}
    if rank == 1:
        out.put(results)
    dist.destroy_process_group()


def measure(rounds: int) -> dict[tuple[int, int], dict[str, tuple[float, float]]]:
    """{(requests, k): {"one"|"two": (median us, min us)}} from two spawned gloo ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, rounds, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = out.get(timeout=600)
    for p in procs:
        p.join(timeout=30)
    return results  # type: ignore[no-any-return]


def report(results: dict[tuple[int, int], dict[str, tuple[float, float]]], rounds: int) -> None:
    print(
        f"round exchange over gloo on 127.0.0.1 (async scheduling), {rounds} interleaved "
        f"rounds per case, max_num_seqs {CAPACITY}"
    )
    for (rows, k), r in results.items():
        (one_med, one_min), (two_med, two_min) = r["one"], r["two"]
        print(
            f"  {rows:4d} requests, k={k}: one rendezvous {one_med:8.1f} us median "
            f"({one_min:7.1f} min); two {two_med:8.1f} us ({two_min:7.1f}); "
            f"ratio {one_med / two_med:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    report(measure(args.rounds), args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
