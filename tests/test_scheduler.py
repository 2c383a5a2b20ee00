"""The plugin scheduler applies a batch's drafts only where they belong."""

from __future__ import annotations

from types import SimpleNamespace

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import RequestStatus

from vllm_ppspec.draft_delivery import attach_drafts, attached_drafts
from vllm_ppspec.scheduler import PPSpecScheduler


def _request(status=RequestStatus.RUNNING, in_flight=0):
    return SimpleNamespace(status=status, num_in_flight_tokens=in_flight)


def test_drafts_go_only_to_this_batchs_idle_running_requests(monkeypatch):
    applied: list[DraftTokenIds] = []
    monkeypatch.setattr(Scheduler, "update_draft_token_ids", lambda self, d: applied.append(d))
    sched = object.__new__(PPSpecScheduler)
    sched.requests = {
        "ok": _request(),
        "stale": _request(),
        "preempted": _request(status=RequestStatus.PREEMPTED),
        "next_chunk_in_flight": _request(in_flight=64),
        "other_batch": _request(),
    }
    batch = SimpleNamespace(
        num_scheduled_tokens={r: 4 for r in sched.requests if r != "other_batch"}
    )
    ids = list(sched.requests) + ["finished"]
    drafts = DraftTokenIds(ids, [[i, i, i] for i in range(len(ids))])
    sched._ppspec_apply_drafts(drafts, batch, stale={"stale"})
    assert len(applied) == 1
    assert applied[0].req_ids == ["ok"] and applied[0].draft_token_ids == [[0, 0, 0]]


def test_the_engines_post_step_drafts_are_ignored(monkeypatch):
    applied = []
    monkeypatch.setattr(Scheduler, "update_draft_token_ids", lambda self, d: applied.append(d))
    sched = object.__new__(PPSpecScheduler)
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[1, 2, 3]]))
    assert applied == []


def test_drafts_ride_on_the_output_through_pickle():
    import pickle

    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    out = ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0}, sampled_token_ids=[[7]])
    attach_drafts(out, DraftTokenIds(["a"], [[1, 2, 3]]))
    back = pickle.loads(pickle.dumps(out))
    assert attached_drafts(back).draft_token_ids == [[1, 2, 3]]
    assert attached_drafts(EMPTY_MODEL_RUNNER_OUTPUT) is None
    attach_drafts(EMPTY_MODEL_RUNNER_OUTPUT, None)  # nothing to attach: fine
