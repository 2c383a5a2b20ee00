"""Soak: many requests through a real ``vllm serve`` with the plugin, bounded in time.

    vllm-ppspec-soak [--requests 300] [--in-flight 16] [--method draft_model]
                     [-k 3] [--modes sync,async] [--abort-fraction 0.1]
                     [--sampled-fraction 0.2] [--num-kv-blocks 6]
                     [--request-timeout 120] [--out results/soak.json]

(``python -m vllm_ppspec_tools.soak`` runs the same.)

On the tiny local models (testing.tiny_models), over 127.0.0.1 with the
``openai`` client:

1. A PP=1 server without speculative decoding (vLLM's own worker) answers the
   greedy requests once: the reference.
2. For each mode (sync, async scheduling): a PP=2 server with the plugin and
   speculative decoding, a small KV cache (preemption), prefix caching and
   chunked prefill on. ``--requests`` requests, ``--in-flight`` at a time:
   prompts of 1-200 tokens, half of them sharing a prefix; ``--sampled-fraction``
   at temperature 1.0 / top-p 0.9; ``--abort-fraction`` streamed and dropped
   by the client after a few tokens.

Per mode it reports greedy outputs identical to the reference, errors, hangs
(no answer within ``--request-timeout``), p50/p99 latency, and preemptions,
acceptance and the requests the server aborted read from ``/metrics``;
writes all of it as JSON to ``--out``. Exits non-zero on any mismatch, error
or hang.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vllm_ppspec_tools import paths
from vllm_ppspec_tools.fixtures import spec_configs
from vllm_ppspec_tools.fixtures.run_offline import cpu_env
from vllm_ppspec_tools.fixtures.server import Server, openai_client, pp_spec_args, serve_args

SHARED_PREFIX = [3 + (13 * i) % 500 for i in range(40)]


ABORT_MAX_TOKENS = 256  # with a prompt of at most 200 tokens: within max_model_len 512


def make_requests(n: int, abort: float, sampled: float, seed: int = 0) -> list[dict[str, Any]]:
    """Deterministic request mix; ``kind`` is greedy, sampled or abort."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.choice([1, 2, 5, 17, 40, 90, 127, 129, 200])
        body = [rng.randrange(3, 500) for _ in range(length)]
        prompt = (SHARED_PREFIX + body)[:200] if i % 2 else body
        r = rng.random()
        kind = "abort" if r < abort else "sampled" if r < abort + sampled else "greedy"
        max_tokens = rng.randint(8, 64)
        if kind == "abort":
            # Long enough that the server cannot finish it before its client
            # walks away after three chunks, however fast the server runs.
            max_tokens = ABORT_MAX_TOKENS
        out.append({"prompt": prompt, "max_tokens": max_tokens, "kind": kind})
    return out


def _one(client: Any, req: dict[str, Any], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        if req["kind"] == "abort":
            stream = client.completions.create(
                model="tiny",
                prompt=req["prompt"],
                max_tokens=req["max_tokens"],
                temperature=0.0,
                stream=True,
                timeout=timeout,
                extra_body={"ignore_eos": True},
            )
            for i, _ in enumerate(stream):
                if i >= 2:
                    break
            stream.close()  # the client walks away mid-stream
            return {"ok": True, "latency": time.monotonic() - t0}
        sampled = req["kind"] == "sampled"
        resp = client.completions.create(
            model="tiny",
            prompt=req["prompt"],
            max_tokens=req["max_tokens"],
            temperature=1.0 if sampled else 0.0,
            top_p=0.9 if sampled else 1.0,
            timeout=timeout,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        extra = resp.choices[0].model_extra or {}
        return {"ok": True, "latency": time.monotonic() - t0, "token_ids": extra.get("token_ids")}
    except Exception as e:  # noqa: BLE001 - every failure is counted and reported
        hang = "timed out" in str(e).lower() or "Timeout" in type(e).__name__
        return {"ok": False, "hang": hang, "error": f"{type(e).__name__}: {e}"[:300]}


def drive(
    base: str, reqs: list[dict[str, Any]], in_flight: int, timeout: float
) -> list[dict[str, Any]]:
    # A new connection per request and no retries: every failure the server
    # causes is seen once, and no idle keep-alive connection is reused just as
    # the server closes it (seen here as client-side "Connection error"s that
    # never reached the server).
    client = openai_client(base, new_connection_per_request=True)
    with ThreadPoolExecutor(in_flight) as pool:
        return list(pool.map(lambda r: _one(client, r, timeout), reqs))


def summarize(
    reqs: list[dict[str, Any]], got: list[dict[str, Any]], ref: dict[int, Any], metrics: dict
) -> dict[str, Any]:
    greedy = [i for i, r in enumerate(reqs) if r["kind"] == "greedy"]
    identical = sum(1 for i in greedy if got[i].get("token_ids") == ref[i])
    lat = sorted(g["latency"] for g in got if g["ok"])
    drafts = metrics.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    return {
        "requests": len(reqs),
        "greedy": len(greedy),
        "greedy_identical": identical,
        "differing": [i for i in greedy if got[i].get("token_ids") != ref[i]][:20],
        "sampled_completed": sum(
            1 for i, r in enumerate(reqs) if r["kind"] == "sampled" and got[i]["ok"]
        ),
        "abort_planned": sum(1 for r in reqs if r["kind"] == "abort"),
        "aborted": server_aborts(metrics),
        "errors": sum(1 for g in got if not g["ok"] and not g.get("hang")),
        "hangs": sum(1 for g in got if g.get("hang")),
        "first_errors": [g["error"] for g in got if not g["ok"]][:5],
        "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
        "latency_p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3) if lat else None,
        "preemptions": metrics.get("vllm:num_preemptions_total", 0.0),
        "acceptance": round(accepted / drafts, 3) if drafts else None,
    }


def server_aborts(metrics: dict[str, float]) -> int:
    """Requests the server started answering (a first token) but never finished:
    the ones it aborted when their client went away, as its ``/metrics`` count
    them. A request the server ran to its end counts in ``request_success``."""
    started = metrics.get("vllm:time_to_first_token_seconds_count", 0.0)
    return int(started - metrics.get("vllm:request_success_total", 0.0))


def passed(s: dict[str, Any]) -> bool:
    return s["greedy_identical"] == s["greedy"] and s["errors"] == 0 and s["hangs"] == 0


def main(argv: list[str] | None = None) -> int:
    # vLLM spawns its processes, as for any user (the tests may ask for fork:
    # vllm_ppspec_tools.fixtures.forkserver)
    os.environ.setdefault("PPSPEC_VLLM_START", "spawn")
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--method", default="draft_model", choices=spec_configs.TINY_METHODS)
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    p.add_argument("--modes", default="sync,async")
    p.add_argument("--abort-fraction", type=float, default=0.1)
    p.add_argument("--sampled-fraction", type=float, default=0.2)
    p.add_argument("--num-kv-blocks", type=int, default=6, help="KV cache blocks (128 tokens)")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--models-dir", default=str(paths.cache_dir("models")))
    p.add_argument("--out", default=str(paths.results_dir("soak.json")))
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if args.method == "ngram" and "async" in modes:
        p.error("--method ngram: vLLM 0.32 refuses async scheduling with ngram; use --modes sync")

    from vllm_ppspec_tools.fixtures.tiny_models import build_all

    model, spec = spec_configs.tiny(
        args.method, args.num_speculative_tokens, build_all(args.models_dir)
    )
    reqs = make_requests(args.requests, args.abort_fraction, args.sampled_fraction)
    log_dir = paths.cache_dir("soak")
    log_dir.mkdir(parents=True, exist_ok=True)
    common = serve_args(
        model,
        "tiny",
        512,
        "--max-num-seqs",
        str(args.in_flight),
        "--max-num-batched-tokens",
        "128",
        "--enable-prefix-caching",
    )

    greedy = [i for i, r in enumerate(reqs) if r["kind"] == "greedy"]
    print(f"== reference: PP=1, no speculative decoding, {len(greedy)} greedy requests", flush=True)
    ref_srv = Server("soak-ref", common, cpu_env(1), log_dir)
    try:
        ref_srv.wait_ready()
        ref_out = drive(ref_srv.base, [reqs[i] for i in greedy], args.in_flight, 600)
    finally:
        ref_srv.stop()
    if not all(o["ok"] for o in ref_out):
        print(f"reference failed: {[o for o in ref_out if not o['ok']][:3]}")
        return 2
    ref = {i: o["token_ids"] for i, o in zip(greedy, ref_out, strict=True)}

    report: dict[str, Any] = {"config": vars(args), "modes": {}}
    ok = True
    for mode in modes:
        print(
            f"== PP=2 + {args.method} (k={args.num_speculative_tokens}), {mode} scheduling, "
            f"{args.requests} requests, {args.in_flight} in flight, "
            f"{args.num_kv_blocks} KV blocks",
            flush=True,
        )
        srv = Server(
            f"soak-{mode}",
            [
                *common,
                *pp_spec_args(2, spec, mode == "async"),
                "--num-gpu-blocks-override",
                str(args.num_kv_blocks),
            ],
            cpu_env(2),
            log_dir,
            fresh=True,  # the servers under test start as a user's shell starts them
        )
        try:
            srv.wait_ready()
            started_as = srv.started_as()
            t0 = time.monotonic()
            got = drive(srv.base, reqs, args.in_flight, args.request_timeout)
            wall = time.monotonic() - t0
            summary = summarize(reqs, got, ref, srv.metrics())
        finally:
            srv.stop()
        summary["wall_s"] = round(wall, 1)
        summary["started_as"] = started_as
        summary["passed"] = passed(summary)
        ok &= summary["passed"]
        report["modes"][mode] = summary
        print(json.dumps(summary, indent=1), flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"RESULT: {'PASS' if ok else 'FAIL'} (wrote {out})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
