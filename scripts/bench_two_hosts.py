"""PP=2 across two hosts over a slow link: speculation against none.

    .venv/bin/python scripts/bench_two_hosts.py [--delays 0,1,5]
        [--modes nospec,sync,async,ngram] [--drafter draft_copy]
        [--tokens 128] [--repeats 2] [--out results/two_hosts.json]

Two hosts of network + pid namespaces (vllm_ppspec_tools.hosts.two_hosts)
joined by the delay line (hosts.delay_line: every packet delayed by D ms one
way). For
each delay, each mode starts ``vllm serve --nnodes 2`` on the two hosts
(compiled: vLLM's eager PP=2 without speculation fails on CPU) and measures
greedy tok/s with 1 request in flight (``--tokens`` each, 3 requests one
after the other) and with 16 (one wave of 16 at once); repeats are
interleaved over the in-flight counts; min and median are reported. Modes:
``nospec`` (PP=2, no speculative config), ``sync`` / ``async`` (the tiny
drafter, k=3, with sync / async scheduling), ``ngram`` (the planted target
with ngram, sync). (Receivers posting their side of a round only when due,
measured before pre-posting became the only behaviour: docs/measurements.md.)
The servers run with ``VLLM_SERVER_DEV_MODE=1`` so that the bench reads each
rank's runner clocks (``/collective_rpc ppspec_clocks``) on PP rank 0: its
wait for rounds per step, and the part of it after the last rank had sent the
round (the round's own cost; one machine, one clock), per round, in
microseconds and in round trips (2 x the delay). Needs root.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vllm_ppspec_tools.fixtures.server import openai_client
from vllm_ppspec_tools.fixtures.tiny_models import build_all
from vllm_ppspec_tools.hosts.two_hosts import Pipeline, two_hosts

REPO = Path(__file__).resolve().parent.parent


def clocks(base: str) -> list[dict[str, float]]:
    """Each PP rank's runner clocks (the plugin worker's ``ppspec_clocks``);
    the plugin's worker only (``nospec`` runs vLLM's own: the plugin selects
    itself only for PP + speculative decoding)."""
    request = urllib.request.Request(
        base + "/collective_rpc",
        data=json.dumps({"method": "ppspec_clocks"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())["results"]


def tok_s(base: str, in_flight: int, tokens: int) -> float:
    client = openai_client(base, timeout=600)

    def one(i: int) -> int:
        resp = client.completions.create(
            model="tiny",
            prompt=[5 + i, 6, 7],
            max_tokens=tokens,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        return int(resp.usage.completion_tokens)

    start = time.monotonic()
    if in_flight == 1:
        done = sum(one(i) for i in range(3))
    else:
        with ThreadPoolExecutor(in_flight) as pool:
            done = sum(pool.map(one, range(in_flight)))
    return done / (time.monotonic() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--delays", default="0,1,5")
    ap.add_argument("--modes", default="nospec,sync,async,ngram")
    ap.add_argument("--drafter", default="draft_copy")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "two_hosts.json")
    args = ap.parse_args()
    # SIGTERM unwinds too, so that the namespaces and servers are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    models = build_all(REPO / ".cache" / "models")
    results: list[dict] = []
    for delay in [float(d) for d in args.delays.split(",")]:
        with two_hosts(f"b{int(delay)}", delay_ms=delay) as hosts:
            for mode in args.modes.split(","):
                drafter = {"nospec": None, "ngram": "ngram"}.get(mode, args.drafter)
                extra = ["--async-scheduling"] if mode.startswith("async") else []
                with tempfile.TemporaryDirectory() as logs:
                    pipe = Pipeline(
                        hosts,
                        models,
                        drafter,
                        Path(logs),
                        *extra,
                        eager=False,
                        common={"VLLM_SERVER_DEV_MODE": "1"},
                    )
                    try:
                        pipe.wait_ready(timeout=600)
                        tok_s(pipe.base, 1, 8)  # warm-up
                        runs: dict[int, list[float]] = {1: [], 16: []}
                        waits: dict[int, list[float]] = {1: [], 16: []}  # rank 0, us/step
                        travel: dict[int, list[float]] = {1: [], 16: []}  # rank 0, us/round
                        for _ in range(args.repeats):
                            for n in runs:
                                # vLLM's own worker (nospec) has no clocks, and an
                                # unknown RPC method ends its engine.
                                before = clocks(pipe.base) if drafter else []
                                runs[n].append(tok_s(pipe.base, n, args.tokens))
                                after = clocks(pipe.base) if drafter else []
                                if before and after and after[0]:
                                    steps = after[0]["steps"] - before[0]["steps"]
                                    wait = after[0]["wait_s"] - before[0]["wait_s"]
                                    waits[n].append(1e6 * wait / max(steps, 1))
                                    rounds = after[0]["rounds"] - before[0]["rounds"]
                                    late = after[0]["travel_wait_s"] - before[0]["travel_wait_s"]
                                    if rounds:
                                        travel[n].append(1e6 * late / rounds)
                    finally:
                        pipe.stop()
                for n, values in runs.items():
                    row = {
                        "delay_ms": delay,
                        "mode": mode,
                        "drafter": drafter,
                        "in_flight": n,
                        "tok_s_min": min(values),
                        "tok_s_median": statistics.median(values),
                        "runs": values,
                        "round_wait_us_per_step_rank0": waits[n] or None,
                        "round_travel_wait_us_per_round_rank0": travel[n] or None,
                        "round_trip_us": 2000 * delay,
                    }
                    results.append(row)
                    print(json.dumps(row), flush=True)
    base = {(r["delay_ms"], r["in_flight"]): r for r in results if r["mode"] == "nospec"}
    for r in results:
        ref = base.get((r["delay_ms"], r["in_flight"]))
        if ref and r["mode"] != "nospec":
            r["ratio_median"] = r["tok_s_median"] / ref["tok_s_median"]
            r["ratio_min"] = r["tok_s_min"] / ref["tok_s_min"]
            wait = r["round_wait_us_per_step_rank0"]
            waited = f", round wait {statistics.median(wait):.0f} us/step" if wait else ""
            late = r["round_travel_wait_us_per_round_rank0"]
            if late:
                cost = statistics.median(late)
                rtt = r["round_trip_us"]
                trips = f" = {cost / rtt:.2f} round trips" if rtt else ""
                waited += f", after it was sent {cost:.0f} us/round{trips}"
            print(
                f"delay {r['delay_ms']:g} ms, {r['in_flight']} in flight: {r['mode']} "
                f"{r['tok_s_median']:.1f} tok/s vs no spec {ref['tok_s_median']:.1f}: "
                f"{r['ratio_median']:.2f}x (min/min {r['ratio_min']:.2f}x){waited}"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    plot(results, args.out.with_suffix(".png"))
    return 0


def plot(results: list[dict], path: Path) -> None:
    """tok/s (median) against the one-way delay, one line per mode and load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, n in zip(axes, (1, 16), strict=True):
        for mode in dict.fromkeys(r["mode"] for r in results):
            rows = [r for r in results if r["mode"] == mode and r["in_flight"] == n]
            ax.plot(
                [r["delay_ms"] for r in rows], [r["tok_s_median"] for r in rows], "o-", label=mode
            )
        ax.set_title(f"PP=2 across two hosts, {n} in flight")
        ax.set_xlabel("one-way delay (ms)")
        ax.set_ylabel("tok/s (median)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
