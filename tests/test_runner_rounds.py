"""The runner mixin's round hand-off between two real vLLM PP ranks (gloo, CPU).

Runner objects are created without running GPUModelRunner.__init__ and given
just the state the tested methods read; the PP group is vLLM's own
(``initialize_model_parallel(pipeline_model_parallel_size=2)``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.distributed import run_ranks

K = 3
CAPACITY = 8  # max_num_seqs of the stub runners


def _stub_runner(rank: int, world: int, spec: bool, num_reqs: int):
    from vllm_ppspec.runner.cpu_runner import PPSpecCPUModelRunner

    runner = object.__new__(PPSpecCPUModelRunner)
    runner.speculative_config = SimpleNamespace(method="draft_model") if spec else None
    runner.num_spec_tokens = K if spec else 0
    if spec:
        from vllm_ppspec.choice.policy import Mode
        from vllm_ppspec.runner.steps.base import ActiveSteps

        runner._ppspec_steps = ActiveSteps(Mode.SYNC, [], hides_drafter=rank < world - 1)
    runner.device = torch.device("cpu")
    runner.use_async_scheduling = True
    runner.broadcast_pp_output = False
    runner.execute_model_state = None
    runner.kv_connector_output = None
    runner._pp_recv_work = None
    req_ids = [f"r{i}" for i in range(num_reqs)]
    runner.requests = {r: SimpleNamespace(output_token_ids=[]) for r in req_ids}
    runner.input_batch = SimpleNamespace(
        num_reqs=num_reqs,
        req_ids=req_ids,
        num_tokens_no_spec=np.full(num_reqs, 4, dtype=np.int32),
        is_token_ids=np.zeros((num_reqs, 16), dtype=bool),
        prev_sampled_token_ids=None,
        prev_req_id_to_index=None,
    )
    runner.discard_request_mask = SimpleNamespace(np=np.zeros(num_reqs, dtype=bool))
    return runner


def test_missing_rows_raise_on_a_non_last_rank():
    """Lanes: a non-last rank's sample_tokens needs the rows its execute_model
    recorded; without them it raises naming the rank, before posting its receive."""
    from vllm_ppspec.runner.clocks import Clocks
    from vllm_ppspec.runner.health.rank_errors import MissingRowsError
    from vllm_ppspec.runner.steps.base import StepState
    from vllm_ppspec.runner.steps.lanes import LaneReceiver

    channel = SimpleNamespace(expect=lambda n: pytest.fail("posted a receive"))
    receiver = LaneReceiver(channel, Clocks(), 2, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(MissingRowsError, match="PP rank 0: sample_tokens was called without"):
        receiver.after_sample(None, StepState(0, None), "vllm's output")  # type: ignore[arg-type]


def test_a_receiver_takes_the_round_that_is_due_from_its_pre_seeded_queue():
    """PP rank r of PP waits, at the start of step s, for the round of step
    s - (PP - r): its queue starts with PP - r empty entries, one entry per step."""
    from vllm_ppspec.runner.clocks import Clocks
    from vllm_ppspec.runner.steps.lanes import LaneReceiver, LaneRows

    received: list[int] = []
    receiver = LaneReceiver(SimpleNamespace(), Clocks(), 2, 0, 0)  # type: ignore[arg-type]
    receiver.receive = lambda rows: received.append(rows.step)  # type: ignore[method-assign]
    never_missing = SimpleNamespace(missing=lambda *a: False)
    receiver.book = never_missing  # type: ignore[assignment]
    for step in range(5):
        receiver.settle(receiver.queue.popleft(), None, None)
        receiver.queue.append(LaneRows(step, [], None, {}))
    assert received == [0, 1, 2]  # steps 2, 3, 4 each took the round of two steps before


def _plain_path(rank: int, world: int):
    from vllm.distributed.parallel_state import get_pp_group

    pp = get_pp_group()
    runner = _stub_runner(rank, world, spec=False, num_reqs=3)
    if pp.is_last_rank:
        # Without a speculative config the mixin defers to vLLM's own
        # [num_reqs, 1] device-group broadcast.
        runner._pp_broadcast_prev_sampled_token_ids(
            torch.tensor([[11], [12], [13]], dtype=torch.int32)
        )
        return None
    runner.sample_tokens(None)
    assert runner._pp_recv_work is not None
    runner._pp_recv_work.wait()
    return (
        runner.input_batch.prev_sampled_token_ids.tolist(),
        runner.input_batch.num_tokens_no_spec.tolist(),
        sorted(runner.input_batch.prev_req_id_to_index.items()),
    )


def test_non_speculative_path_is_vllms_own():
    results = run_ranks(_plain_path, vllm_groups=True, timeout=90)
    for r in results:
        assert r.error is None and not r.hung, r.message
    prev, num_tokens, index = results[0].value
    assert prev == [[11], [12], [13]]
    assert num_tokens == [5, 5, 5]
    assert index == [("r0", 0), ("r1", 1), ("r2", 2)]


def _spec_suppresses_upstream_broadcast(rank: int, world: int):
    from vllm.distributed.parallel_state import get_pp_group

    pp = get_pp_group()
    runner = _stub_runner(rank, world, spec=True, num_reqs=2)
    if pp.is_last_rank:
        # vLLM would assert on a [num_reqs, k+1] tensor and broadcast it on the
        # device group; the mixin leaves that to the round transport.
        runner._pp_broadcast_prev_sampled_token_ids(torch.ones((2, K + 1), dtype=torch.int32))
    torch.distributed.barrier(group=pp.cpu_group)
    return "ok"


def test_spec_round_does_not_use_vllms_device_group_broadcast():
    results = run_ranks(_spec_suppresses_upstream_broadcast, vllm_groups=True, timeout=90)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert r.value == "ok"


def _sync_runner():
    from vllm_ppspec.runner.view import RunnerView

    runner = SimpleNamespace(num_accepted_tokens_event=None)
    runner.requests = {
        r: SimpleNamespace(num_computed_tokens=10, num_prompt_tokens=8, output_token_ids=[])
        for r in ("a", "b", "c")
    }
    runner.input_batch = SimpleNamespace(
        req_id_to_index={}, num_accepted_tokens_cpu=np.ones(8, dtype=np.int32)
    )
    return RunnerView(runner)


def _sync_steps(is_last: bool, skip: bool):
    """A hybrid model's sync steps on one rank, as the runner's set-up builds them."""
    from vllm_ppspec.choice.policy import Mode
    from vllm_ppspec.protocol.faults import Faults
    from vllm_ppspec.runner.clocks import Clocks
    from vllm_ppspec.runner.steps.build import build_steps

    pp = SimpleNamespace(is_last_rank=is_last, world_size=2, rank_in_group=int(is_last))
    return build_steps(
        Mode.SYNC,
        pp,
        hybrid=True,
        eagle3_relay=False,
        capacity=8,
        k=K,
        fault=Faults(skip_accepted_counts=skip),
        clocks=Clocks(),
        view=None,  # type: ignore[arg-type]
    )


def _sched(cached, computed, scheduled, drafts, resumed=(), finished=(), all_tokens=None):
    return SimpleNamespace(
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=list(cached),
            num_computed_tokens=list(computed),
            resumed_req_ids=set(resumed),
            all_token_ids=all_tokens or {},
        ),
        num_scheduled_tokens=dict(scheduled),
        scheduled_spec_decode_tokens={r: [0] * n for r, n in drafts.items()},
        finished_req_ids=set(finished),
    )


def _accepted_counts_after_rejoin(skip: bool) -> list[int]:
    runner, steps = _sync_runner(), _sync_steps(is_last=False, skip=skip)
    # Round 1: a, b, c at 10 computed tokens, each 1 token + 3 drafts.
    steps.after_update(
        runner, _sched("abc", [10] * 3, {r: 4 for r in "abc"}, {r: 3 for r in "abc"})
    )
    # They re-join the batch (vLLM resets their rows to 1). The scheduler
    # rolled back rejections: 3, 1 and 0 drafts accepted; c was resumed.
    runner.input_batch.req_id_to_index = {"c": 0, "a": 1, "b": 2}
    steps.after_update(runner, _sched("abc", [14, 12, 0], {r: 4 for r in "abc"}, {}, resumed="c"))
    return runner.input_batch.num_accepted_tokens_cpu[:3].tolist()


def test_sync_accepted_counts_are_rebuilt_by_request_when_requests_rejoin():
    assert _accepted_counts_after_rejoin(skip=False) == [1, 4, 2]  # c, a, b


def test_without_the_rebuild_rejoined_rows_keep_vllms_reset_counts():
    assert _accepted_counts_after_rejoin(skip=True) == [1, 1, 1]


def test_rejoining_request_gets_its_full_token_list_on_a_non_last_rank():
    runner, steps = _sync_runner(), _sync_steps(is_last=False, skip=False)
    # vLLM's own update left "a" with only the last sampled token of each round.
    runner.requests["a"].output_token_ids = [100, 104]
    all_tokens = {"a": list(range(8)) + [100, 101, 102, 103, 104, 105]}
    steps.before_update(runner, _sched("ab", [13, 10], {"a": 4, "b": 1}, {}, all_tokens=all_tokens))
    # Up to the computed tokens; vLLM then appends the newest one (105).
    assert runner.requests["a"].output_token_ids == [100, 101, 102, 103, 104]
    assert runner.requests["b"].output_token_ids == []  # stayed in the batch: untouched


def test_each_rank_and_mode_gets_its_own_parts():
    from vllm_ppspec.runner.steps.hybrid import RestoreAcceptedCounts
    from vllm_ppspec.runner.steps.sync import DeliverDrafts, RestoreOutputTokens

    def kinds(steps):
        return [type(p) for p in steps.parts]

    assert kinds(_sync_steps(True, False)) == [DeliverDrafts, RestoreAcceptedCounts]
    assert kinds(_sync_steps(False, False)) == [RestoreOutputTokens, RestoreAcceptedCounts]
    assert kinds(_sync_steps(False, True)) == [RestoreOutputTokens]  # the fault: no rebuild
    assert kinds(_sync_steps(True, True)) == [DeliverDrafts, RestoreAcceptedCounts]


class _UpstreamRunner:
    """Stands in for GPUModelRunner's execute_model on a non-last rank: it
    returns the intermediate tensors."""

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        from vllm.sequence import IntermediateTensors

        return IntermediateTensors({})


def test_every_step_reaches_the_modes_hooks_and_is_counted():
    """The mixin holds no mode: each step calls the steps object's hooks, with
    one record per step and one counter."""
    from vllm_ppspec.choice.policy import Mode
    from vllm_ppspec.runner.mixin import PPSpecRunnerMixin
    from vllm_ppspec.runner.steps.base import ActiveSteps, Part

    calls: list[tuple[str, int]] = []

    class Recording(Part):
        def before_execute(self, view, state):
            calls.append(("before_execute", state.index))

        def after_forward(self, view, state, output, received):
            calls.append(("after_forward", state.index))

    class Runner(PPSpecRunnerMixin, _UpstreamRunner):
        pass

    runner = Runner()
    runner.speculative_config = SimpleNamespace(method="draft_model")
    runner._ppspec_steps = ActiveSteps(Mode.SYNC, [Recording()], hides_drafter=True)
    sched = SimpleNamespace(total_num_scheduled_tokens=4)
    for _ in range(3):
        runner.execute_model(sched, None)
    assert calls == [(hook, i) for i in range(3) for hook in ("before_execute", "after_forward")]
    assert runner.ppspec_clocks.steps == 3  # the bench's step count (steps with tokens)


def _set_up_runner(monkeypatch, spec: bool):
    import vllm_ppspec.runner.mixin as runner_mod

    class Runner(runner_mod.PPSpecRunnerMixin, _UpstreamRunner):
        pass

    pp = SimpleNamespace(
        world_size=2, is_first_rank=True, is_last_rank=False, rank_in_group=0, cpu_group=None
    )
    monkeypatch.setattr(runner_mod, "get_pp_group", lambda: pp)
    monkeypatch.setattr(runner_mod, "watch_pp_peers", lambda group, host: [])
    monkeypatch.setattr(runner_mod, "peer_watch_host", lambda group: "127.0.0.1")
    agreed: list[dict] = []  # the start-up check's collective (tests/test_startup_check.py)
    monkeypatch.setattr(runner_mod, "agree", lambda group, mine: agreed.append(mine))
    monkeypatch.setattr(runner_mod, "check_engine_mode", lambda config, mode: None)
    runner = Runner()
    for name in ("requests", "input_batch", "discard_request_mask", "_draft_token_ids"):
        setattr(runner, name, None)
    runner._draft_token_req_ids = None
    runner._get_draft_token_ids_cpu = lambda: ([], [])
    runner.take_draft_token_ids = lambda: None
    runner.use_async_spec_decode = False
    runner.max_num_reqs = 8
    runner.speculative_config = (
        SimpleNamespace(method="draft_model", num_speculative_tokens=K) if spec else None
    )
    runner.use_async_scheduling = False
    runner.model_config = SimpleNamespace(is_hybrid=True)
    runner.broadcast_pp_output = False
    runner.parallel_config = SimpleNamespace(nnodes=1, data_parallel_size=1, tensor_parallel_size=1)
    runner.num_spec_tokens = K if spec else 0
    runner.scheduler_config = SimpleNamespace(max_num_seqs=8)
    runner.parallel_config.pipeline_parallel_size = 2
    runner.parallel_config.worker_cls = "vllm_ppspec.worker.PPSpecWorker"
    runner.vllm_config = SimpleNamespace(  # the plan is read from it
        parallel_config=runner.parallel_config,
        speculative_config=runner.speculative_config,
        scheduler_config=SimpleNamespace(async_scheduling=False),
    )
    runner._ppspec_setup()
    # PP + spec: the start-up check ran once, with this rank's fingerprint.
    assert len(agreed) == (1 if spec else 0), agreed
    if spec:
        assert agreed[0]["mode"] == "sync" and agreed[0]["num_speculative_tokens"] == str(K)
    return runner


def test_fault_injection_switch_is_read_once_at_set_up(monkeypatch):
    """The switch decides at set-up which parts are built, and a later change of
    the env is ignored (the rank set up here is not the last)."""
    from vllm_ppspec.protocol.faults import SKIP_ACCEPTED_COUNTS
    from vllm_ppspec.runner.steps.hybrid import RestoreAcceptedCounts

    def restores(runner) -> bool:
        return any(isinstance(p, RestoreAcceptedCounts) for p in runner._ppspec_steps.parts)

    monkeypatch.setenv(SKIP_ACCEPTED_COUNTS, "1")
    runner = _set_up_runner(monkeypatch, spec=True)
    monkeypatch.delenv(SKIP_ACCEPTED_COUNTS)
    assert not restores(runner)
    assert restores(_set_up_runner(monkeypatch, spec=True))
    monkeypatch.setenv(SKIP_ACCEPTED_COUNTS, "1")
    assert not hasattr(_set_up_runner(monkeypatch, spec=False)._ppspec_steps, "parts")  # OFF


def test_overrides_call_straight_through_before_set_up():
    """vLLM's own __init__ may reach an override before _ppspec_setup ran."""
    from vllm.sequence import IntermediateTensors

    from vllm_ppspec.runner.mixin import PPSpecRunnerMixin

    class Runner(PPSpecRunnerMixin, _UpstreamRunner):
        pass

    runner = Runner()  # no _ppspec_* instance attributes yet: the class defaults
    sched = SimpleNamespace(
        scheduled_cached_reqs=SimpleNamespace(req_ids=[]), total_num_scheduled_tokens=0
    )
    assert isinstance(runner.execute_model(sched, None), IntermediateTensors)
    assert runner.ppspec_clocks.steps == 0  # an empty step is not counted


@pytest.mark.parametrize("method", ["eagle3", "dflash"])
def test_eagle3_under_pp_refuses_a_target_without_aux_hidden_states_over_pp(method):
    """vLLM's V2-runner check, called by the mixin before it sets up the relay
    (EAGLE-3 and DFlash alike)."""
    from types import SimpleNamespace

    from vllm_ppspec.runner.drafter.eagle3 import require_aux_hidden_states_over_pp

    class Decoder:  # a decoder without supports_aux_hidden_states_over_pp
        pass

    with pytest.raises(ValueError, match="does not pass auxiliary hidden states") as e:
        require_aux_hidden_states_over_pp(SimpleNamespace(model=Decoder()), method)
    assert f"does not support {method} with pipeline parallelism" in str(e.value)
    assert f"--pipeline-parallel-size 1 for {method}" in str(e.value)

    class AuxDecoder:
        supports_aux_hidden_states_over_pp = True

    require_aux_hidden_states_over_pp(SimpleNamespace(model=AuxDecoder()))


def test_vllm_marks_llama_but_not_qwen3_next_as_shipping_aux_states_over_pp():
    from vllm.model_executor.models.llama import LlamaModel
    from vllm.model_executor.models.qwen3_next import Qwen3NextModel

    assert LlamaModel.supports_aux_hidden_states_over_pp
    assert not getattr(Qwen3NextModel, "supports_aux_hidden_states_over_pp", False)


def test_the_worker_s_shutdown_reaches_the_mode_s_steps(monkeypatch):
    """StopsInOrder.shutdown: the goodbye, then the steps' shutdown hook, then vLLM's."""
    from vllm_ppspec.runner.health import orderly_stop, peer_watch

    said: list[str] = []
    monkeypatch.setattr(peer_watch, "say_goodbye", lambda: said.append("goodbye"))

    class VllmWorker:
        def shutdown(self):
            said.append("vllm")

    class Worker(orderly_stop.StopsInOrder, VllmWorker):
        pass

    worker = Worker()
    worker.model_runner = SimpleNamespace(ppspec_shutdown=lambda: said.append("steps"))
    worker.shutdown()
    assert said == ["goodbye", "steps", "vllm"]


def test_which_drafters_get_the_relayed_aux_states():
    """EAGLE-3 heads that use them, and every DFlash drafter (vLLM's V1 runner
    feeds DFlash auxiliary states whatever its config); no other method."""
    from types import SimpleNamespace

    from vllm_ppspec.runner.drafter.eagle3 import uses_aux_states

    def spec(method: str, **hf: object) -> SimpleNamespace:
        return SimpleNamespace(
            method=method, draft_model_config=SimpleNamespace(hf_config=SimpleNamespace(**hf))
        )

    assert uses_aux_states(spec("eagle3"))
    assert not uses_aux_states(spec("eagle3", eagle_config={"use_aux_hidden_state": False}))
    assert uses_aux_states(spec("dflash", dflash_config={"target_layer_ids": [0, 1]}))
    assert uses_aux_states(spec("dflash", dflash_config={"use_aux_hidden_state": False}))
    for method in ("eagle", "draft_model", "mtp", "extract_hidden_states"):
        assert not uses_aux_states(spec(method))
    assert not uses_aux_states(None)


def _vllm_appends(req: Any, computed: int, new_token_ids: list[int]) -> list[int]:
    """What vLLM's ``_update_states`` does next on a non-last rank under sync
    scheduling with PP (vllm/v1/worker/gpu_model_runner.py): append the last
    ``computed + len(new) - num_tokens`` of the scheduler's new token ids; the
    request's tokens as it re-adds them to the persistent batch."""
    num_tokens = req.num_prompt_tokens + len(req.output_token_ids)
    appended = computed + len(new_token_ids) - num_tokens
    if appended > 0:
        req.output_token_ids.extend(new_token_ids[-appended:])
    return req.output_token_ids


def test_a_preempted_request_whose_cached_prefix_ends_inside_its_prompt_rejoins_whole():
    """One batch in flight, a preemption: the request comes back with only a
    cached prefix (4 of its 8 prompt tokens) computed, and recomputes the rest
    of its prompt and its outputs. Its tokens past the prompt are the
    scheduler's, not the rank's short list (which lacks the accepted drafts)."""
    runner, steps = _sync_runner(), _sync_steps(is_last=False, skip=False)
    runner.requests["a"].output_token_ids = [100, 104]  # the short list
    all_tokens = list(range(8)) + [100, 101, 102, 103, 104, 105]
    scheduled = 10  # positions 4..13: the prompt's rest and the outputs
    steps.before_update(
        runner,
        _sched("a", [4], {"a": scheduled}, {}, resumed="a", all_tokens={"a": all_tokens}),
    )
    new = all_tokens[4 : 4 + scheduled]  # what the scheduler sends a non-last rank
    got = _vllm_appends(runner.requests["a"], 4, new)
    assert got == [100, 101, 102, 103, 104, 105], got
