"""Cost of one speculative round (async scheduling), two local gloo ranks.

    vllm-ppspec-transport-bench [--rounds 300]

(``python -m vllm_ppspec_tools.transport_bench`` runs the same.)

Times one round as seen by the receiver (from a barrier to the round in its
hands) at 16 and 256 requests with k=3 and k=7 (``max_num_seqs`` 256, vLLM's
default), over 127.0.0.1, for:

* ``message``: :class:`vllm_ppspec.protocol.rounds.RoundChannel`, the plugin's
  protocol: one static-size message from the last rank (``isend`` /
  ``irecv``);
* ``all_reduce``: the protocol it replaced, kept here as the reference: one
  ``all_reduce(MAX)`` of the same static-size message, every rank contributing.

Prints the median and minimum microseconds per round, the two protocols
interleaved. On one host both are a few hundred microseconds. Between hosts
what counts is the trips each needs (one one-way trip for the message once
the receive is posted, about three for the all-reduce): loopback cannot show
it; ``tests/test_round_link.py`` and scripts/bench_two_hosts.py measure it
over a delay line. Sync scheduling exchanges nothing per round (docs/design.md).
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


def _all_reduce(rank: int, rows: int, k: int, payload: Any) -> None:
    """The previous protocol: one all_reduce(MAX) of the static-size message,
    the receiver contributing its header and an INT32_MIN payload."""
    import torch
    import torch.distributed as dist

    message = torch.full((5 + CAPACITY * (2 * k + 1),), torch.iinfo(torch.int32).min)
    message = message.to(torch.int32)
    message[:5] = torch.tensor([rows, -rows, 0, k, -k], dtype=torch.int32)
    if rank == 1:
        message[5 : 5 + payload.numel()] = payload.reshape(-1)
    dist.all_reduce(message, op=dist.ReduceOp.MAX)


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
        times: dict[str, list[float]] = {"message": [], "all_reduce": []}
        for _ in range(rounds):
            for proto in ("message", "all_reduce"):  # interleaved
                dist.barrier()
                start = time.perf_counter()
                if proto == "all_reduce":
                    _all_reduce(rank, rows, k, payload)
                elif rank == 1:
                    channel.post(rows, sampled, drafts).wait()
                else:
                    channel.expect(rows).wait()
                times[proto].append((time.perf_counter() - start) * 1e6)
        results[(rows, k)] = {proto: (statistics.median(t), min(t)) for proto, t in times.items()}
    if rank == 0:  # the receiver's view
        out.put(results)
    dist.destroy_process_group()


def measure(rounds: int) -> dict[tuple[int, int], dict[str, tuple[float, float]]]:
    """{(requests, k): {"message"|"all_reduce": (median us, min us)}} from two spawned
    gloo ranks, as the receiver (rank 0) saw them."""
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
        f"round over gloo on 127.0.0.1 (async scheduling), as the receiver sees it, "
        f"{rounds} interleaved rounds per case, max_num_seqs {CAPACITY}"
    )
    for (rows, k), r in results.items():
        (msg_med, msg_min), (ar_med, ar_min) = r["message"], r["all_reduce"]
        print(
            f"  {rows:4d} requests, k={k}: message {msg_med:8.1f} us median "
            f"({msg_min:7.1f} min); all_reduce {ar_med:8.1f} us ({ar_min:7.1f}); "
            f"ratio {msg_med / ar_med:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    report(measure(args.rounds), args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
