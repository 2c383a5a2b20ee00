"""The plugin scheduler applies a batch's drafts only where they belong."""

from __future__ import annotations

from types import SimpleNamespace

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import RequestStatus

from vllm_ppspec.sched.draft_delivery import attach_drafts, attached_drafts
from vllm_ppspec.sched.filled import PPSpecScheduler


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


def _running_scheduler(depth: int, in_flight: list[int]):
    sched = object.__new__(PPSpecScheduler)
    sched.ppspec_depth = depth
    sched.running = [
        SimpleNamespace(request_id=f"r{i}", num_in_flight_tokens=n) for i, n in enumerate(in_flight)
    ]
    sched.max_num_running_reqs = sched.max_num_active_reqs = 16
    return sched


def test_each_batch_takes_its_share_of_the_idle_requests():
    # 8 running, 2 stages: at most 4 per batch; the first batch takes r0-r3.
    sched = _running_scheduler(2, [0] * 8)
    assert [r.request_id for r in sched.held_back()] == ["r4", "r5", "r6", "r7"]
    # r0-r3 in flight: the next batch takes the 4 idle ones, holds none.
    sched = _running_scheduler(2, [4, 4, 4, 4, 0, 0, 0, 0])
    assert sched.held_back() == []
    # One batch in flight (VLLM_PPSPEC_ONE_BATCH=1): vLLM's behaviour.
    assert _running_scheduler(1, [0] * 8).held_back() == []


def test_held_requests_sit_out_one_schedule_call_and_return_in_place(monkeypatch):
    seen = {}

    def fake_schedule(self, *args, **kwargs):
        seen["running"] = [r.request_id for r in self.running]
        seen["limits"] = (self.max_num_running_reqs, self.max_num_active_reqs)
        self.running.remove(self.running[1])  # vLLM preempts r1 ...
        self.running.append(SimpleNamespace(request_id="new", num_in_flight_tokens=0))
        return "output"  # ... and admits a new request

    monkeypatch.setattr(Scheduler, "schedule", fake_schedule)
    sched = _running_scheduler(2, [0] * 6)
    held = sched.held_back()
    assert sched._schedule_without(held) == "output"
    assert seen["running"] == ["r0", "r1", "r2"]
    assert seen["limits"] == (13, 13)  # no extra admission while 3 sit out
    assert (sched.max_num_running_reqs, sched.max_num_active_reqs) == (16, 16)
    assert [r.request_id for r in sched.running] == ["r0", "r2", "r3", "r4", "r5", "new"]


def _lane_scheduler(lanes: int, lane_of: dict, waiting: int = 0, structured=()):
    from vllm_ppspec.sched.lanes import PPSpecLaneScheduler

    sched = object.__new__(PPSpecLaneScheduler)
    sched.ppspec_lanes = lanes
    sched.ppspec_lane_of = dict(lane_of)
    sched.running = [
        SimpleNamespace(
            request_id=r,
            use_structured_output=r in structured,
            num_output_placeholders=4 if r in structured else 0,
        )
        for r in lane_of
    ]
    sched.waiting = [SimpleNamespace(request_id=f"w{i}") for i in range(waiting)]
    return sched


def test_a_lane_step_holds_the_other_lanes_and_admits_its_share():
    sched = _lane_scheduler(2, {"a": 0, "b": 1, "c": 0, "d": 1})
    held, admit = sched.lane_split(0)
    assert [r.request_id for r in held] == ["b", "d"]
    assert admit == 0  # lane 0 has its share (2 of 4)
    # 2 running ("a" in lane 0), 6 waiting: each lane's share is ceil(8 / 2) = 4.
    sched = _lane_scheduler(2, {"a": 0, "b": 1}, waiting=6)
    held, admit = sched.lane_split(0)
    assert [r.request_id for r in held] == ["b"] and admit == 3
    # PP=3, an empty lane: it takes a third of everything.
    sched = _lane_scheduler(3, {"a": 0, "b": 0, "c": 1}, waiting=6)
    held, admit = sched.lane_split(2)
    assert len(held) == 3 and admit == 3


def test_structured_output_requests_wait_for_their_previous_output():
    # "s" is in lane 0 with an unprocessed round: the engine core would build
    # its grammar bitmask without that round's tokens, so it sits out.
    sched = _lane_scheduler(2, {"a": 0, "s": 0}, structured={"s"})
    held, _ = sched.lane_split(0)
    assert [r.request_id for r in held] == ["s"]


def test_admission_cap_shrinks_the_request_limits_for_one_call(monkeypatch):
    from vllm_ppspec.sched.filled import schedule_without

    seen = {}

    def fake_schedule():
        seen["limits"] = (sched.max_num_running_reqs, sched.max_num_active_reqs)
        return "output"

    sched = _running_scheduler(2, [0] * 4)
    held = sched.running[2:]
    # 2 run in this lane, 2 held: room for 12 more, capped at 3 admissions.
    assert schedule_without(sched, fake_schedule, held, 3) == "output"
    assert seen["limits"] == (5, 5)
    assert (sched.max_num_running_reqs, sched.max_num_active_reqs) == (16, 16)
    assert [r.request_id for r in sched.running] == ["r0", "r1", "r2", "r3"]


def test_batches_in_flight_logs_each_new_maximum(caplog):
    import logging

    from vllm_ppspec.sched.filled import BatchesInFlight

    batches = BatchesInFlight()
    full, empty = (SimpleNamespace(total_num_scheduled_tokens=n) for n in (4, 0))
    with caplog.at_level(logging.INFO, logger="vllm.ppspec"):
        for event in ("scheduled", "scheduled", "processed", "scheduled", "scheduled"):
            getattr(batches, event)(full)
        batches.scheduled(empty)  # an empty step is not a batch in flight
    assert (batches.now, batches.most) == (3, 3)
    said = [r.getMessage() for r in caplog.records if "batches in flight" in r.getMessage()]
    assert said == [f"vllm-ppspec: {n} batches in flight" for n in (1, 2, 3)]


def test_placeholder_slots_skip_requests_a_grammar_checks(monkeypatch):
    """With the draft model on the first stage the last rank's drafts are
    placeholder slots (runner/drafter/first_stage.py): a grammar cannot check
    them, so a structured-output request gets none; real drafts go to both."""
    applied: list[DraftTokenIds] = []
    monkeypatch.setattr(Scheduler, "update_draft_token_ids", lambda self, d: applied.append(d))
    sched = object.__new__(PPSpecScheduler)
    sched.requests = {
        "plain": SimpleNamespace(**vars(_request()), use_structured_output=False),
        "json": SimpleNamespace(**vars(_request()), use_structured_output=True),
    }
    batch = SimpleNamespace(num_scheduled_tokens={"plain": 4, "json": 4})
    drafts = DraftTokenIds(["plain", "json"], [[0, 0, 0], [0, 0, 0]])
    sched._ppspec_apply_drafts(drafts, batch, stale=set(), placeholders=True)
    sched._ppspec_apply_drafts(drafts, batch, stale=set(), placeholders=False)
    assert [d.req_ids for d in applied] == [["plain"], ["plain", "json"]]


def test_placeholders_are_marked_on_the_output_through_pickle():
    import pickle

    from vllm.v1.outputs import ModelRunnerOutput

    from vllm_ppspec.sched.draft_delivery import placeholders_attached

    out = ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0}, sampled_token_ids=[[7]])
    attach_drafts(out, DraftTokenIds(["a"], [[0, 0, 0]]), placeholders=True)
    back = pickle.loads(pickle.dumps(out))
    assert placeholders_attached(back) and attached_drafts(back).draft_token_ids == [[0, 0, 0]]
    plain = ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0}, sampled_token_ids=[[7]])
    attach_drafts(plain, DraftTokenIds(["a"], [[1, 2, 3]]))
    assert not placeholders_attached(pickle.loads(pickle.dumps(plain)))
