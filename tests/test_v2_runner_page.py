"""docs/on-model-runner-v2.md names only vLLM names the drift tool checks on 0.34.0.

Every vLLM name on the page (a dotted name in backticks that is not a file,
an environment variable or one of the plugin's) is in
``v2_runner_data.V2_RUNNER_NAMES``, the list ``vllm-ppspec-drift 0.34.0``
reports present or missing, and every name of that list is on the page. Its
table "The names" gives where 0.34.0 defines each one, and every
``vllm/...py:LINE`` the page cites is a line of that file: both read in the
0.34.0 wheel (downloaded once into .cache/wheels, as the drift check does).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import REPO
from vllm_ppspec_tools import drift
from vllm_ppspec_tools import drift_data as v2_runner_data

PAGE = REPO / "docs" / "on-model-runner-v2.md"
RELEASE = "0.34.0"
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
CITATION = re.compile(r"(vllm/[\w/]+\.py):(\d+)")


def vllm_names(text: str) -> set[str]:
    """The backticked dotted names that are vLLM's: not a ``.py`` file, not an
    environment variable (upper case), not the plugin's (``PPSpec...``)."""
    spans = re.findall(r"`([^`]+)`", text)
    return {
        s
        for s in spans
        if DOTTED.fullmatch(s)
        and not s.endswith(".py")
        and not s.isupper()
        and not s.startswith(("PPSpec", "vllm_ppspec"))
    }


def test_the_name_finder_reads_the_pages_conventions():
    text = "`GPUModelRunner.execute_model` (`vllm/v1/x.py:3`), `no_v1_runner.py`, `VLLM_X`, `--a`"
    assert vllm_names(text) == {"GPUModelRunner.execute_model"}


def test_every_vllm_name_on_the_page_is_in_the_drift_tools_0_34_list_and_back():
    listed = {qualname for _, qualname in v2_runner_data.V2_RUNNER_NAMES}
    on_page = vllm_names(PAGE.read_text())
    assert on_page - listed == set(), "on the page, not checked by the drift tool"
    assert listed - on_page == set(), "checked by the drift tool, not on the page"


def _wheel() -> Path:
    # Started by scripts/setup_all.sh and .ci/run; a no-op when none runs.
    subprocess.run(
        ["bash", "scripts/downloads.sh", "wait", f"vllm-{RELEASE}"], cwd=REPO, check=True
    )
    return drift.download(RELEASE, REPO / ".cache" / "wheels")


def test_the_page_cites_where_0_34_0_defines_each_name_and_real_lines():
    text = PAGE.read_text()
    sources = drift.Sources.of_wheel(_wheel())
    table = text.split("## The names", 1)[1]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", table, re.MULTILINE)
    assert len(rows) == len(v2_runner_data.V2_RUNNER_NAMES), rows
    module_of = {qualname: module for module, qualname in v2_runner_data.V2_RUNNER_NAMES}
    for qualname, cited in rows:
        found = drift.find(sources, module_of[qualname], qualname)
        assert found.node is not None, (qualname, found)
        assert cited == f"{found.path}:{found.node.lineno}", (qualname, cited)
    # Every other citation (e.g. `:45` after a file) is a line of its file.
    for path, line in CITATION.findall(text):
        module = path.removesuffix(".py").replace("/", ".")
        loaded = sources.module(module)
        assert loaded is not None, path
        assert int(line) <= len(loaded[0].splitlines()), (path, line)
