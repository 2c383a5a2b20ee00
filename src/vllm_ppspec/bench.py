"""Benchmark: PP=2 with vs without speculative decoding, measured in one run.

    python -m vllm_ppspec.bench [--method eagle3|draft_model|mtp] [--async-scheduling]

Runs the same greedy requests through two fresh offline engines on the tiny
local models (PP=2 without speculation, then PP=2 + the chosen method with the
plugin worker) and prints generation time, tokens/s, the speed ratio, acceptance,
the worker processes' resident memory and its ratio, and whether the tokens match.
On the CPU backend with random-weight models this measures the plugin's
overhead and the effect of acceptance, not what a GPU deployment will see.
"""

from __future__ import annotations

import sys
from typing import Any

from vllm_ppspec.demo import method_cli
from vllm_ppspec.testing.jobs import run_job

MAX_TOKENS = 96
REQUESTS: list[dict[str, Any]] = [
    {"prompt_token_ids": [5 + i, 6 + i, 7 + i, 8 + i], "max_tokens": MAX_TOKENS} for i in range(4)
]


def run_engine(job: dict[str, Any]) -> dict[str, Any]:
    res = run_job(job, timeout=900)
    if res.returncode != 0 or res.result is None:
        raise SystemExit(f"engine failed:\n{res.log[-4000:]}")
    return res.result


def main(argv: list[str] | None = None) -> int:
    args, model, spec = method_cli(__doc__, ["eagle3", "draft_model", "mtp"], argv)
    base = {
        "model": model,
        "pp": 2,
        "requests": REQUESTS,
        "async_scheduling": bool(args.async_scheduling),
    }
    plain = run_engine({**base, "spec": None, "worker": "ppspec"})
    specd = run_engine({**base, "spec": spec, "worker": "ppspec"})

    tokens = MAX_TOKENS * len(REQUESTS)
    mode = "async" if args.async_scheduling else "sync"
    print(
        f"PP=2, {mode} scheduling, {len(REQUESTS)} requests x {MAX_TOKENS} "
        "tokens, CPU backend, tiny models"
    )
    for name, r in (("no spec", plain), (f"{args.method} k={args.num_speculative_tokens}", specd)):
        rss = max(r["worker_rss_mb"].values()) if r["worker_rss_mb"] else float("nan")
        print(
            f"  {name:>16}: {r['generate_s']:7.3f} s  {tokens / r['generate_s']:8.1f} tok/s"
            f"  max worker RSS {rss:8.1f} MiB"
        )
    ratio = plain["generate_s"] / specd["generate_s"]
    print(f"  speed ratio (spec / no spec, tokens per second): {ratio:.2f}x")
    s = specd["spec"] or {}
    if s.get("drafts"):
        print(
            f"  acceptance: {s['accepted']}/{s['drafts']} draft tokens "
            f"({s['accepted'] / s['drafts']:.0%}), "
            f"{1 + s['accepted'] / max(s['steps'], 1):.2f} tokens per verification step"
        )
    if plain["worker_rss_mb"] and specd["worker_rss_mb"]:
        mem = max(specd["worker_rss_mb"].values()) / max(plain["worker_rss_mb"].values())
        print(f"  memory ratio (max worker RSS, spec / no spec): {mem:.2f}x")
    same = plain["outputs"] == specd["outputs"]
    print(f"  tokens identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
