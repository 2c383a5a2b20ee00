"""The main job: a real ``vllm serve`` with PP=2 + speculative decoding on tiny local models.

    python -m vllm_ppspec.demo [--method eagle3|draft_model|mtp|ngram] [--async-scheduling]

1. Builds the tiny random-weight models (cached under ``.cache/models``).
2. Starts ``vllm serve`` at PP=1 without speculative decoding (the reference),
   sends greedy completion requests with the ``openai`` client over 127.0.0.1,
   and stops it.
3. Starts ``vllm serve --pipeline-parallel-size 2 --speculative-config ...
   --worker-cls vllm_ppspec.worker.PPSpecWorker``, sends the same requests
   concurrently, reads the speculative-decoding counters from ``/metrics``.
4. Prints the completions, the acceptance figures, and whether every token id
   matches the reference. Exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vllm_ppspec import WORKER_QUALNAME

REPO = Path(__file__).resolve().parents[2]
# Token ids (the tiny models' vocabulary is "wN" = id N); sent as token-id prompts.
PROMPTS: list[list[int]] = [
    [5, 6, 7, 8, 9],
    [30, 31, 32],
    [17, 300, 42, 42, 17, 300],
    [3 + (11 * i) % 500 for i in range(60)],
]
MAX_TOKENS = [40, 23, 31, 17]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``vllm serve`` in its own session; killed with everything it spawned."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"serve-{name}.log"
        vllm_cli = Path(sys.executable).parent / "vllm"
        cmd = [str(vllm_cli), "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        print(f"$ {' '.join(cmd)}", flush=True)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 600) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vllm serve exited with {self.proc.returncode}; log: {self.log_path}\n"
                    + self.log_path.read_text()[-4000:]
                )
            try:
                with urllib.request.urlopen(self.base + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"vllm serve not ready after {timeout}s; log: {self.log_path}")

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("vllm:spec_decode_num_") and "_total" in line:
                name = line.split("{")[0].split(" ")[0]
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def complete_all(base_url: str, model: str) -> list[dict[str, Any]]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url + "/v1", api_key="unused")

    def one(i: int) -> dict[str, Any]:
        resp = client.completions.create(
            model=model,
            prompt=PROMPTS[i],
            max_tokens=MAX_TOKENS[i],
            temperature=0.0,
            extra_body={"return_token_ids": True, "ignore_eos": True},
        )
        choice = resp.choices[0]
        extra = choice.model_extra or {}
        return {"text": choice.text, "token_ids": extra.get("token_ids")}

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # several requests in flight
        return list(pool.map(one, range(len(PROMPTS))))


def spec_args(method: str, k: int, models: dict[str, str]) -> tuple[str, dict[str, Any]]:
    if method == "eagle3":
        return models["target"], {
            "method": "eagle3",
            "model": models["eagle3_succ"],
            "num_speculative_tokens": k,
        }
    if method == "draft_model":
        return models["target"], {
            "method": "draft_model",
            "model": models["draft_copy"],
            "num_speculative_tokens": k,
        }
    if method == "mtp":
        return models["mimo"], {"method": "mtp", "num_speculative_tokens": k}
    if method == "ngram":
        return models["target"], {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        }
    raise SystemExit(f"unknown method {method!r}")


def method_cli(
    doc: str | None, methods: list[str], argv: list[str] | None
) -> tuple[argparse.Namespace, str, dict[str, Any]]:
    """Parse --method/-k/--async-scheduling/--models-dir; build the tiny models.

    Returns the arguments, the target model path and the speculative config.
    """
    p = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    p.add_argument("--method", default="eagle3", choices=methods)
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    p.add_argument("--async-scheduling", action="store_true")
    p.add_argument("--models-dir", default=str(REPO / ".cache" / "models"))
    args = p.parse_args(argv)

    from vllm_ppspec.testing.tiny_models import build_all

    models = build_all(args.models_dir)
    model, spec = spec_args(args.method, args.num_speculative_tokens, models)
    return args, model, spec


def main(argv: list[str] | None = None) -> int:
    args, model, spec = method_cli(__doc__, ["eagle3", "draft_model", "mtp", "ngram"], argv)
    log_dir = REPO / ".cache" / "demo"
    log_dir.mkdir(parents=True, exist_ok=True)
    common = [
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--served-model-name",
        "tiny",
    ]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}

    print("== reference: vllm serve, PP=1, no speculative decoding", flush=True)
    ref = Server(
        "pp1-nospec", [model, *common], {**env, "VLLM_CPU_OMP_THREADS_BIND": "auto"}, log_dir
    )
    try:
        print(f"ready in {ref.wait_ready():.0f}s", flush=True)
        expected = complete_all(ref.base, "tiny")
    finally:
        ref.stop()

    mode = ["--async-scheduling"] if args.async_scheduling else []
    print(
        f"== vllm serve, PP=2 + {args.method} (k={args.num_speculative_tokens}), "
        f"{'async' if mode else 'sync'} scheduling, worker {WORKER_QUALNAME}",
        flush=True,
    )
    srv = Server(
        "pp2-spec",
        [
            model,
            *common,
            "--pipeline-parallel-size",
            "2",
            "--distributed-executor-backend",
            "mp",
            "--speculative-config",
            json.dumps(spec),
            "--worker-cls",
            WORKER_QUALNAME,
            *mode,
        ],
        {**env, "VLLM_CPU_OMP_THREADS_BIND": "0|1"},
        log_dir,
    )
    try:
        print(f"ready in {srv.wait_ready():.0f}s", flush=True)
        t0 = time.monotonic()
        got = complete_all(srv.base, "tiny")
        elapsed = time.monotonic() - t0
        metrics = srv.metrics()
    finally:
        srv.stop()

    ok = True
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        same = e["token_ids"] == g["token_ids"] and e["token_ids"] is not None
        ok &= same
        shown = " ".join(f"w{t}" for t in PROMPTS[i][:12])
        print(f"\n[{i}] prompt ids: {shown}{' ...' if len(PROMPTS[i]) > 12 else ''}")
        print(f"    PP=2+spec: {g['text'].strip()}")
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
    print(f"    {sum(len(g['token_ids'] or []) for g in got)} tokens in {elapsed:.2f}s")
    print(f"\nRESULT: {'all token ids match PP=1 without speculation' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
