"""The benchmark runs end to end (tiny target, one repeat) and reports what it promises.

Its figures are not asserted (they are speed); its structure is: every engine
configuration ran (with ``--method draft_model``, async scheduling and the
filled pipeline at vLLM's even layer split too),
outputs equal PP=1 without spec (exit code 0), busy and working fractions and
acceptance were measured inside the runner, the round-exchange timing was
printed, and the JSON was written.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import MODELS_DIR

pytestmark = pytest.mark.e2e


def test_bench_runs_every_configuration_and_reports_busy_acceptance_and_transport(
    models, tmp_path, capsys
):
    from vllm_ppspec_tools import bench

    code = bench.main(
        [
            "--target=tiny",
            "--method=draft_model",
            "--loads=1,4",
            "--repeats=1",
            "--max-tokens=24",
            "--transport-rounds=20",
            f"--out={tmp_path}",
            f"--models-dir={MODELS_DIR}",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tokens identical to PP=1 without spec: True" in out
    assert "ratios @  4: filled/one batch" in out
    assert "256 requests, k=7: message" in out and "all_reduce" in out
    assert "async/filled" in out
    data = json.loads((tmp_path / "bench-tiny-pp2-draft_model.json").read_text())
    summary = data["summary"]
    assert set(summary) == {
        "pp1 no spec",
        "pp1 spec",
        "no spec",
        "one batch",
        "filled",
        "async",
        "even split",  # filled at vLLM's layer split, the plugin's own being 3,1 here
    }
    assert "filled/even split" in out
    for name in ("no spec", "one batch", "filled", "async"):
        for load in ("1", "4"):
            busy = summary[name][load]["busy_median"]
            working = summary[name][load]["working_median"]
            assert len(busy) == 2 and all(0 < b <= 1 for b in busy), (name, load, busy)
            # The forward runs inside execute_model: working covers busy, and
            # both are fractions of the time between the clock reads (a step
            # still in flight when generate returns lies inside it; 0.002: the
            # rounding of two medians).
            assert all(b <= w + 0.002 and w <= 1.002 for b, w in zip(busy, working, strict=True)), (
                name,
                load,
                busy,
                working,
            )
        for load in ("1", "4"):
            # Each stage's average step, split into forward, other work and
            # waiting (ms; the edge tolerance above allows a little below 0).
            per_step = summary[name][load]["step_ms_median"]
            assert per_step is not None and len(per_step) == 2, (name, load, per_step)
            assert all(f > 0 and o > -1 and w > -1 for f, o, w in per_step), (name, load, per_step)
    assert summary["pp1 no spec"]["1"]["step_ms_median"] is None  # vLLM's own worker
    # Steps counted by each stage at 4 in flight (24 tokens each, k=3, drafts
    # right): one batch runs all 4 requests in each step, both stages see
    # every step; the filled pipeline splits them into two batches, so it
    # runs about twice as many steps.
    one = data["runs"]["one batch"][0]["phases"][1]["steps"]
    filled = data["runs"]["filled"][0]["phases"][1]["steps"]
    assert one[0] == one[1] and 24 / 4 <= one[0] <= 24 + 2, one
    assert filled[0] == filled[1] and filled[0] >= 1.5 * one[0], (filled, one)
    assert "ms per step, forward + other work + waiting" in out
    for name in ("one batch", "filled", "async"):
        # draft_copy plants the tiny target's successor: drafts are right.
        assert summary[name]["4"]["acceptance"] > 0.9, summary[name]
    assert summary["no spec"]["4"]["acceptance"] is None
    assert set(data["transport_us"]) == {
        "16 requests, k=3",
        "16 requests, k=7",
        "256 requests, k=3",
        "256 requests, k=7",
    }
    for case in data["transport_us"].values():
        assert set(case) == {"message", "all_reduce"}
        assert all(median > 0 and 0 < low <= median for median, low in case.values())
