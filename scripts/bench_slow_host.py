"""PP=2 across two hosts, one held to part of a core: which layer split serves fastest.

    .venv/bin/python scripts/bench_slow_host.py [--share 0.5] [--slow 1]
        [--splits even,weights,measured,17,19,21,23,25] [--loads 1,8,16]
        [--tokens 64] [--repeats 2] [--out results/slow-host-smollm2.json]

SmolLM2-135M (30 layers) with ngram (k = 3), ``vllm serve --nnodes 2`` over two
hosts of network + pid namespaces (``vllm_ppspec_tools.hosts.two_hosts``), host
``--slow`` inside a cgroup held to ``--share`` of a core (``hosts/cpu_quota.py``;
``--share 1``: equal hosts).
Each split is a ``vllm serve`` of its own: ``even``, ``weights`` and
``measured`` are the rules of ``VLLM_PPSPEC_LAYER_SPLIT``; a number N is
``VLLM_PP_LAYER_PARTITION=N,30-N``, set by hand. For each, the bench sends
the code prompts (``fixtures/code_prompts.py``, ``ignore_eos``, ``--tokens``
each) at each load (requests in flight: 2 x load requests, at most load at
once) and records output tok/s, and the start-up (seconds to ready; the
measured rule's own seconds from its log line). The splits run ``--repeats``
times, the rounds interleaved (every split once, then again); min and median
are reported, and each split's ratio to vLLM's even split from the medians.
Needs root.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from vllm_ppspec_tools.fixtures import code_prompts, real_model
from vllm_ppspec_tools.fixtures.server import openai_client
from vllm_ppspec_tools.hosts import cpu_quota
from vllm_ppspec_tools.hosts.two_hosts import Pipeline, two_hosts

REPO = Path(__file__).resolve().parent.parent
LAYERS = 30
SPLIT_LINE = re.compile(r"vllm-ppspec: target layers split ([^\n]*)")
MEASURED_S = re.compile(r"measured in ([0-9.]+) s")


def tok_s(base: str, load: int, tokens: int) -> float:
    client = openai_client(base, timeout=900)
    prompts = code_prompts.PROMPTS

    def one(i: int) -> int:
        resp = client.completions.create(
            model="tiny",
            prompt=prompts[i % len(prompts)],
            max_tokens=tokens,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        return int(resp.usage.completion_tokens)

    start = time.monotonic()
    with ThreadPoolExecutor(load) as pool:
        done = sum(pool.map(one, range(2 * load)))
    return done / (time.monotonic() - start)


def env_of(split: str) -> dict[str, str]:
    if split in ("even", "weights", "measured"):
        return {"VLLM_PPSPEC_LAYER_SPLIT": split}
    first = int(split)
    return {"VLLM_PP_LAYER_PARTITION": f"{first},{LAYERS - first}"}


def run_one(hosts, model: str, split: str, loads: list[int], tokens: int) -> dict:
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    with tempfile.TemporaryDirectory() as logs:
        started = time.monotonic()
        pipe = Pipeline(
            hosts,
            {},
            (model, spec),
            Path(logs),
            "--max-num-seqs",
            "16",
            common=env_of(split),
        )
        try:
            pipe.wait_ready(timeout=600)
            ready_s = time.monotonic() - started
            text = pipe.logs[0].read_text()
            said = SPLIT_LINE.search(text)
            took = MEASURED_S.search(text)
            tok_s(pipe.base, 2, 16)  # warm-up
            runs = {n: tok_s(pipe.base, n, tokens) for n in loads}
        finally:
            pipe.stop()
    return {
        "split": split,
        "said": said.group(1) if said else "vLLM's even split",
        "ready_s": ready_s,
        "measured_s": float(took.group(1)) if took else None,
        "tok_s": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--slow", type=int, default=1)
    ap.add_argument("--splits", default="even,weights,measured,17,19,21,23,25")
    ap.add_argument("--loads", default="1,8,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "slow-host-smollm2.json")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    model = real_model.build(REPO / ".cache" / "models")
    splits = args.splits.split(",")
    loads = [int(n) for n in args.loads.split(",")]
    rows: list[dict] = []
    with ExitStack() as stack:
        hosts = stack.enter_context(two_hosts("slow"))
        if args.share < 1:  # else equal hosts
            group = stack.enter_context(cpu_quota.cpu_quota(args.share, "bench"))
            cpu_quota.join(group, hosts.nodes[args.slow].pids())
        for round_ in range(args.repeats):
            for split in splits:
                row = run_one(hosts, model, split, loads, args.tokens)
                row["round"] = round_
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = []
    for split in splits:
        mine = [r for r in rows if r["split"] == split]
        entry = {
            "split": split,
            "said": mine[-1]["said"],
            "ready_s_median": statistics.median(r["ready_s"] for r in mine),
            "measured_s": [r["measured_s"] for r in mine],
        }
        for n in loads:
            values = [r["tok_s"][n] for r in mine]
            entry[f"{n}_min"], entry[f"{n}_median"] = min(values), statistics.median(values)
        summary.append(entry)
    even = next((e for e in summary if e["split"] == "even"), None)
    for e in summary:
        ratios = ""
        if even:
            ratios = ", ".join(f"{n}: {e[f'{n}_median'] / even[f'{n}_median']:.2f}x" for n in loads)
        cells = ", ".join(f"{n}: {e[f'{n}_min']:.1f}/{e[f'{n}_median']:.1f}" for n in loads)
        print(
            f"{e['split']:>8}  tok/s min/median {cells}; vs even {ratios}; "
            f"ready {e['ready_s_median']:.0f} s; split {e['said'][:60]}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"share": args.share, "slow_host": args.slow, "runs": rows, "summary": summary},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
