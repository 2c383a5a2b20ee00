"""bench_serve's results: what it keeps of a ``vllm bench serve`` result, the
summary (min and median per configuration and load), the ratios, the output
check, the table, the JSON and the plot.

Pure functions of the data bench_serve collects (``runs``: configuration ->
load -> one record per repeat), so that they are tested on canned results.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any


def run_record(result: dict[str, Any]) -> dict[str, Any]:
    """What is kept of one ``vllm bench serve --save-result --save-detailed``
    result file; ``texts`` and ``errors`` (per request, in the dataset's
    order) are checked, then dropped from the JSON (:func:`finish`)."""
    return {
        "output_tok_s": round(float(result["output_throughput"]), 2),
        "completed": int(result["completed"]),
        "failed": int(result["failed"]),
        "duration_s": round(float(result["duration"]), 2),
        "output_tokens": int(result["total_output_tokens"]),
        "max_concurrency": result.get("max_concurrency"),
        **{
            key: round(float(result[key]), 1)
            for key in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "median_tpot_ms")
            if result.get(key) is not None
        },
        "texts": list(result.get("generated_texts") or []),
        "errors": list(result.get("errors") or []),
    }


def spec_counters(base: str) -> dict[str, Any]:
    """The server's speculative-decoding counters now: drafts, accepted, rounds,
    accepted per position."""
    from vllm_ppspec_tools.fixtures.server import accepted_per_position, metrics

    m = metrics(base)
    return {
        "drafts": m.get("vllm:spec_decode_num_draft_tokens_total", 0.0),
        "accepted": m.get("vllm:spec_decode_num_accepted_tokens_total", 0.0),
        "rounds": m.get("vllm:spec_decode_num_drafts_total", 0.0),
        "per_position": accepted_per_position(base),
    }


def spec_delta(before: dict[str, Any], base: str) -> dict[str, Any]:
    """The counters' growth since ``before`` (one load's run): drafts, accepted,
    rounds, the acceptance at each position (share of rounds) and mean tokens
    per round (accepted / rounds + 1)."""
    after = spec_counters(base)
    d = {key: after[key] - before[key] for key in ("drafts", "accepted", "rounds")}
    old = before["per_position"] + [0.0] * (
        len(after["per_position"]) - len(before["per_position"])
    )
    rounds = d["rounds"] or 1.0
    return {
        **{key: int(v) for key, v in d.items()},
        "acceptance_by_position": [
            round((a - b) / rounds, 3) for a, b in zip(after["per_position"], old, strict=True)
        ],
        "tokens_per_round": round(1 + d["accepted"] / rounds, 2),
    }


def stage_shares(
    before: list[dict[str, float]], after: list[dict[str, float]], wall_s: float
) -> list[dict[str, float]]:
    """Per PP rank, over one load's run of ``wall_s`` seconds: the share of the wall
    time in its steps (``busy``: execute_model + sample_tokens, less the wait for
    rounds), in the target's forward and in the drafter's passes, and its steps
    (from the runner clocks read before and after)."""
    out = []
    for b, a in zip(before, after, strict=True):
        out.append(
            {
                "busy": round((a["step_s"] - b["step_s"]) / wall_s, 3),
                "forward": round((a["forward_s"] - b["forward_s"]) / wall_s, 3),
                "draft": round((a.get("draft_s", 0.0) - b.get("draft_s", 0.0)) / wall_s, 3),
                "steps": int(a["steps"] - b["steps"]),
            }
        )
    return out


def peak_rss_mib(session_pid: int) -> dict[str, float]:
    """Peak resident memory (``VmHWM``, MiB) of each live process in the process group
    ``session_pid`` leads (a server's: API server, engine core, workers), by name and pid."""
    out: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != session_pid:
                continue
            name = (proc / "comm").read_text().strip()
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    out[f"{name}:{proc.name}"] = round(int(line.split()[1]) / 1024, 1)
        except (OSError, ValueError):
            continue
    return out


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per configuration and load: output tok/s of each repeat, min, median,
    requests completed and failed (summed over repeats), runs that errored."""
    table: dict[str, Any] = {}
    for name, loads in runs.items():
        for load, recs in loads.items():
            ok = [r for r in recs if "error" not in r]
            tps = [r["output_tok_s"] for r in ok]
            table.setdefault(name, {})[load] = {
                "output_tok_s": tps,
                "min": round(min(tps), 1) if tps else None,
                "median": round(statistics.median(tps), 1) if tps else None,
                "completed": sum(r["completed"] for r in ok),
                "failed": sum(r["failed"] for r in ok),
                "run_errors": [r["error"] for r in recs if "error" in r],
            }
    return table


def _best(
    summary: dict[str, Any], configs: dict[str, Any], load: str, **want: Any
) -> tuple[str, float] | None:
    """The configuration with the highest median at ``load`` among those whose
    description matches ``want`` (pp=2, spec=True, ...)."""
    cands = [
        (name, rows[load]["median"])
        for name, rows in summary.items()
        if all(configs[name][k] == v for k, v in want.items())
        and load in rows
        and rows[load]["median"] is not None
    ]
    return max(cands, key=lambda c: c[1]) if cands else None


def ratios(summary: dict[str, Any], configs: dict[str, Any], loads: list[int]) -> dict[str, Any]:
    """Per load: the best PP=2 + spec (median) over the best PP=1 (any of its
    configurations) and over the best PP=2 without spec; None where one is missing."""
    out: dict[str, Any] = {}
    for load in map(str, loads):
        spec = _best(summary, configs, load, pp=2, spec=True)
        pp1 = _best(summary, configs, load, pp=1)
        nospec = _best(summary, configs, load, pp=2, spec=False)

        def over(b: tuple[str, float] | None, s: tuple[str, float] | None = spec) -> float | None:
            return round(s[1] / b[1], 3) if s and b else None

        out[load] = {
            "best_pp2_spec": spec[0] if spec else None,
            "best_pp1": pp1[0] if pp1 else None,
            "best_pp2_no_spec": nospec[0] if nospec else None,
            "pp2_spec_over_best_pp1": over(pp1),
            "pp2_spec_over_best_pp2_no_spec": over(nospec),
        }
    return out


def reference_for(name: str, configs: dict[str, Any]) -> str | None:
    """The PP=1 no-spec configuration ``name``'s outputs are checked against:
    the one of the same mode (eager / compiled) if it ran, else the other."""
    refs = [n for n, c in configs.items() if c["pp"] == 1 and not c["spec"]]
    same = [n for n in refs if configs[n]["eager"] == configs[name]["eager"]]
    return (same or refs)[0] if refs else None


def check_outputs(
    runs: dict[str, dict[str, list[dict[str, Any]]]], configs: dict[str, Any]
) -> dict[str, Any]:
    """Every generated text against the reference's (first repeat) for the
    same request (the same prompt: the datasets are written in order) at the
    same load. Failed requests are not compared (the summary counts them)."""
    mismatches: list[str] = []
    compared = 0
    for name, loads in runs.items():
        ref_name = reference_for(name, configs)
        if ref_name is None:
            return {"checked": False, "why": "no PP=1 no-spec configuration ran"}
        for load, recs in loads.items():
            ref = next((r for r in runs[ref_name].get(load, []) if "error" not in r), None)
            if ref is None:
                mismatches.append(f"{name} @{load}: no reference ({ref_name} did not run)")
                continue
            for rep, rec in enumerate(recs):
                if "error" in rec or rec is ref:
                    continue
                if len(rec["texts"]) != len(ref["texts"]):
                    mismatches.append(f"{name} @{load} repeat {rep + 1}: request count differs")
                    continue
                for i, (got, want) in enumerate(zip(rec["texts"], ref["texts"], strict=True)):
                    if rec["errors"][i] or ref["errors"][i]:
                        continue
                    compared += 1
                    if got != want:
                        mismatches.append(f"{name} @{load} repeat {rep + 1} request {i}")
    return {
        "checked": True,
        "how": "vllm bench serve --save-detailed generated_texts, text equality",
        "compared": compared,
        "identical": not mismatches,
        "mismatches": mismatches,
    }


def table_lines(data: dict[str, Any]) -> list[str]:
    """The printed table: output tok/s min / median per configuration and
    load, then the ratios of the best PP=2 + spec."""
    loads = [str(x) for x in data["loads"]]
    summary, rat = data["summary"], data["ratios"]
    width = max([len(n) for n in summary] + [len("PP=2+spec / best PP=2 no spec")]) + 2
    lines = [
        f"output tok/s, min / median of {data['repeats']} interleaved repeat(s); "
        f"{'' if data.get('ignore_eos') else 'up to '}{data['output_len']} tokens per request "
        "(vllm bench serve), greedy",
        f"{'requests in flight':<{width}}" + "".join(f"{x:>16}" for x in loads),
    ]
    for name, rows in summary.items():
        cells = [
            f"{rows[x]['min']:.1f} / {rows[x]['median']:.1f}"
            if x in rows and rows[x]["median"] is not None
            else "n/a"
            for x in loads
        ]
        lines.append(f"{name:<{width}}" + "".join(f"{c:>16}" for c in cells))
    for key, label in (
        ("pp2_spec_over_best_pp1", "PP=2+spec / best PP=1"),
        ("pp2_spec_over_best_pp2_no_spec", "PP=2+spec / best PP=2 no spec"),
    ):
        cells = [f"{rat[x][key]:.2f}x" if rat[x][key] is not None else "n/a" for x in loads]
        lines.append(f"{label:<{width}}" + "".join(f"{c:>16}" for c in cells))
    return lines


def detail_lines(data: dict[str, Any]) -> list[str]:
    """Per configuration and load, medians over the repeats: TTFT and ITL (ms),
    tokens per round and acceptance at each draft position, each PP stage's
    share of the wall time in its steps (busy) and in the drafter; then each
    configuration's peak resident memory per process (the largest over repeats)."""
    lines = [
        "per load (medians over repeats): TTFT ms, ITL ms; tokens/round, accepted by "
        "position; per stage busy (drafter) share of the wall time"
    ]

    def med(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    for name, loads in data["runs"].items():
        for load, recs in loads.items():
            ok = [r for r in recs if "error" not in r]
            if not ok:
                continue
            cells = [
                f"TTFT {med([r.get('median_ttft_ms', float('nan')) for r in ok]):.0f}",
                f"ITL {med([r.get('median_itl_ms', float('nan')) for r in ok]):.0f}",
            ]
            specs = [r["spec"] for r in ok if r.get("spec")]
            if specs:
                by_pos = [
                    med([s["acceptance_by_position"][i] for s in specs])
                    for i in range(len(specs[0]["acceptance_by_position"]))
                ]
                cells.append(
                    f"{med([s['tokens_per_round'] for s in specs]):.2f} tok/round "
                    + "["
                    + " ".join(f"{a:.2f}" for a in by_pos)
                    + "]"
                )
            stages = [r["stages"] for r in ok if r.get("stages")]
            if stages:
                cells.append(
                    "stages "
                    + " | ".join(
                        f"{med([st[i]['busy'] for st in stages]):.2f}"
                        f" ({med([st[i]['draft'] for st in stages]):.2f})"
                        for i in range(len(stages[0]))
                    )
                )
            lines.append(f"  {name} @{load}: " + "; ".join(cells))
    for name, per_repeat in (data.get("peak_rss_mib") or {}).items():
        peaks: dict[str, float] = {}
        for rss in per_repeat:
            seen: dict[str, int] = {}
            # Processes of one name (the workers) in pid order: name, name#2, ...
            for proc, mib in sorted(
                (rss or {}).items(), key=lambda kv: int(kv[0].rsplit(":", 1)[1])
            ):
                base = proc.rsplit(":", 1)[0]
                seen[base] = seen.get(base, 0) + 1
                key = base if seen[base] == 1 else f"{base}#{seen[base]}"
                peaks[key] = max(peaks.get(key, 0.0), mib)
        if peaks:
            lines.append(
                f"  {name} peak RSS MiB: "
                + ", ".join(f"{proc} {mib:.0f}" for proc, mib in sorted(peaks.items()))
            )
    return lines


def plot(data: dict[str, Any], path: Path) -> list[str] | None:
    """Output tok/s against requests in flight, one line per configuration:
    the median, an error bar down to the min. The lines' labels; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rows in data["summary"].items():
        xs = [x for x in data["loads"] if rows.get(str(x), {}).get("median") is not None]
        med = [rows[str(x)]["median"] for x in xs]
        low = [rows[str(x)]["median"] - rows[str(x)]["min"] for x in xs]
        style = "-" if data["configs"][name]["spec"] else "--"
        ax.errorbar(xs, med, yerr=[low, [0] * len(xs)], fmt=f"o{style}", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(data["loads"], [str(x) for x in data["loads"]])
    ax.set_xlabel("requests in flight (vllm bench serve --max-concurrency)")
    ax.set_ylabel("output tok/s (median; bar: min)")
    k = data["spec"]["num_speculative_tokens"]
    model = str(data.get("model", "SmolLM2-135M")).split(" (")[0].split(",")[0]
    method = data["spec"].get("method", "ngram")
    title = f"{model}, vllm serve on CPU ({data.get('cpus')} cores), {method} k={k}"
    if data.get("label") == "smoke":
        title += " [SMOKE RUN]"
    elif data.get("label") == "partial":
        title += f" [{len(data['configs'])} configurations, {data['repeats']} repeats]"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return list(ax.get_legend_handles_labels()[1])


def finish(data: dict[str, Any], out: Path, name: str) -> int:
    """Summarize, check, print, write ``bench-serve-<name>.json`` (without the
    texts) and the plot; the exit status: 1 on any output difference, failed
    request or run error."""
    data["summary"] = summarize(data["runs"])
    data["ratios"] = ratios(data["summary"], data["configs"], data["loads"])
    data["outputs"] = check_outputs(data["runs"], data["configs"])
    for loads in data["runs"].values():
        for recs in loads.values():
            for rec in recs:
                rec.pop("texts", None)
                rec.pop("errors", None)
    print("\n".join(table_lines(data)))
    print("\n".join(detail_lines(data)))
    check = data["outputs"]
    print(
        f"outputs identical to PP=1 without spec: {check.get('identical')} "
        f"({check.get('compared', 0)} requests compared)"
        + (f"; differ: {check['mismatches'][:20]}" if check.get("mismatches") else "")
    )
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"bench-serve-{name}"
    Path(f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    if plot(data, Path(f"{stem}.png")) is not None:
        print(f"wrote {stem}.json and {stem}.png")
    else:
        print(f"wrote {stem}.json (no plot: matplotlib is not installed)")
    failed = any(
        row["failed"] or row["run_errors"]
        for rows in data["summary"].values()
        for row in rows.values()
    )
    return 0 if check.get("identical") and not failed else 1
