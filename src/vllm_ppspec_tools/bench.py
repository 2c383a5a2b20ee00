"""Benchmark: PP + speculative decoding, pipeline filled vs one batch vs no spec.

    vllm-ppspec-bench [--target planted|smollm2|tiny] [--pp 2] [--loads 1,4,16,32]
                      [--repeats 2] [--max-tokens 64] [--out results]

(``python -m vllm_ppspec_tools.bench`` runs the same.)

Each engine configuration runs in its own fresh offline engine, interleaved
``--repeats`` times (A B C D A B C D ...), and generates one phase per load
(that many greedy requests submitted at once):

* ``pp1 no spec`` / ``pp1 spec``: PP=1, vLLM's own worker (the speed-up spec
  gives without PP);
* ``no spec``: PP=N, no speculative decoding (vLLM's PP path; the plugin
  worker passes through and only adds the forward clock);
* ``one batch``: PP=N + ngram k=3 with one batch in flight
  (``VLLM_PPSPEC_ONE_BATCH=1``, the plugin's behaviour before the pipeline
  was filled);
* ``filled``: PP=N + ngram k=3, PP batches in flight (the default);
* ``async`` (``--method draft_model`` only: vLLM 0.32 refuses ngram under
  async scheduling): PP=N + the drafter under async scheduling;
* ``even split`` (``--method draft_model`` only): ``filled`` with vLLM's even
  layer split (``VLLM_PP_LAYER_PARTITION`` set to it) instead of the one the
  plugin chooses for the drafter (vllm_ppspec/choice/layer_split.py).

``--configs`` runs some of them only (names separated by commas).

``--method draft_model`` drafts with the target's first layer
(``bench_model.build_drafter``; the tiny target's ``draft_copy``) instead of
ngram.

It prints tokens/s (min and median over repeats), the ratios, acceptance, and
each stage's busy fraction: seconds in the target's forward on that rank over
the phase's wall time, measured inside the runner (vLLM's workers spin while
they wait, so CPU time says nothing), and its working fraction: seconds inside
``execute_model`` and ``sample_tokens`` (the forward, input preparation,
sampling, drafting; not waiting for the async round) over the wall time; the
rest the stage waited for work. The same split per step, in milliseconds
(forward + other work + waiting, each stage's average step), shows what a step
costs and how long a stage waits between steps.
Requests generate 256 tokens by default, so that filling and draining the
pipeline are a small part of each phase. All greedy outputs must match PP=1
without spec. Then it times the async round (transport_bench: the one-way
message against the all-reduce it replaced, µs at 16 and 256 requests, k=3
and 7). Writes
``bench-<target>-pp<N>.json`` and, with matplotlib, ``.png`` to ``--out``.

``--target planted``: Llama hidden 1024 x 8 layers fp32 whose greedy output
ngram predicts (testing.bench_model); ``smollm2``: the real SmolLM2-135M-Instruct
(testing.real_model) on the demo's copy-heavy chat prompts, cycled to fill each
load (ngram lookup 2-5 tokens); ``tiny``: the 4-layer test target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_ppspec_tools import paths
from vllm_ppspec_tools.fixtures.jobs import run_job

K = 3
PROMPT_LEN = 24


def _workload(
    name: str, models_dir: Path
) -> tuple[str, Callable[[int, int], list[dict[str, Any]]]]:
    """(model path, requests(n, max_tokens)) for ``--target``."""
    if name == "smollm2":
        from vllm_ppspec_tools.fixtures import copy_prompts, real_model

        model = real_model.build(models_dir)
        return model, lambda n, max_tokens: copy_prompts.requests(model, n, max_tokens)
    if name == "planted":
        from vllm_ppspec_tools.fixtures import bench_model

        succ = bench_model.successor()
        return bench_model.build(models_dir), lambda n, m: _successor_walks(succ, n, m)
    from vllm_ppspec_tools.fixtures.tiny_models import build_all, successor_table

    succ = successor_table()
    return build_all(models_dir)["target"], lambda n, m: _successor_walks(succ, n, m)


def _successor_walks(succ: list[int], n: int, max_tokens: int) -> list[dict[str, Any]]:
    """``n`` prompts, each a walk along the successor map (copy-friendly context)."""
    reqs = []
    for i in range(n):
        t, prompt = 3 + (i * 97) % 500, []
        for _ in range(PROMPT_LEN):
            prompt.append(t)
            t = succ[t]
        reqs.append({"prompt_token_ids": prompt, "max_tokens": max_tokens})
    return reqs


def _spec(target: str, method: str, models_dir: Path) -> dict[str, Any]:
    """The speculative config of ``method`` on the benchmark's ``target``
    (fixtures.spec_configs, but for the planted bench target's own drafter)."""
    from vllm_ppspec_tools.fixtures import spec_configs

    if target == "smollm2":
        if method == "draft_model":
            raise SystemExit("--method draft_model: use --target planted or tiny")
        return spec_configs.real("ngram", K, target="", self_drafter="")
    if target == "tiny":
        from vllm_ppspec_tools.fixtures.tiny_models import build_all

        return spec_configs.tiny_spec(build_all(models_dir), method, K)[1]
    if method == "draft_model":
        from vllm_ppspec_tools.fixtures import bench_model

        drafter = bench_model.build_drafter(models_dir)
        return {"method": "draft_model", "model": drafter, "num_speculative_tokens": K}
    # The planted target repeats short n-grams as the tiny models do.
    return {"method": "ngram", "num_speculative_tokens": K, **spec_configs.TINY_NGRAM}


def _even_split(model: str, pp: int) -> str:
    """vLLM's layer split of ``model`` over ``pp`` stages, as VLLM_PP_LAYER_PARTITION."""
    from vllm_ppspec.choice.layer_split import even_split

    layers = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
    return ",".join(str(n) for n in even_split(int(layers), pp))


def _configs(pp: int, spec: dict[str, Any], even: str) -> dict[str, dict[str, Any]]:
    configs: dict[str, dict[str, Any]] = {
        "pp1 no spec": {"pp": 1, "spec": None, "worker": "stock"},
        "pp1 spec": {"pp": 1, "spec": spec, "worker": "stock"},
        "no spec": {"pp": pp, "spec": None},
        "one batch": {"pp": pp, "spec": spec, "env": {"VLLM_PPSPEC_ONE_BATCH": "1"}},
        "filled": {"pp": pp, "spec": spec},
    }
    if spec["method"] != "ngram":  # vLLM 0.32 refuses ngram under async scheduling
        configs["async"] = {"pp": pp, "spec": spec, "async_scheduling": True}
        configs["even split"] = {"pp": pp, "spec": spec, "env": {"VLLM_PP_LAYER_PARTITION": even}}
    return configs


def run(args: argparse.Namespace) -> dict[str, Any]:
    model, make_requests = _workload(args.target, Path(args.models_dir))
    loads = [int(x) for x in args.loads.split(",")]
    phases = [{"name": str(n), "requests": make_requests(n, args.max_tokens)} for n in loads]
    configs = _configs(
        args.pp, _spec(args.target, args.method, Path(args.models_dir)), _even_split(model, args.pp)
    )
    if args.configs:
        wanted = [c.strip() for c in args.configs.split(",")]
        unknown = sorted(set(wanted) - set(configs))
        if unknown:
            raise SystemExit(f"--configs: unknown {unknown}; choose from {sorted(configs)}")
        configs = {name: cfg for name, cfg in configs.items() if name in wanted}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for rep in range(args.repeats):
        for name, cfg in configs.items():
            if cfg["pp"] == 1 and max(loads) > 1 and name.startswith("pp1"):
                cfg = {**cfg, "phases": phases[:1]}  # the low-load reference only
            job = {
                "model": model,
                "phases": phases,
                "max_num_seqs": max(loads),
                "max_model_len": 1024,
                "async_scheduling": False,
                **cfg,
            }
            res = run_job(job, timeout=1800)
            if res.returncode != 0 or res.result is None:
                raise SystemExit(f"{name} (repeat {rep}) failed:\n{res.log[-4000:]}")
            runs[name].append(res.result)
            print(f"  repeat {rep + 1}/{args.repeats}: {name} done", file=sys.stderr)
    return {
        "target": args.target,
        "method": args.method,
        "pp": args.pp,
        "k": K,
        "loads": loads,
        "runs": runs,
    }


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """tokens/s min/median, busy fractions, acceptance per (config, load)."""
    table: dict[str, dict[str, Any]] = {}
    for name, results in data["runs"].items():
        for phase_idx, load in enumerate(data["loads"]):
            per = [r["phases"][phase_idx] for r in results if phase_idx < len(r["phases"])]
            if not per:
                continue
            tps = [p["tokens"] / p["generate_s"] for p in per]
            busy = [statistics.median(b) for b in zip(*(p["busy"] for p in per), strict=True)]
            working = [statistics.median(w) for w in zip(*(p["working"] for p in per), strict=True)]
            spec = [p["spec"] for p in per if p["spec"]]
            per_step = [_per_step_ms(p) for p in per]
            table.setdefault(name, {})[str(load)] = {
                "tok_s_min": round(min(tps), 1),
                "tok_s_median": round(statistics.median(tps), 1),
                "busy_median": [round(b, 3) for b in busy],
                "working_median": [round(w, 3) for w in working],
                "acceptance": _acceptance(spec),
                # Per stage, ms per step: [forward, other work, waiting].
                "step_ms_median": (
                    None
                    if None in per_step
                    else [
                        [round(statistics.median(c), 2) for c in zip(*parts, strict=True)]
                        for parts in zip(*per_step, strict=True)
                    ]
                ),
                "outputs": per[0]["outputs"],
            }
    return table


def _per_step_ms(phase: dict[str, Any]) -> list[list[float]] | None:
    """Each stage's average step split into forward, other work, and waiting, in ms.

    From the runner's clocks: seconds in the forward, seconds working, steps;
    waiting is the rest of the time between the clock reads. None without the
    plugin's runner (vLLM's own worker has no clocks).
    """
    wall = phase.get("clocks_s", phase["generate_s"])
    parts = []
    for busy, working, steps in zip(
        phase["busy"], phase["working"], phase.get("steps") or [], strict=False
    ):
        if not steps or steps != steps:  # no clocks (NaN) or no step ran
            return None
        ms = 1000 * wall / steps
        parts.append([busy * ms, (working - busy) * ms, (1 - working) * ms])
    return parts or None


def _acceptance(spec: list[dict[str, int]]) -> float | None:
    if not spec:
        return None
    drafts = sum(s["drafts"] for s in spec)
    return round(sum(s["accepted"] for s in spec) / max(drafts, 1), 3)


def check_tokens(table: dict[str, Any]) -> list[str]:
    """Configs/loads whose outputs differ from PP=1 without spec (or from PP=N no spec;
    with neither in ``--configs``, from the first configuration run at that load)."""
    bad = []
    for name, loads in table.items():
        for load, row in loads.items():
            ref = (
                table.get("pp1 no spec", {}).get(load)
                or table.get("no spec", {}).get(load)
                or next(rows[load] for rows in table.values() if load in rows)
            )
            if row["outputs"] != ref["outputs"]:
                bad.append(f"{name}@{load}")
    return bad


def report(data: dict[str, Any], table: dict[str, Any]) -> None:
    pp, loads = data["pp"], data["loads"]
    print(
        f"target {data['target']}, PP={pp}, {data.get('method', 'ngram')} k={data['k']}, "
        "sync scheduling unless named async, "
        f"{len(next(iter(data['runs'].values())))} interleaved repeats; tokens/s min / median"
    )
    for name, rows in table.items():
        for load, row in rows.items():
            busy = " ".join(f"{b:.0%}" for b in row["busy_median"])
            working = " ".join(f"{w:.0%}" for w in row["working_median"])
            acc = f"  acceptance {row['acceptance']:.0%}" if row["acceptance"] is not None else ""
            print(
                f"  {name:>12} @{load:>3} in flight: {row['tok_s_min']:8.1f} / "
                f"{row['tok_s_median']:8.1f} tok/s  busy per stage [{busy}]"
                f" (working [{working}]){acc}"
            )
            if row.get("step_ms_median"):
                stages = "  ".join(
                    f"{f:.1f} + {o:.1f} + {w:.1f}" for f, o, w in row["step_ms_median"]
                )
                print(f"{'':>29}ms per step, forward + other work + waiting: {stages}")

    def ratio(a: str, b: str, load: str) -> str:
        if load not in table.get(a, {}) or load not in table.get(b, {}):
            return "n/a"
        return f"{table[a][load]['tok_s_median'] / table[b][load]['tok_s_median']:.2f}x"

    for load in map(str, loads):
        print(
            f"  ratios @{load:>3}: filled/one batch {ratio('filled', 'one batch', load)}, "
            f"filled/no spec {ratio('filled', 'no spec', load)}, "
            f"one batch/no spec {ratio('one batch', 'no spec', load)}"
            + (f", async/filled {ratio('async', 'filled', load)}" if "async" in table else "")
            + (
                f", filled/even split {ratio('filled', 'even split', load)}"
                if "even split" in table
                else ""
            )
        )
    low = str(loads[0])
    print(
        f"  low load ({low}): PP={pp} spec speed-up {ratio('filled', 'no spec', low)} vs "
        f"PP=1 spec speed-up {ratio('pp1 spec', 'pp1 no spec', low)}"
    )


def plot(data: dict[str, Any], table: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("no spec", "one batch", "filled", "async", "even split"):
        rows = table.get(name, {})
        xs = [int(x) for x in rows]
        ax.plot(xs, [rows[str(x)]["tok_s_median"] for x in xs], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("tokens/s (median)")
    method = data.get("method", "ngram")
    ax.set_title(f"PP={data['pp']} + {method} k={data['k']}, {data['target']} target, CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main(argv: list[str] | None = None) -> int:
    # vLLM spawns its processes, as for any user (the tests may ask for fork:
    # vllm_ppspec_tools.fixtures.forkserver)
    os.environ.setdefault("PPSPEC_VLLM_START", "spawn")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=["planted", "smollm2", "tiny"], default="planted")
    parser.add_argument("--method", choices=["ngram", "draft_model"], default="ngram")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--configs", default="", help="run these configurations only")
    parser.add_argument("--loads", default="1,4,16,32")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", default=str(paths.results_dir()))
    parser.add_argument("--models-dir", default=str(paths.cache_dir("models")))
    parser.add_argument(
        "--transport-rounds",
        type=int,
        default=200,
        help="rounds per case of the async round-exchange timing (0: skip it)",
    )
    args = parser.parse_args(argv)
    data = run(args)
    table = summarize(data)
    report(data, table)
    if args.transport_rounds:
        from vllm_ppspec_tools import transport_bench

        rounds = transport_bench.measure(args.transport_rounds)
        transport_bench.report(rounds, args.transport_rounds)
        data["transport_us"] = {f"{rows} requests, k={k}": r for (rows, k), r in rounds.items()}
    bad = check_tokens(table)
    print(
        f"  tokens identical to PP=1 without spec: {not bad}" + (f" (differ: {bad})" if bad else "")
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench-{args.target}-pp{args.pp}" + (
        "" if args.method == "ngram" else f"-{args.method}"
    )
    for rows in table.values():
        for row in rows.values():
            row.pop("outputs")
    for results in data["runs"].values():
        for r in results:
            for phase in r["phases"]:
                phase.pop("outputs")
    (out / f"{stem}.json").write_text(json.dumps({**data, "summary": table}, indent=1) + "\n")
    if plot(data, table, out / f"{stem}.png"):
        print(f"  wrote {out / stem}.json and .png")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
