"""Run one offline vLLM engine from a JSON job and write its outputs as JSON.

Used by the end-to-end tests and the benchmark: each job is a fresh process
(vLLM's engine spawns its own workers and must run under ``__main__``)::

    python -m vllm_ppspec.testing.run_offline JOB.json OUT.json

Job keys: ``model``, ``pp`` (default 1), ``spec`` (speculative config or null),
``worker`` (``"ppspec"`` = ``vllm_ppspec.worker.PPSpecWorker``, ``"stock"`` =
vLLM's default), ``async_scheduling`` (true/false/null), ``enforce_eager``,
``max_num_batched_tokens``, ``max_num_seqs``, ``dtype``, ``enable_prefix_caching``,
``num_kv_blocks`` (a small KV cache, to force preemption), ``block_size``,
``kv_transfer_config`` (vLLM's KVTransferConfig fields, for PD disaggregation),
``env`` (variables to set), ``engine_core`` (``"process"``, vLLM's default: the
engine core in a process of its own; ``"inproc"``: in the job's process, as
with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
``phases`` (benchmark mode, see :func:`run_phases`),
``probe_drafter_embedding`` (report each rank's drafter embedding digest),
``probe_drafter_layers`` (report each rank's drafter layer numbering),
``then``: more request lists, generated one after another on the same engine
after ``requests`` (cases that share an engine configuration share one
start-up; each list gets its own outputs and counter deltas in ``"then"``),
``requests``: a list of ``{"prompt_token_ids": [...], "max_tokens": n,
"temperature": t, "top_p": p, "top_k": k, "seed": s, "logprobs": n,
"structured": {"regex": ...} or {"json": schema}}`` (EOS is ignored except for
structured requests, whose grammar ends on it).

Output: ``{"outputs": [[token ids] per request], "top2_gaps": [per-position
top-1 minus top-2 log-probability, or null, per request], "spec": {"accepted",
"drafts", "steps"} or null, "preemptions", "external_prefix_cache_hits" (prompt
tokens a KV connector loaded), "probes", "startup_s", "generate_s", "worker_rss_mb",
"then": [{"outputs", "top2_gaps", "spec", "preemptions"} per extra list, the
counters counted over that list only]}``. The top-level counters count
``requests`` only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from vllm_ppspec import WORKER_QUALNAME


def cpu_env(pp: int, dp: int = 1) -> dict[str, str]:
    """Environment for the CPU backend on this small machine.

    One core list per worker: vLLM's CPU executor (OMPProcessManager) gives DP
    engine ``d`` the entries ``d * pp`` .. ``(d + 1) * pp - 1`` of
    ``VLLM_CPU_OMP_THREADS_BIND`` (order DP, PP, TP), so with more workers than
    cores, workers share cores round-robin.
    """
    cores = os.cpu_count() or 1
    workers = pp * dp
    binds = "|".join(str(i % cores) for i in range(workers))
    return {
        "VLLM_CPU_OMP_THREADS_BIND": binds if workers > 1 else "auto",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }


def spec_metrics(llm: Any) -> dict[str, Any] | None:
    """vLLM's spec-decode counters (the Prometheus ones), per position too."""
    values: dict[str, int] = {}
    per_position: list[int] = []
    for metric in llm.get_metrics():
        name = getattr(metric, "name", "")
        if name in (
            "vllm:spec_decode_num_accepted_tokens",
            "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_drafts",
        ):
            values[name.split("num_")[-1]] = int(getattr(metric, "value", 0))
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_position = [int(v) for v in getattr(metric, "values", [])]
    if not values:
        return None
    return {
        "accepted": values.get("accepted_tokens", 0),
        "drafts": values.get("draft_tokens", 0),
        "steps": values.get("drafts", 0),
        "per_position": per_position,
    }


def preemptions(llm: Any) -> int:
    """Requests preempted by the scheduler (vLLM's ``vllm:num_preemptions`` counter)."""
    return sum(
        int(getattr(m, "value", 0))
        for m in llm.get_metrics()
        if getattr(m, "name", "") == "vllm:num_preemptions"
    )


def external_prefix_cache_hits(llm: Any) -> int:
    """Prompt tokens whose KV a KV connector loaded (``vllm:external_prefix_cache_hits``)."""
    return sum(
        int(getattr(m, "value", 0))
        for m in llm.get_metrics()
        if getattr(m, "name", "") == "vllm:external_prefix_cache_hits"
    )


def top2_gaps(logprobs: Any) -> list[float] | None:
    """Per generated position, top-1 minus top-2 log-probability (needs logprobs >= 2)."""
    if not logprobs:
        return None
    gaps = []
    for position in logprobs:
        values = sorted((lp.logprob for lp in position.values()), reverse=True)
        gaps.append(values[0] - values[1] if len(values) > 1 else float("inf"))
    return gaps


def worker_rss_mb() -> dict[str, float]:
    """Resident memory of the vLLM worker processes (name -> MiB)."""
    import psutil

    out: dict[str, float] = {}
    for child in psutil.Process().children(recursive=True):
        try:
            name = child.name()
            if "Worker" in name or "VLLM" in name:
                out[f"{name}:{child.pid}"] = round(child.memory_info().rss / 2**20, 1)
        except psutil.Error:
            continue
    return out


def run(job: dict[str, Any]) -> dict[str, Any]:
    pp = int(job.get("pp", 1))
    for key, value in cpu_env(pp).items():
        os.environ.setdefault(key, value)
    os.environ.update(job.get("env") or {})
    if job.get("engine_core", "process") == "inproc":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if job.get("probe_drafter_embedding") or job.get("probe_drafter_layers") or job.get("phases"):
        # collective_rpc with a function (testing.probes) is pickled.
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM

    kwargs: dict[str, Any] = dict(
        model=job["model"],
        dtype=job.get("dtype", "float32"),
        max_model_len=job.get("max_model_len", 512),
        pipeline_parallel_size=pp,
        enforce_eager=job.get("enforce_eager", True),
        max_num_seqs=job.get("max_num_seqs", 8),
        seed=0,
        disable_log_stats=False,
    )
    if job.get("num_kv_blocks"):
        kwargs["num_gpu_blocks_override"] = job["num_kv_blocks"]  # force preemption
    if job.get("block_size"):
        kwargs["block_size"] = job["block_size"]
    if job.get("kv_transfer_config"):
        from vllm.config import KVTransferConfig

        kwargs["kv_transfer_config"] = KVTransferConfig(**job["kv_transfer_config"])
    if job.get("enable_prefix_caching") is not None:
        kwargs["enable_prefix_caching"] = job["enable_prefix_caching"]
    if job.get("max_num_batched_tokens"):
        kwargs["max_num_batched_tokens"] = job["max_num_batched_tokens"]
        kwargs["enable_chunked_prefill"] = True
    if job.get("spec"):
        kwargs["speculative_config"] = job["spec"]
    if job.get("worker", "ppspec") == "ppspec":
        kwargs["worker_cls"] = WORKER_QUALNAME
    if job.get("async_scheduling") is not None:
        kwargs["async_scheduling"] = job["async_scheduling"]
    if pp > 1:
        kwargs["distributed_executor_backend"] = "mp"

    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    if job.get("phases"):
        return run_phases(llm, job, startup_s=time.perf_counter() - t0)
    t1 = time.perf_counter()
    outs = llm.generate(*_params(job["requests"]), use_tqdm=False)
    t2 = time.perf_counter()
    probes: dict[str, Any] = {}
    if job.get("probe_drafter_embedding"):
        from vllm_ppspec.testing.probes import drafter_embedding_digest

        probes["drafter_embedding_digest"] = llm.collective_rpc(drafter_embedding_digest)
    if job.get("probe_drafter_layers"):
        from vllm_ppspec.testing.probes import drafter_layers

        probes["drafter_layers"] = llm.collective_rpc(drafter_layers)
    spec = spec_metrics(llm) if job.get("spec") else None
    preempted = preemptions(llm)
    then: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "probes": probes,
        "worker_rss_mb": worker_rss_mb(),
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "top2_gaps": [top2_gaps(o.outputs[0].logprobs) for o in outs],
        "spec": spec,
        "preemptions": preempted,
        "external_prefix_cache_hits": external_prefix_cache_hits(llm),
        "startup_s": round(t1 - t0, 2),
        "generate_s": round(t2 - t1, 3),
        "then": then,
    }
    for requests in job.get("then") or []:
        outs = llm.generate(*_params(requests), use_tqdm=False)
        spec_after = spec_metrics(llm) if job.get("spec") else None
        preempted_after = preemptions(llm)
        then.append(
            {
                "outputs": [list(o.outputs[0].token_ids) for o in outs],
                "top2_gaps": [top2_gaps(o.outputs[0].logprobs) for o in outs],
                "spec": _spec_delta(spec, spec_after),
                "preemptions": preempted_after - preempted,
            }
        )
        spec, preempted = spec_after, preempted_after
    llm.llm_engine.engine_core.shutdown()  # stop the engine core and its workers
    return result


def _params(requests: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """Prompts and sampling parameters of a job's requests (see the module docstring)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in requests]
    params = [
        SamplingParams(
            max_tokens=r["max_tokens"],
            temperature=r.get("temperature", 0.0),
            top_p=r.get("top_p", 1.0),
            top_k=r.get("top_k", 0),
            seed=r.get("seed"),
            logprobs=r.get("logprobs"),
            # A grammar ends on EOS: structured requests stop there.
            ignore_eos="structured" not in r,
            structured_outputs=(
                StructuredOutputsParams(**r["structured"]) if "structured" in r else None
            ),
        )
        for r in requests
    ]
    return prompts, params


def run_phases(llm: Any, job: dict[str, Any], startup_s: float) -> dict[str, Any]:
    """Benchmark mode: generate each phase's requests in turn, timing each.

    A warm-up generate runs the first phase's requests once, unmeasured. Per
    phase: wall time of ``generate``, each rank's seconds in the target's
    forward (its busy fraction is that over the wall time) and inside
    execute_model + sample_tokens (its working fraction), its steps, and
    acceptance deltas.
    """
    from vllm_ppspec.testing.probes import runner_clocks

    # Warm-up, not measured: first-call compilation (ngram's numba kernel,
    # torch's CPU kernels) would otherwise land in the first phase.
    llm.generate(*_params(job["phases"][0]["requests"]), use_tqdm=False)
    phases = []
    for phase in job["phases"]:
        prompts, params = _params(phase["requests"])
        spec0 = spec_metrics(llm) if job.get("spec") else None
        clocks0 = llm.collective_rpc(runner_clocks)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
        clocks1 = llm.collective_rpc(runner_clocks)
        # Per rank: (seconds in the forward, seconds working, steps) gained in the phase.
        gained = [
            tuple(y - x for x, y in zip(a, b, strict=True))
            for a, b in zip(clocks0, clocks1, strict=True)
        ]
        spec1 = spec_metrics(llm) if job.get("spec") else None
        phases.append(
            {
                "name": phase["name"],
                "generate_s": round(wall, 4),
                "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                "busy": [round(fwd / wall, 4) for fwd, _, _ in gained],
                "working": [round(work / wall, 4) for _, work, _ in gained],
                "steps": [steps for _, _, steps in gained],
                "spec": _spec_delta(spec0, spec1),
                "outputs": [list(o.outputs[0].token_ids) for o in outs],
            }
        )
    llm.llm_engine.engine_core.shutdown()
    return {"phases": phases, "startup_s": round(startup_s, 2)}


def _spec_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> Any:
    """Counters of ``spec_metrics`` gained between two readings (lists element-wise)."""
    if not before or not after:
        return None
    return {
        k: [b - a for a, b in zip(before[k], v, strict=True)]
        if isinstance(v, list)
        else v - before[k]
        for k, v in after.items()
    }


def main() -> None:
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    result = run(job)
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
