"""vllm-ppspec-bench-serve's mechanisms, without an engine (fast).

The command lines it builds for each configuration (PP, eager, the spec
config, the worker, the cores), the prompt set it ships, what it keeps of a
``vllm bench serve`` result (a real one: ``tests/data/vllm_bench_serve_result.json``,
saved with ``--save-result --save-detailed`` by its first smoke run: 8 requests, 8 in
flight, ``--ignore-eos``), the summary,
the ratios, the output check, the JSON's shape and the plot. No speed is
asserted: the figures are canned.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path

import pytest

from vllm_ppspec_tools import bench_serve as bs
from vllm_ppspec_tools import bench_serve_report as rep
from vllm_ppspec_tools.bench_serve_configs import SUFFIX_K
from vllm_ppspec_tools.fixtures.copy_prompts import PROMPTS

REPO = Path(__file__).resolve().parent.parent
RESULT = Path(__file__).parent / "data" / "vllm_bench_serve_result.json"
NAMES = [
    "pp1 no spec eager",
    "pp1 no spec compiled",
    "pp1 ngram eager",
    "pp1 ngram compiled",
    "pp2 no spec eager",
    "pp2 no spec compiled",
    "pp2 ngram eager",
    "pp2 ngram compiled",
    "pp2 ngram adaptive K eager",
    "pp2 ngram adaptive K compiled",
]


def _opt(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


# ---------------------------------------------------------------------------
# What it starts and runs.
# ---------------------------------------------------------------------------


def test_the_configurations_have_stable_names():
    assert list(bs.CONFIGS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_serve_args_and_env_of_each_configuration(name):
    cfg = bs.CONFIGS[name]
    args = bs.serve_args(cfg, "/m")
    env = bs.serve_env(cfg)
    assert args[0] == "/m" and _opt(args, "--served-model-name") == "smollm2"
    assert _opt(args, "--dtype") == "float32"
    assert ("--enforce-eager" in args) == name.endswith("eager")
    pp = 2 if name.startswith("pp2") else 1
    assert _opt(args, "--pipeline-parallel-size") == (str(pp) if pp == 2 else None)
    assert _opt(args, "--distributed-executor-backend") == ("mp" if pp == 2 else None)
    spec = _opt(args, "--speculative-config")
    if "ngram" in name:
        assert json.loads(spec or "") == {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        }
    else:
        assert spec is None
    # vLLM's own eager PP=2 fails on CPU: there the plugin's worker (mode off)
    # serves; everywhere else the worker is vLLM's choice (the plugin selects
    # itself for PP + spec).
    want_worker = "vllm_ppspec.worker.PPSpecWorker" if name == "pp2 no spec eager" else None
    assert _opt(args, "--worker-cls") == want_worker
    # One core per stage at PP=2, both cores at PP=1 (as the demo).
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == ("0|1" if pp == 2 else "auto")
    # The plugin's adaptive K where the name says so, and only there.
    assert env.get("VLLM_PPSPEC_ADAPTIVE_K") == ("1" if "adaptive K" in name else None)


def test_bench_args_drive_the_load_greedy_and_save_every_text(tmp_path):
    result = tmp_path / "r.json"
    args = bs.bench_args("http://127.0.0.1:1", "/tok", tmp_path / "d.json", 24, 8, 96, result)
    assert args[:2] == ["bench", "serve"]
    expect = {
        "--backend": "openai-chat",
        "--endpoint": "/v1/chat/completions",
        "--base-url": "http://127.0.0.1:1",
        "--model": "smollm2",
        "--tokenizer": "/tok",
        "--dataset-name": "sharegpt",
        "--dataset-path": str(tmp_path / "d.json"),
        "--sharegpt-output-len": "96",
        "--temperature": "0",
        "--num-prompts": "24",
        "--max-concurrency": "8",
        "--result-dir": str(tmp_path),
        "--result-filename": "r.json",
    }
    assert {k: _opt(args, k) for k in expect} == expect
    for flag in ("--disable-shuffle", "--save-detailed"):
        assert flag in args
    assert "--ignore-eos" not in args  # a request ends at EOS, as a chat user gets it
    assert "--ignore-eos" in bs.bench_args("u", "t", tmp_path, 1, 1, 5, result, ignore_eos=True)


def test_prompt_counts_are_multiples_of_the_load():
    assert [bs.num_prompts(x, 18) for x in (1, 8, 16, 32, 64)] == [18, 24, 32, 32, 64]
    assert bs.num_prompts(8, 4) == 8


def test_selection_adds_the_reference_and_refuses_unknown_names(capsys):
    assert [c.name for c in bs.selected(None)] == NAMES
    picked = [c.name for c in bs.selected("pp2 ngram eager, pp2 no spec compiled")]
    assert picked == ["pp1 no spec eager", "pp2 ngram eager", "pp2 no spec compiled"]
    assert [c.name for c in bs.selected("pp1 no spec compiled,pp2 ngram compiled")] == [
        "pp1 no spec compiled",
        "pp2 ngram compiled",
    ]
    with pytest.raises(SystemExit, match="unknown configuration"):
        bs.selected("pp3 ngram eager")


def test_an_ngram_configuration_named_with_its_k_runs_that_k():
    # K beside K in one run (a larger K with adaptive K against K = 3).
    picked = bs.selected(
        "pp2 ngram compiled, pp2 ngram k6 adaptive K compiled, pp1 no spec compiled"
    )
    assert [c.name for c in picked] == [
        "pp2 ngram compiled",
        "pp2 ngram k6 adaptive K compiled",
        "pp1 no spec compiled",
    ]
    k3, k6, _ = picked
    for cfg, k in ((k3, 3), (k6, 6)):
        spec = json.loads(_opt(bs.serve_args(cfg, "/m", k=3), "--speculative-config") or "")
        assert spec["num_speculative_tokens"] == k
    assert (k6.pp, k6.spec, k6.eager, k6.adaptive) == (2, True, False, True)
    assert k6.describe()["k"] == 6 and "k" not in k3.describe()
    assert bs.serve_env(k6)["VLLM_PPSPEC_ADAPTIVE_K"] == "1"
    assert "--enforce-eager" in bs.serve_args(bs.selected("pp1 ngram k5 eager")[1], "/m")
    for bad in ("pp2 no spec k6 compiled", "pp2 ngram k0 compiled", "pp2 k6 ngram compiled"):
        with pytest.raises(SystemExit, match="unknown configuration"):
            bs.selected(bad)


def test_a_suffix_configuration_runs_suffix_decoding_without_a_cross_request_cache():
    picked = bs.selected("pp2 suffix compiled, pp1 suffix k8 eager")
    assert [c.name for c in picked] == [
        "pp1 no spec eager",
        "pp2 suffix compiled",
        "pp1 suffix k8 eager",
    ]
    _, pp2, pp1 = picked
    for cfg, pp, k in ((pp2, 2, SUFFIX_K), (pp1, 1, 8)):
        args = bs.serve_args(cfg, "/m", k=3)
        assert json.loads(_opt(args, "--speculative-config") or "") == {
            "method": "suffix",
            "num_speculative_tokens": k,
            # The bench sends each prompt more than once: no replayed responses.
            "suffix_decoding_max_cached_requests": 0,
        }
        assert _opt(args, "--pipeline-parallel-size") == (str(pp) if pp == 2 else None)
        assert cfg.spec and not cfg.adaptive
        assert cfg.describe()["method"] == "suffix"
    assert ("--enforce-eager" in bs.serve_args(pp1, "/m")) is True
    assert "--worker-cls" not in bs.serve_args(pp2, "/m")  # the plugin selects itself
    for bad in ("pp2 suffix adaptive K compiled", "pp2 suffix k6 k8 compiled", "pp2 suffix"):
        with pytest.raises(SystemExit, match="unknown configuration"):
            bs.selected(bad)


def test_a_pp2_spec_configuration_may_set_the_target_layer_split():
    name = "pp2 ngram k6 adaptive K compiled split=19:11"
    _, cfg = bs.selected(name)
    assert cfg.name == name and (cfg.pp, cfg.k, cfg.adaptive) == (2, 6, True)
    env = bs.serve_env(cfg)
    assert env["VLLM_PP_LAYER_PARTITION"] == "19,11"
    assert env["VLLM_PPSPEC_ADAPTIVE_K"] == "1"
    assert cfg.describe()["split"] == "19,11"
    spec = json.loads(_opt(bs.serve_args(cfg, "/m"), "--speculative-config") or "")
    assert spec["num_speculative_tokens"] == 6
    suffix = bs.selected("pp2 suffix compiled split=20:10")[1]
    assert bs.serve_env(suffix)["VLLM_PP_LAYER_PARTITION"] == "20,10"
    # Without split= nothing is set: the plugin chooses (layer_split.py).
    plain = bs.selected("pp2 ngram k6 adaptive K compiled")[1]
    assert "VLLM_PP_LAYER_PARTITION" not in bs.serve_env(plain)
    for bad in (
        "pp2 no spec compiled split=19:11",  # no spec: vLLM's own split
        "pp1 ngram compiled split=30",
        "pp2 ngram compiled split=19",
        "pp2 ngram compiled split=19:x",
    ):
        with pytest.raises(SystemExit, match="unknown configuration"):
            bs.selected(bad)


def test_the_shipped_prompts_start_with_the_demos_and_ship_in_the_wheel(tmp_path):
    prompts = bs.load_prompts(bs.PROMPTS_FILE)
    assert len(prompts) == 18 and prompts[:6] == PROMPTS
    assert len(set(prompts)) == len(prompts)
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "data/*.jsonl" in data["tool"]["setuptools"]["package-data"]["vllm_ppspec_tools"]
    assert data["project"]["scripts"]["vllm-ppspec-bench-serve"] == (
        "vllm_ppspec_tools.bench_serve:main"
    )
    # Row i of a written dataset is prompt i mod len: the output check relies on it.
    path = bs.write_dataset(prompts, 20, tmp_path / "d.json")
    assert bs.dataset_prompts(path) == [prompts[i % 18] for i in range(20)]


# ---------------------------------------------------------------------------
# What it makes of vLLM's results.
# ---------------------------------------------------------------------------


def _real() -> dict:
    return json.loads(RESULT.read_text())


def test_run_record_reads_a_real_vllm_bench_serve_result():
    raw = _real()
    rec = rep.run_record(raw)
    assert rec["output_tok_s"] == round(raw["output_throughput"], 2) > 0
    assert rec["completed"] == raw["completed"] == len(rec["texts"]) > 0
    assert rec["failed"] == 0 and not any(rec["errors"])
    assert rec["output_tokens"] == raw["total_output_tokens"]
    assert all(isinstance(t, str) and t for t in rec["texts"])


def _runs(tps: dict[str, dict[str, list[float]]]) -> dict:
    """Runs whose records are the real result with the given tok/s."""
    base = rep.run_record(_real())
    return {
        name: {
            load: [{**copy.deepcopy(base), "output_tok_s": t} for t in ts]
            for load, ts in loads.items()
        }
        for name, loads in tps.items()
    }


CANNED = {
    "pp1 no spec eager": {"1": [30.0, 28.0, 29.0], "8": [90.0, 88.0, 92.0]},
    "pp1 ngram compiled": {"1": [36.0, 37.0, 35.0], "8": [110.0, 112.0, 111.0]},
    "pp2 no spec compiled": {"1": [28.0, 28.5, 27.0], "8": [77.0, 78.0, 80.0]},
    "pp2 ngram eager": {"1": [30.0, 31.0, 29.0], "8": [120.0, 122.0, 124.0]},
    "pp2 ngram compiled": {"1": [43.0, 44.0, 42.0], "8": [140.0, 139.0, 141.0]},
}


def _configs(names) -> dict:
    return {n: bs.CONFIGS[n].describe() for n in names}


def test_summary_keeps_each_repeat_with_min_and_median():
    summary = rep.summarize(_runs(CANNED))
    row = summary["pp2 ngram compiled"]["1"]
    assert row["output_tok_s"] == [43.0, 44.0, 42.0]
    assert (row["min"], row["median"]) == (42.0, 43.0)
    n = rep.run_record(_real())["completed"]
    assert row["completed"] == 3 * n and row["failed"] == 0 and row["run_errors"] == []


def test_ratios_take_the_best_of_each_group_by_median():
    summary = rep.summarize(_runs(CANNED))
    r = rep.ratios(summary, _configs(CANNED), [1, 8])
    assert r["1"]["best_pp2_spec"] == "pp2 ngram compiled"
    assert r["1"]["best_pp1"] == "pp1 ngram compiled"
    assert r["1"]["best_pp2_no_spec"] == "pp2 no spec compiled"
    assert r["1"]["pp2_spec_over_best_pp1"] == round(43.0 / 36.0, 3)
    assert r["8"]["pp2_spec_over_best_pp2_no_spec"] == round(140.0 / 78.0, 3)
    only_pp1 = {k: v for k, v in summary.items() if k.startswith("pp1")}
    assert rep.ratios(only_pp1, _configs(CANNED), [1])["1"]["pp2_spec_over_best_pp1"] is None


def test_the_output_check_compares_each_request_with_pp1_without_spec():
    runs = _runs(CANNED)
    n = len(runs["pp1 no spec eager"]["1"][0]["texts"])
    check = rep.check_outputs(runs, _configs(CANNED))
    assert (
        check["identical"] and check["compared"] == (5 * 3 - 1) * 2 * n
    )  # the reference's first repeat is the reference
    # One changed text: named; a failed request is not compared.
    runs["pp2 ngram compiled"]["8"][2]["texts"][1] += " x"
    runs["pp2 ngram eager"]["1"][0]["texts"][0] = ""
    runs["pp2 ngram eager"]["1"][0]["errors"][0] = "boom"
    check = rep.check_outputs(runs, _configs(CANNED))
    assert check["mismatches"] == ["pp2 ngram compiled @8 repeat 3 request 1"]
    assert check["compared"] == (5 * 3 - 1) * 2 * n - 1
    # Compiled configurations compare with the compiled reference when it ran.
    assert rep.reference_for("pp2 ngram compiled", _configs(NAMES)) == "pp1 no spec compiled"
    assert rep.reference_for("pp2 ngram compiled", _configs(CANNED)) == "pp1 no spec eager"


def _data(runs: dict) -> dict:
    return {
        "label": "smoke",
        "loads": [1, 8],
        "repeats": 3,
        "output_len": 96,
        "cpus": 2,
        "spec": bs.spec_config(),
        "configs": _configs(runs),
        "runs": runs,
    }


def test_finish_writes_the_json_and_prints_the_ratio_table(tmp_path, capsys):
    code = rep.finish(_data(_runs(CANNED)), tmp_path, "t")
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads((tmp_path / "bench-serve-t.json").read_text())
    assert {"configs", "runs", "summary", "ratios", "outputs", "loads"} <= set(data)
    assert set(data["summary"]) == set(CANNED)
    assert set(data["summary"]["pp1 no spec eager"]) == {"1", "8"}
    assert set(data["summary"]["pp1 no spec eager"]["8"]) == {
        "output_tok_s",
        "min",
        "median",
        "completed",
        "failed",
        "run_errors",
    }
    run = data["runs"]["pp2 ngram eager"]["8"][0]
    assert "texts" not in run and "errors" not in run and run["output_tok_s"] == 120.0
    assert data["outputs"]["identical"] is True
    assert "PP=2+spec / best PP=1" in out and "1.19x" in out  # 43 / 36 at 1 in flight
    assert "PP=2+spec / best PP=2 no spec" in out and "1.79x" in out  # 140 / 78 at 8
    assert "outputs identical to PP=1 without spec: True" in out


def test_finish_fails_on_a_different_output_or_a_failed_request(tmp_path, capsys):
    runs = _runs(CANNED)
    runs["pp2 ngram eager"]["8"][0]["texts"][0] += "!"
    assert rep.finish(_data(runs), tmp_path, "a") == 1
    runs = _runs(CANNED)
    runs["pp2 ngram eager"]["8"][0]["failed"] = 1
    assert rep.finish(_data(runs), tmp_path, "b") == 1
    runs = _runs(CANNED)
    runs["pp2 ngram eager"]["8"].append({"error": "server did not start"})
    assert rep.finish(_data(runs), tmp_path, "c") == 1


def test_the_plot_writer_draws_one_line_per_configuration(tmp_path):
    pytest.importorskip("matplotlib")
    data = _data(_runs(CANNED))
    data["summary"] = rep.summarize(data["runs"])
    path = tmp_path / "p.png"
    assert rep.plot(data, path) == list(CANNED)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_is_labelled_by_how_much_of_the_measurement_it_is():
    every = list(bs.CONFIGS.values())
    some = [bs.CONFIGS["pp1 no spec compiled"], bs.CONFIGS["pp2 ngram adaptive K compiled"]]

    def label(argv, configs):
        args = bs.parse(argv)
        args.num_prompts = args.num_prompts or 18
        return bs.label(args, configs, 18)

    assert label([], every) == "full"
    assert label(["--repeats", "2"], every) == "partial"
    assert label([], some) == "partial"
    assert label([], every + bs.selected("pp2 ngram k6 compiled")[1:]) == "partial"
    assert label(["--repeats", "1"], some) == "smoke"
    assert label(["--loads", "1,8"], every) == "smoke"
    assert label(["--num-prompts", "8"], every) == "smoke"


def test_a_draft_configuration_runs_the_workloads_draft_model():
    picked = bs.selected("pp1 draft compiled, pp2 draft adaptive K compiled, pp2 draft k2 eager")
    assert [c.name for c in picked] == [
        "pp1 no spec eager",
        "pp1 draft compiled",
        "pp2 draft adaptive K compiled",
        "pp2 draft k2 eager",
    ]
    _, pp1, adaptive, k2 = picked
    for cfg, k in ((pp1, 3), (adaptive, 3), (k2, 2)):
        args = bs.serve_args(cfg, "/target", 3, "/drafter", "qwen-coder")
        assert _opt(args, "--served-model-name") == "qwen-coder"
        assert json.loads(_opt(args, "--speculative-config") or "") == {
            "method": "draft_model",
            "model": "/drafter",
            "num_speculative_tokens": k,
        }
        assert cfg.describe()["method"] == "draft_model"
    assert bs.serve_env(adaptive)["VLLM_PPSPEC_ADAPTIVE_K"] == "1"
    # The plugin's worker serves PP + spec, and its clocks are read through the dev RPC.
    assert bs.serve_env(adaptive)["VLLM_SERVER_DEV_MODE"] == "1"
    assert "VLLM_SERVER_DEV_MODE" not in bs.serve_env(pp1)
    assert "--worker-cls" not in bs.serve_args(k2, "/t", 3, "/d")
    with pytest.raises(SystemExit, match="needs a workload with a drafter"):
        bs.serve_args(pp1, "/target")  # SmolLM2's workload has no drafter
    # "first": the draft model on the first PP stage (runner/drafter/first_stage.py).
    _, first, first_k2 = bs.selected("pp2 draft first eager, pp2 draft k2 first adaptive K eager")
    assert bs.serve_env(first)["VLLM_PPSPEC_DRAFTER_STAGE"] == "first"
    assert first.describe()["drafter_stage"] == "first" and not first.adaptive
    assert first_k2.k == 2 and first_k2.adaptive and first_k2.drafter_first
    # Without "first", a PP=2 draft configuration names vLLM's placement, whatever
    # the default (auto) would choose for its pair.
    assert bs.serve_env(adaptive)["VLLM_PPSPEC_DRAFTER_STAGE"] == "last"
    assert adaptive.describe()["drafter_stage"] == "last"
    assert "VLLM_PPSPEC_DRAFTER_STAGE" not in bs.serve_env(pp1)
    for bad in ("pp1 draft first eager", "pp2 ngram first eager", "pp2 draft eager first"):
        with pytest.raises(SystemExit, match="unknown configuration"):
            bs.selected(bad)


def test_stage_shares_are_each_ranks_clock_growth_over_the_wall_time():
    before = [
        {"step_s": 1.0, "forward_s": 0.5, "draft_s": 0.0, "steps": 10},
        {"step_s": 2.0, "forward_s": 1.0, "draft_s": 0.5, "steps": 10},
    ]
    after = [
        {"step_s": 3.0, "forward_s": 2.0, "draft_s": 0.0, "steps": 30},
        {"step_s": 9.0, "forward_s": 3.0, "draft_s": 4.5, "steps": 30},
    ]
    assert rep.stage_shares(before, after, 10.0) == [
        {"busy": 0.2, "forward": 0.15, "draft": 0.0, "steps": 20},
        {"busy": 0.7, "forward": 0.2, "draft": 0.4, "steps": 20},
    ]


def test_peak_rss_is_read_for_every_process_of_the_group():
    import subprocess
    import sys

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; b = bytearray(64 << 20); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a server's
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        peak = rep.peak_rss_mib(child.pid)
        assert [int(k.rsplit(":", 1)[1]) for k in peak] == [child.pid]
        assert 64 <= max(peak.values()) < 1024  # its 64 MiB buffer, and only its own
    finally:
        child.kill()
        child.wait()


def test_the_details_give_latency_acceptance_stages_and_peak_memory():
    run = {
        "output_tok_s": 10.0,
        "median_ttft_ms": 120.0,
        "median_itl_ms": 80.0,
        "spec": {"tokens_per_round": 3.5, "acceptance_by_position": [0.9, 0.8, 0.7]},
        "stages": [{"busy": 0.6, "draft": 0.3}, {"busy": 0.9, "draft": 0.0}],
    }
    data = {
        "runs": {"pp2 draft first eager": {"8": [run, {**run, "median_ttft_ms": 140.0}]}},
        "peak_rss_mib": {
            "pp2 draft first eager": [
                {"VLLM::Worker:20": 3000.0, "VLLM::Worker:10": 5000.0, "vllm:5": 900.0},
                {"VLLM::Worker:31": 3100.0, "VLLM::Worker:30": 4900.0, "vllm:7": 950.0},
            ]
        },
    }
    lines = rep.detail_lines(data)
    assert lines[1] == (
        "  pp2 draft first eager @8: TTFT 130; ITL 80; 3.50 tok/round [0.90 0.80 0.70]; "
        "stages 0.60 (0.30) | 0.90 (0.00)"
    )
    # Workers by pid order within a repeat (the first PP rank starts first), largest over repeats.
    assert lines[2] == (
        "  pp2 draft first eager peak RSS MiB: VLLM::Worker 5000, VLLM::Worker#2 3100, vllm 950"
    )
