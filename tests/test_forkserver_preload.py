"""A job forked from the session's fork server starts with the workers' modules
imported and the imported heap frozen (fixtures/forkserver_preload.py): what
halves a tiny engine job's time (docs/testing.md). In the e2e run, where the
session's fork server is already up."""

from __future__ import annotations

import json

import pytest

from vllm_ppspec_tools.fixtures import forkserver
from vllm_ppspec_tools.fixtures.forkserver_preload import WORKER_PRELOAD

pytestmark = pytest.mark.e2e


def test_a_forked_job_starts_with_the_worker_modules_and_a_frozen_heap(tmp_path):
    log = tmp_path / "log"
    job = forkserver.start("tests.forkserver_probe", ["probe"], str(log))
    assert job.wait(60) == 0, log.read_text()[-3000:]
    seen = json.loads(log.read_text().strip().splitlines()[-1])
    # 0.32 and 0.33 have every worker module (0.34 has no V1 runner: no engine runs there).
    assert seen["imported"] == list(WORKER_PRELOAD), seen
    # The imported modules' objects: hundreds of thousands (about 700,000 here); a child
    # of an unfrozen server starts with none frozen.
    assert seen["frozen"] > 500_000, seen
