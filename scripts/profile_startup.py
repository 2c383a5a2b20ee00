"""Profile one engine start-up of the tests, split into its parts.

    .venv/bin/python scripts/profile_startup.py [--repeats 3]

Runs the same job (tiny target, PP=2, draft_model k=3, sync, 6 greedy
requests) three ways, interleaved:

* ``fresh``: a new interpreter per job and vLLM's own engine-core process
  (what every test job did before the fork server);
* ``forked``: the job forked from the fork server (vLLM imported already),
  engine core still in its own process;
* ``forked+inproc``: forked, and the engine core in the job's process;
* ``+vLLM forks``: that, and vLLM forks its workers instead of spawning them
  (what the offline e2e tests run now; ``PPSPEC_VLLM_START=fork``).

Each part is read off the job's log (vLLM stamps its lines to the second, so
parts are +-1 s) and from the job's own clocks: the job process up to vLLM's
first line (interpreter and imports), to the engine core's first line (its
spawn and imports; 0 in-process), to the workers' first line (their spawn
and imports), KV cache + warm-up (vLLM's own "init engine" figure), generate,
and the rest (model load, first step, shutdown and exit). Prints min and
median per part.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

STAMP = re.compile(r"^\((\S+) pid=\d+\) \w+ \d\d-\d\d (\d\d:\d\d:\d\d)")


def parts(log: str, t_start: float, t_end: float, result: dict) -> dict[str, float]:
    day = datetime.now().date()
    first: dict[str, float] = {}
    init = re.search(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)", log)
    for line in log.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        who = m.group(1).split("_")[0]
        ts = datetime.combine(day, datetime.strptime(m.group(2), "%H:%M:%S").time()).timestamp()
        first.setdefault(who, ts)
        if "Initializing a V1 LLM engine" in line:
            first.setdefault("engine", ts)
    main = first["MainProcess"]
    engine = first.get("engine", main)
    workers = first.get("Worker", engine)
    load = float(init.group(1)) if init else float("nan")
    gen = float(result["generate_s"])
    total = t_end - t_start
    out = {
        "job process, imports": main - t_start,
        "config, engine core spawn + imports": engine - main,
        "workers spawn + imports": workers - engine,
        "KV cache + warm-up": load,
        "generate": gen,
    }
    out["other (model load, first step, shutdown)"] = total - sum(out.values())
    out["total"] = total
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from vllm_ppspec_tools.fixtures.jobs import job, run_job
    from vllm_ppspec_tools.fixtures.tiny_models import build_all

    models = build_all(REPO / ".cache" / "models")
    spec = {"method": "draft_model", "model": models["draft_copy"], "num_speculative_tokens": 3}
    ways = {  # fork server, engine core, how vLLM starts its processes
        "fresh": ("0", "process", "spawn"),
        "forked": ("1", "process", "spawn"),
        "forked+inproc": ("1", "inproc", "spawn"),
        "+vLLM forks": ("1", "inproc", "fork"),
    }
    figures: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
    run_job(job(models["target"], pp=1, worker="stock"))  # starts the fork server
    for _ in range(args.repeats):
        for way, (forkserver, core, start) in ways.items():
            os.environ["PPSPEC_FORKSERVER"] = forkserver
            os.environ["PPSPEC_VLLM_START"] = start
            t0 = time.time()
            res = run_job(job(models["target"], pp=2, spec=spec, engine_core=core))
            t1 = time.time()
            assert res.returncode == 0, res.log[-4000:]
            figures[way].append(parts(res.log, t0, t1, res.result))
    names = list(next(iter(figures.values()))[0])
    print(
        f"{'part (s), min / median of ' + str(args.repeats):40}" + "".join(f"{w:>18}" for w in ways)
    )
    for name in names:
        cells = []
        for way in ways:
            values = [f[name] for f in figures[way]]
            cells.append(f"{min(values):7.1f} / {statistics.median(values):5.1f}")
        print(f"{name:40}" + "".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
