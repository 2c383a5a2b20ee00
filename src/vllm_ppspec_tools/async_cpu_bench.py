"""Async vs sync scheduling with speculative decoding on CPU, before and after the eager correction.

    vllm-ppspec-async-cpu-bench [--pps 1,2] [--repeats 2] [--max-tokens 64]

(``python -m vllm_ppspec_tools.async_cpu_bench`` runs the same.)

Each configuration runs in a fresh offline engine (the plugin's worker, tiny
target, ``draft_model`` = a copy of the target, k=3, so every draft is accepted
and sync and async run the same rounds), interleaved ``--repeats`` times, and
times the first ``generate`` after start-up: 4 greedy requests of different
lengths, so the batch shrinks from 4 rows to 1 as they finish. Configurations
per PP size:

* ``sync``;
* ``async, compiled``: vLLM's ``update_num_computed_tokens_for_batch_change``
  as vLLM ships it, compiled by inductor on first use
  (``VLLM_PPSPEC_CPU_COMPILED_CORRECTION=1``);
* ``async, eager``: the plugin's default on CPU (patches/worker/cpu_eager.py).

Prints the generate time (min / median), the ratio of each async run to sync,
and checks that all outputs are identical. Writes ``async-cpu.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from vllm_ppspec.patches.worker.cpu_eager import KEEP_COMPILED_ENV
from vllm_ppspec_tools import paths
from vllm_ppspec_tools.fixtures.jobs import run_job

CONFIGS: dict[str, dict[str, Any]] = {
    "sync": {"async_scheduling": False},
    "async, compiled": {"async_scheduling": True, "env": {KEEP_COMPILED_ENV: "1"}},
    "async, eager": {"async_scheduling": True},
}


def _requests(max_tokens: int) -> list[dict[str, Any]]:
    return [
        {"prompt_token_ids": [5 + 13 * i + j for j in range(3 + 5 * i)], "max_tokens": n}
        for i, n in enumerate((max_tokens, max_tokens // 2, max_tokens // 3, max_tokens // 4))
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vllm_ppspec_tools.fixtures.tiny_models import build_all

    models = build_all(Path(args.models_dir))
    spec = {"method": "draft_model", "model": models["draft_copy"], "num_speculative_tokens": 3}
    results: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.repeats):
        for pp in (int(p) for p in args.pps.split(",")):
            for name, cfg in CONFIGS.items():
                job = {
                    "model": models["target"],
                    "pp": pp,
                    "spec": spec,
                    "requests": _requests(args.max_tokens),
                    **cfg,
                }
                res = run_job(job, timeout=900)
                if res.returncode != 0 or res.result is None:
                    raise SystemExit(f"PP={pp} {name} failed:\n{res.log[-4000:]}")
                results.setdefault(f"PP={pp} {name}", []).append(res.result)
                print(f"  repeat {rep + 1}: PP={pp} {name} done", file=sys.stderr)
    return results


def report(results: dict[str, list[dict[str, Any]]]) -> bool:
    outputs = {json.dumps(r["outputs"]) for runs in results.values() for r in runs}
    print("first generate after start-up (4 requests, draft_model k=3), seconds min / median:")
    for name, runs in results.items():
        times = [r["generate_s"] for r in runs]
        sync = statistics.median(r["generate_s"] for r in results[name.split(" ")[0] + " sync"])
        print(
            f"  {name:>22}: {min(times):7.3f} / {statistics.median(times):7.3f} s"
            f"   {statistics.median(times) / sync:5.2f}x sync"
        )
    print(f"  outputs identical across all runs: {len(outputs) == 1}")
    return len(outputs) == 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pps", default="1,2")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default=str(paths.results_dir()))
    parser.add_argument("--models-dir", default=str(paths.cache_dir("models")))
    args = parser.parse_args(argv)
    results = run(args)
    same = report(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        name: {"generate_s": [r["generate_s"] for r in runs], "spec": runs[0]["spec"]}
        for name, runs in results.items()
    }
    (out / "async-cpu.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
