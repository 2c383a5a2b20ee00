"""Over a slow link, a round costs the receiver one one-way trip.

Two ranks of a gloo group, each in its own network namespace (hosts/netns.py),
joined by the delay line (hosts/delay_line.py: every packet held D ms one
way). The receiver posts its receive of every round first (``expect``, as a
non-last PP rank does at the end of its step); the sender then sends them
one by one. ``Round.travel_wait_s`` is how long the receiver waited after the
sender sent (one machine: one clock): it must be one one-way trip, under a
round trip. An ``all_reduce`` of the same message (this protocol before)
takes about three one-way trips there, even with the receiver's side posted
first.
"""

from __future__ import annotations

import statistics

from tests.delay_ranks import run_two_ranks

DELAY_MS = 30.0
ROUNDS = 8

RANK = """
import json, sys, time
import torch, torch.distributed as dist
from vllm_ppspec.protocol.rounds import RoundChannel
rank, master = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://{master}:29533", rank=rank, world_size=2)
ch = RoundChannel(dist.group.WORLD, 1, 64, 3)
ch.agree_shape()
n = int(sys.argv[3])
if rank == 1:
    time.sleep(1.0)  # the receiver's receives are posted meanwhile
    for i in range(n):
        ch.post(2, torch.tensor([[i, i + 1], [i + 2, -1]]), None).wait()
        time.sleep(0.2)
    out = None
else:
    posted = [ch.expect(2) for _ in range(n)]
    rounds = [p.wait() for p in posted]
    assert [int(r.sampled[0, 0]) for r in rounds] == list(range(n))
    out = [r.travel_wait_s for r in rounds]
dist.barrier()
print(json.dumps(out), flush=True)
"""


def test_a_posted_round_arrives_one_one_way_trip_after_it_was_sent():
    travel, _ = run_two_ranks(RANK, "round", 234, DELAY_MS, str(ROUNDS))
    travel_ms = [1000 * t for t in travel]
    median = statistics.median(travel_ms)
    print(f"one-way {DELAY_MS} ms: round travel wait median {median:.1f} ms, all {travel_ms}")
    assert len(travel_ms) == ROUNDS
    assert median >= 0.8 * DELAY_MS, travel_ms  # the link's delay was really paid ...
    assert median <= DELAY_MS + 15.0, travel_ms  # ... once: under a round trip (60 ms)
