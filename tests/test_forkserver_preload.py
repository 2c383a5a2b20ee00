"""A job forked from the session's fork server starts with the workers' modules
imported and the imported heap frozen (fixtures/forkserver_preload.py): what
halves a tiny engine job's time (docs/testing.md); and its ``gc.collect()``
collects nothing unless its environment asks for it (PPSPEC_FORCED_GC=1). In
the e2e run, where the session's fork server is already up."""

from __future__ import annotations

import json
import os

import pytest

from vllm_ppspec_tools.fixtures import forkserver
from vllm_ppspec_tools.fixtures.forkserver_preload import WORKER_PRELOAD

pytestmark = pytest.mark.e2e


def _probe(tmp_path, **env: str) -> dict:
    log = tmp_path / "log"
    job = forkserver.start("tests.forkserver_probe", ["probe"], str(log), {**os.environ, **env})
    assert job.wait(60) == 0, log.read_text()[-3000:]
    return json.loads(log.read_text().strip().splitlines()[-1])


def test_a_forked_job_starts_with_the_worker_modules_and_a_frozen_heap(tmp_path):
    seen = _probe(tmp_path)
    # 0.32 and 0.33 have every worker module (0.34 has no V1 runner: no engine runs there).
    assert seen["imported"] == list(WORKER_PRELOAD), seen
    # The imported modules' objects: hundreds of thousands (about 700,000 here); a child
    # of an unfrozen server starts with none frozen.
    assert seen["frozen"] > 500_000, seen


@pytest.mark.parametrize(("forced", "collected"), [(None, False), ("1", True)])
def test_a_forked_job_skips_forced_collections_unless_asked(
    tmp_path, monkeypatch, forced, collected
):
    """vLLM's ``gc.collect()`` calls (start-up, each worker's clean-up,
    shutdown) collect nothing in a forked job: a reference cycle made in the
    child survives the call. With ``PPSPEC_FORCED_GC=1`` the call frees it."""
    monkeypatch.delenv("PPSPEC_FORCED_GC", raising=False)
    seen = _probe(tmp_path, **({"PPSPEC_FORCED_GC": forced} if forced else {}))
    assert seen["forced_collection"] is collected, seen
