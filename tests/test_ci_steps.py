"""A CI step fails when any command inside it fails (``.ci/run``,
``scripts/test.sh``), and a test run that collects no test fails unless the
caller's selection explains it (``scripts/test.sh``).

Each case runs the repository's own ``.ci/run``, ``scripts/test.sh`` and
``scripts/budget.sh`` in a copy of the tree whose installs, downloads, tools and
interpreters are stand-ins: each stand-in records its call and succeeds, except
the one call a case makes fail, which is followed by calls that succeed (the
shape that hid a failure: bash ignores ``set -e`` inside a function run in a
``||`` context, as ``budget_run`` runs every part, so such a function returned
its last command's status only). No install, no download, no vLLM: a few
seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

# The scripts under test, copied as they are.
REAL = [
    ".ci/run",
    "scripts/test.sh",
    "scripts/setup_all.sh",
    "scripts/budget.sh",
    "tests/on_vllm_0.33.txt",
    "tests/on_vllm_0.34.txt",
]
# The stand-ins: run with bash (scripts) or executed (the interpreters).
STAND_INS = [
    "scripts/setup.sh",
    "scripts/setup_suffix.sh",
    "scripts/setup_overlay.sh",
    "scripts/downloads.sh",
    "scripts/check_wheel.sh",
    ".venv/bin/python",
    ".venv-0.33/bin/python",
    ".venv-0.34/bin/python",
]
STAND_IN = """#!/usr/bin/env bash
shopt -s extglob  # EMPTY may be an extended pattern: @(a|b)
call="{name}${{*:+ $*}}"
case "$call" in
  "${{SLOW:-__none__}}"*) sleep 2 ;;
esac
echo "$call" >> "$CALLS"
echo "$(nice) $call" >> "$CALLS.nice"
case "$call" in
  "{fail}"*)
    echo "ERROR    vllm.ppspec:plugin.py:67 a logged error, not a failed test"
    echo "FAILED tests/test_stand_in.py::test_case - $call"
    echo "after it"; exit 7 ;;
  ${{EMPTY:-__none__}})
    echo "no tests ran in 0.01s"; exit 5 ;;
esac
exit 0
"""


def _run(
    tmp_path: Path,
    script: str,
    fail: str,
    slow: str = "__none__",
    empty: str = "__none__",
    args: tuple[str, ...] = (),
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run ``script`` (a path in the tree) with ``args`` in a copy of the tree
    where each call starting with ``fail`` exits 7, each starting with ``slow``
    takes 2 s before it is recorded, and each matching the bash pattern
    ``empty`` exits 5 as pytest does when it collects no test; the result and
    every call made."""
    root = tmp_path / "repo"
    for path in REAL:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, root / path)
    for path in STAND_INS:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(STAND_IN.format(name=path, fail=fail))
        (root / path).chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    env = {
        **os.environ,
        "CALLS": str(calls),
        "TMPDIR": str(tmp_path),
        "SLOW": slow,
        "EMPTY": empty,
    }
    # What a CI run around this test sets for its own scripts/test.sh.
    for name in ("PPSPEC_BUDGET_FILE", "PPSPEC_SET_UP", "PPSPEC_WAIT_BEFORE_E2E"):
        env.pop(name, None)
    out = subprocess.run(
        ["bash", str(root / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out, calls.read_text().splitlines()


def _parts(out: subprocess.CompletedProcess) -> dict[str, str]:
    """The budget table's rows: part -> its seconds ("-": not run)."""
    rows = out.stdout.split("== BUDGET")[-1].splitlines()[2:]
    return {row.split()[0]: row.split()[1] for row in rows if row.split()}


def _codes(tmp_path: Path) -> dict[str, int]:
    """The budget record's exit code of each part (scripts/budget.sh)."""
    (record,) = tmp_path.glob("ppspec-budget.*")
    lines = record.read_text().splitlines()[1:]
    return {part: int(code) for part, _, code in (line.split() for line in lines)}


NOTHING = "__nothing_fails__"


def test_the_ci_run_passes_when_every_command_passes(tmp_path):
    out, calls = _run(tmp_path, ".ci/run", NOTHING)
    assert out.returncode == 0, out.stdout + out.stderr
    for call in [
        "scripts/setup.sh",
        "scripts/setup_suffix.sh",
        "scripts/downloads.sh wait vllm-0.33.0",
        "scripts/setup_overlay.sh",
        "scripts/downloads.sh wait vllm-0.34.0",
        "scripts/setup_overlay.sh 0.34.0",
        ".venv/bin/python -m vllm_ppspec_tools.drift 0.32.0 --cache .cache/wheels",
        ".venv/bin/python -m vllm_ppspec_tools.drift 0.33.0 --cache .cache/wheels",
        ".venv/bin/python -m vllm_ppspec_tools.drift 0.34.0 --cache .cache/wheels",
        ".venv/bin/python -m pre_commit run --all-files",
        "scripts/check_wheel.sh",
    ]:
        assert call in calls, (call, calls)
    parts = _parts(out)
    assert all(
        parts[p] != "-"
        for p in ["setup", "unit", "e2e", "vllm-0.33", "vllm-0.34", "drift", "gate", "wheel"]
    )
    assert any(c.startswith(".venv-0.34/bin/python -m pytest") for c in calls), calls


# id -> (the call that fails, the step it belongs to). In the drift and setup
# steps a later command succeeds (the 0.33.0 check; the download wait and the
# overlay); the gate is one command.
CI_FAILURES = {
    "drift-0.32.0": (".venv/bin/python -m vllm_ppspec_tools.drift 0.32.0", "drift"),
    "drift-download": ("scripts/downloads.sh wait vllm-0.32.0", "drift"),
    "gate": (".venv/bin/python -m pre_commit", "gate"),
    "setup": ("scripts/setup.sh", "setup"),
    "overlay": ("scripts/setup_overlay.sh", "setup"),  # beside the unit tests
    "real-model": (".venv/bin/python -m vllm_ppspec_tools.fixtures.real_model", "setup"),
    # in the background of the overlay step, which waits for it
    "pair": (".venv/bin/python -m vllm_ppspec_tools.fixtures.real_pair drafter", "setup"),
}


@pytest.mark.parametrize(("fail", "part"), CI_FAILURES.values(), ids=CI_FAILURES.keys())
def test_a_failing_command_fails_its_step_and_the_ci_run(tmp_path, fail, part):
    out, _ = _run(tmp_path, ".ci/run", fail)
    assert out.returncode != 0, out.stdout + out.stderr
    assert _codes(tmp_path)[part] != 0, _codes(tmp_path)


SETUP_FAILURES = ["scripts/setup.sh", "scripts/downloads.sh wait vllm-0.33.0"]


@pytest.mark.parametrize("fail", SETUP_FAILURES)
def test_a_failing_setup_command_fails_the_test_run_before_any_test(tmp_path, fail):
    out, calls = _run(tmp_path, "scripts/test.sh", fail)
    assert out.returncode != 0, out.stdout + out.stderr
    assert not [c for c in calls if "pytest" in c], calls
    assert _codes(tmp_path) == {"setup": 7}


def _niceness(tmp_path: Path) -> dict[str, int]:
    """Each recorded call -> the niceness it ran at."""
    lines = (tmp_path / "calls.nice").read_text().splitlines()
    return {call: int(nice) for nice, call in (line.split(" ", 1) for line in lines)}


PAIR = ".venv/bin/python -m vllm_ppspec_tools.fixtures.real_pair"
REAL_MODEL = ".venv/bin/python -m vllm_ppspec_tools.fixtures.real_model"
CONVERSIONS = [f"{PAIR} target", f"{PAIR} drafter", REAL_MODEL]
CHECKS = [
    ".venv/bin/python -m vllm_ppspec_tools.drift 0.33.0 --cache .cache/wheels",
    ".venv/bin/python -m pre_commit run --all-files",
    "scripts/check_wheel.sh",
]


def test_the_e2e_tests_start_after_the_set_up_beside_the_unit_tests_ends(tmp_path):
    # .ci/run runs the set-up's second stage beside the unit tests; scripts/test.sh
    # waits for its status file before its first e2e run, even when the set-up
    # takes longer than the unit tests.
    out, calls = _run(tmp_path, ".ci/run", NOTHING, slow=f"{PAIR} target")
    assert out.returncode == 0, out.stdout + out.stderr
    first_e2e = next(i for i, c in enumerate(calls) if "pytest" in c and "-m e2e" in c)
    assert all(calls.index(c) < first_e2e for c in CONVERSIONS), calls
    # The 0.34 list's one file runs in one process (xdist's workers cost more).
    unit = [c for c in calls if "pytest" in c and "not e2e" in c and "0.34.0" not in c]
    assert unit and all("-n 2" in c for c in unit), unit


def test_the_unit_runs_hand_out_the_slowest_files_first(tmp_path):
    """pytest-xdist hands out the files with the most tests first by default,
    which left the two-test files of a minute each (timers, links) to the end:
    the unit run took 346-369 s, and 203 s in this order (the 0.33 cases 118 s
    and 68 s). Each unit run keeps the order it is given, slowest first."""
    out, calls = _run(tmp_path, "scripts/test.sh", NOTHING)
    assert out.returncode == 0, out.stdout + out.stderr
    unit = [c for c in calls if "pytest" in c and "not e2e" in c and "0.34.0" not in c]
    assert len(unit) == 2, unit
    for call, first in zip(unit, ["peer_watch_link", "deployment_check"], strict=True):
        assert "--no-loadscope-reorder" in call, call
        files = [a for a in call.split() if a.startswith("tests/")]
        assert files[0] == f"tests/test_{first}.py", files[:3]


def test_the_full_run_has_the_real_pair_converted_beside_the_unit_tests(tmp_path):
    """Issue 47's rule: the real pair's group runs in CI while the whole run
    stays within 40 minutes (it does: docs/testing.md, "The budget"). The pair
    converts side by side in the set-up's second stage, and the e2e run selects
    every e2e test, the group's included."""
    out, calls = _run(tmp_path, ".ci/run", NOTHING, slow=f"{PAIR} target")
    assert out.returncode == 0, out.stdout + out.stderr
    first_unit = next(c for c in calls if "pytest" in c and "not e2e" in c)
    # The drafter's conversion ends before the slow target's: they run side by side.
    assert calls.index(f"{PAIR} drafter") < calls.index(f"{PAIR} target"), calls
    assert calls.index(first_unit) < calls.index(f"{PAIR} target"), calls
    e2e = [c for c in calls if c.startswith(".venv/bin/python -m pytest") and "-m e2e" in c]
    assert len(e2e) == 1 and "-m e2e " in e2e[0] and "real_pair" not in e2e[0], e2e


def test_the_real_pair_group_converts_the_pair_side_by_side_then_runs_only_it(tmp_path):
    out, calls = _run(
        tmp_path, "scripts/test.sh", NOTHING, slow=f"{PAIR} target", args=("--real-pair",)
    )
    assert out.returncode == 0, out.stdout + out.stderr
    runs = [c for c in calls if "-m pytest" in c]
    assert len(runs) == 1 and "-m real_pair tests" in runs[0], runs
    # The drafter's conversion starts before the slow target's ends; pytest after both.
    assert calls.index(f"{PAIR} drafter") < calls.index(f"{PAIR} target") < calls.index(runs[0])


def test_a_failing_pair_conversion_fails_the_group_before_its_tests(tmp_path):
    out, calls = _run(tmp_path, "scripts/test.sh", f"{PAIR} drafter", args=("--real-pair",))
    assert out.returncode != 0, out.stdout + out.stderr
    assert not [c for c in calls if "-m pytest" in c], calls


def test_the_checks_beside_the_tests_yield_to_the_set_up_and_the_tests(tmp_path):
    # Drift, gate and wheel are on no test's path: they run at the lowest
    # priority, the set-up's second stage above them, the tests above both; a
    # slow check does not hold the e2e tests back, and the run still waits for it.
    out, calls = _run(tmp_path, ".ci/run", NOTHING, slow=".venv/bin/python -m pre_commit")
    assert out.returncode == 0, out.stdout + out.stderr
    nice = _niceness(tmp_path)
    assert {nice[c] for c in CHECKS} == {19}, nice
    assert {nice[c] for c in [*CONVERSIONS, "scripts/setup_overlay.sh"]} == {10}, nice
    tests = [c for c in calls if "-m pytest" in c]
    assert tests and {nice[c] for c in tests} == {0}, nice
    assert _codes(tmp_path)["gate"] == 0, _codes(tmp_path)


@pytest.mark.parametrize("script", [".ci/run", "scripts/test.sh"])
def test_the_run_ends_by_naming_the_failed_tests_and_failed_parts(tmp_path, script):
    # A CI log is read from its end: the failed tests are listed again after
    # everything else the run printed, and the budget table says which part failed.
    fail = ".venv/bin/python -m pytest -v -rA --durations=0 -m e2e"
    out, _ = _run(tmp_path, script, fail)
    assert out.returncode != 0, out.stdout + out.stderr
    tail = out.stdout.split("== FAILED TESTS")[-1]
    assert "== FAILED TESTS (1," in out.stdout
    assert tail.splitlines()[1].startswith(f"FAILED tests/test_stand_in.py::test_case - {fail}"), (
        tail
    )
    assert "after it" not in tail and "a logged error" not in tail, tail
    rows = {r.split()[0]: r.split()[3:] for r in tail.split("== BUDGET")[-1].splitlines()[2:10]}
    assert rows["e2e"][:2] == ["FAILED(exit", "7)"], rows
    assert rows["unit"][:1] == ["passed"], rows


# The pytest runs of scripts/test.sh, as the stand-ins record them: the unit
# and e2e runs on vLLM 0.32, the 0.33 list's two, the 0.34 list's one.
UNIT_RUN = ".venv/bin/python -m pytest *-m not e2e*"
E2E_RUN = ".venv/bin/python -m pytest *-m e2e*"
EVERY_RUN = "*/bin/python -m pytest*"


@pytest.mark.parametrize(("empty", "part"), [(UNIT_RUN, "unit"), (E2E_RUN, "e2e")])
def test_a_run_of_the_whole_suite_that_collects_no_test_fails(tmp_path, empty, part):
    """Without arguments every run selects its tests itself: one that collects
    none (a marker or a path renamed) fails its part and the script."""
    out, calls = _run(tmp_path, "scripts/test.sh", NOTHING, empty=empty)
    assert out.returncode != 0, out.stdout + out.stderr
    codes = _codes(tmp_path)
    assert codes[part] == 5, codes
    assert {p: c for p, c in codes.items() if p != part} == dict.fromkeys(
        [p for p in ("setup", "unit", "e2e", "vllm-0.33", "vllm-0.34") if p != part], 0
    ), codes
    assert "this run collected no test" in out.stdout, out.stdout
    assert "NO TEST COLLECTED" not in out.stdout


def test_a_selection_may_leave_some_runs_empty(tmp_path):
    """With the caller's arguments (-k naming unit tests) the runs that collect
    nothing are explained by the selection: the script passes."""
    args = ("-k", "test_adaptive_k")
    empty = f"@({E2E_RUN}|.venv-0.3[34]/bin/python -m pytest*)"
    out, calls = _run(tmp_path, "scripts/test.sh", NOTHING, empty=empty, args=args)
    assert out.returncode == 0, out.stdout + out.stderr
    runs = [c for c in calls if "-m pytest" in c]
    assert len(runs) == 5 and all("-k test_adaptive_k" in c for c in runs), runs
    assert out.stdout.count("no tests ran") == 4, out.stdout  # all but the unit run
    assert set(_codes(tmp_path).values()) == {0}, _codes(tmp_path)


def test_a_selection_that_no_run_collects_a_test_of_fails(tmp_path):
    """A selection that matches no test anywhere (a typo in -k) fails the
    script, naming the arguments, though each run alone counts as passed."""
    args = ("-k", "test_no_such_test")
    out, calls = _run(tmp_path, "scripts/test.sh", NOTHING, empty=EVERY_RUN, args=args)
    assert out.returncode == 5, out.stdout + out.stderr
    assert len([c for c in calls if "-m pytest" in c]) == 5, calls
    assert out.stdout.count("no tests ran") == 5, out.stdout
    assert set(_codes(tmp_path).values()) == {0}, _codes(tmp_path)
    assert (
        "== NO TEST COLLECTED by any of the 5 pytest runs with the arguments: -k "
        "test_no_such_test" in out.stdout
    ), out.stdout
