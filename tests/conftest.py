"""Shared fixtures (the tiny local models, built once and cached on disk) and the
e2e time budget.

The budget: ``--e2e-budget SECONDS`` (scripts/test.sh passes it, so the README's
test command and CI enforce it) fails the run when the e2e tests together take
longer, so the next change sees the suite outgrow CI's limit before CI does.
Without the option the e2e time is only reported. See docs/testing.md.

The vLLM release: ``--expect-vllm VERSION`` (scripts/test.sh passes 0.33.0 to
the run of tests/on_vllm_0.33.txt on .venv-0.33) stops the run at its start
unless the installed vLLM is that release. Every run says at its end which vLLM
it ran on, and so whether the 0.33 cases ran.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("PPSPEC_MODELS_DIR", REPO / ".cache" / "models"))

# vLLM forks its engine core and workers in the tests' jobs and servers (see
# vllm_ppspec_tools.fixtures.forkserver); a test that must run them as a user does
# passes PPSPEC_VLLM_START=spawn in its job's or server's environment.
os.environ.setdefault("PPSPEC_VLLM_START", "fork")


def release_cache_root() -> str:
    """A VLLM_CACHE_ROOT of the tests' own for the installed vLLM release.

    vLLM caches what it learns of each model class (``modelinfos/``, one file
    per class, keyed by its module file's hash) and its compiled graphs there.
    0.32.0 and 0.33.0 name the files alike and hash them differently, so a
    run on one release finds the other's entries stale and inspects each
    class again in a new interpreter (about 11 s each). One root per release
    keeps both warm."""
    import importlib.metadata

    from vllm_ppspec.compat.guard import base_version

    release = base_version(importlib.metadata.version("vllm"))
    home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return str(home / "vllm" / f"ppspec-tests-{release}")


@pytest.fixture(scope="session", autouse=True)
def shared_fork_server(tmp_path_factory):
    """The tools the tests run as subprocesses (demo, soak, bench) fork their
    ``vllm serve`` processes from this session's fork server
    (fixtures/forkserver_relay.py) instead of starting one each."""
    from vllm_ppspec_tools.fixtures import forkserver, forkserver_relay

    path = str(tmp_path_factory.mktemp("forkserver") / "relay.sock")
    sock = forkserver_relay.listen(forkserver._SERVER, path)
    os.environ[forkserver_relay.ENV] = forkserver_relay.announce(path)
    yield path
    os.environ.pop(forkserver_relay.ENV, None)
    sock.close()


# The PP=1 references several files compare against, made once per run.
pytest_plugins = ["tests.references"]


@pytest.fixture(scope="session")
def models() -> dict[str, str]:
    from vllm_ppspec_tools.fixtures.tiny_models import build_all

    return build_all(MODELS_DIR)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--e2e-budget",
        type=float,
        default=None,
        help="fail the run if the e2e tests take longer than this many seconds in all",
    )
    parser.addoption(
        "--expect-vllm",
        default=None,
        metavar="VERSION",
        help="stop the run at its start unless the installed vLLM is this release",
    )


_E2E = {"seconds": 0.0, "tests": 0, "started": 0.0}


def vllm_release(import_vllm: bool = True) -> str:
    """The release of the installed vLLM distribution (local labels such as +cpu
    dropped) and of the vLLM this interpreter imports; "a != b" if they differ.
    ``import_vllm=False``: the imported one only if vLLM is imported already."""
    import importlib.metadata

    from vllm_ppspec.compat.guard import base_version, installed_vllm_version

    installed = base_version(importlib.metadata.version("vllm"))
    if not import_vllm and "vllm" not in sys.modules:
        return installed
    imported = installed_vllm_version()
    return installed if imported == installed else f"{imported} != {installed}"


os.environ.setdefault("VLLM_CACHE_ROOT", release_cache_root())


def pytest_sessionstart(session: pytest.Session) -> None:
    _E2E["started"] = time.monotonic()
    expected = session.config.getoption("--expect-vllm")
    if expected is None:
        return
    # The installed distribution first (no import), then the vLLM imported.
    for import_vllm in (False, True):
        release = vllm_release(import_vllm)
        if release != expected:
            pytest.exit(
                f"--expect-vllm={expected}: this interpreter ({sys.executable}) runs vLLM "
                f"{release}; run the 0.33 cases with .venv-0.33 (scripts/test.sh)",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    t0 = time.monotonic()
    yield
    if item.get_closest_marker("e2e") is not None:
        _E2E["seconds"] += time.monotonic() - t0
        _E2E["tests"] += 1


def _over_budget(config: pytest.Config) -> float | None:
    budget = config.getoption("--e2e-budget")
    return budget if budget is not None and _E2E["seconds"] > budget else None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    budget = config.getoption("--e2e-budget")
    total = time.monotonic() - _E2E["started"]
    line = (
        f"E2E TIME: {_E2E['seconds']:.0f} s in {int(_E2E['tests'])} e2e tests "
        f"(whole run {total:.0f} s); budget: "
        + (f"{budget:.0f} s" if budget is not None else "none set (report only)")
    )
    if _over_budget(config) is not None:
        line += " -- OVER BUDGET: share engine start-ups (docs/testing.md) before adding more"
    terminalreporter.write_sep("=", line, bold=True, red=_over_budget(config) is not None)
    terminalreporter.write_line(_vllm_line())


def _vllm_line() -> str:
    """Which vLLM this run was on: whether the 0.33 cases ran."""
    release = vllm_release(import_vllm=False)
    if release == "0.33.0":
        return "VLLM 0.33.0: this run was on vLLM 0.33.0 (the 0.33 cases ran here)"
    return (
        f"VLLM {release}: the 0.33 cases did not run here; scripts/test.sh runs "
        "tests/on_vllm_0.33.txt on .venv-0.33"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _over_budget(session.config) is not None and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
