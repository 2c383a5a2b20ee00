"""The draft model on the first stage, without an engine (runner/drafter/first_stage.py).

Where it runs (policy.drafter_placement), the drafts' wire format, where they
are written, and the drafter's catch-up: which tokens each call gets, at which
positions and slots, for a prefill chunk, a first decode step, a round with
every draft accepted and one with a rejection. A stand-in drafter records its
calls; the engine tests (test_e2e_drafter_first.py) run the real one.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_ppspec.choice import policy
from vllm_ppspec.protocol import draft_tensor as wire
from vllm_ppspec.runner.drafter import first_stage as fs


@pytest.mark.parametrize(
    "env,method,parallel,sync,dp,why",
    [
        (None, "draft_model", False, True, 1, None),  # unset: auto, the cost model next
        ("", "draft_model", False, True, 1, None),
        ("last", "draft_model", False, True, 1, "VLLM_PPSPEC_DRAFTER_STAGE=last"),
        ("first", "draft_model", False, True, 1, None),
        ("First ", "draft_model", False, True, 1, None),
        ("auto", "draft_model", False, True, 1, None),  # the plan asks the cost model next
        ("auto", "eagle3", False, True, 1, "only a draft model"),
        (None, "eagle3", False, True, 1, "only a draft model"),
        (None, "draft_model", False, False, 1, "async scheduling"),
        (None, "draft_model", False, True, 2, "data parallelism"),
        ("first", "eagle3", False, True, 1, "only a draft model"),
        ("first", "draft_model", True, True, 1, "only a draft model"),
        ("first", "draft_model", False, False, 1, "async scheduling"),
        ("first", "draft_model", False, True, 2, "data parallelism"),
    ],
)
def test_where_the_drafter_runs(monkeypatch, env, method, parallel, sync, dp, why):
    if env is None:
        monkeypatch.delenv(policy.DRAFTER_STAGE_ENV, raising=False)
    else:
        monkeypatch.setenv(policy.DRAFTER_STAGE_ENV, env)
    got = policy.drafter_placement(method, parallel, sync, dp)
    assert got is None if why is None else why in got


def test_a_bad_stage_names_the_variable(monkeypatch):
    monkeypatch.setenv(policy.DRAFTER_STAGE_ENV, "middle")
    with pytest.raises(ValueError, match="VLLM_PPSPEC_DRAFTER_STAGE='middle'.*first, last, auto"):
        policy.drafter_placement("draft_model", False, True, 1)


def test_drafts_travel_padded_and_come_back_by_request():
    sent = wire.encode({"a": [5, 6, 7], "b": [8]}, 3)
    assert sent.tolist() == [2, 3, 5, 6, 7, 8, -1, -1]
    assert wire.decode(sent, ["a", "b"]) == {"a": [5, 6, 7], "b": [8]}
    assert wire.encode({}, 3).tolist() == [0, 3]  # never empty: a tensor dict drops those
    with pytest.raises(RuntimeError, match="drafted for 2 requests, this step has 1"):
        wire.decode(sent, ["a"])
    assert wire.with_slots({"a": [0, 0], "b": [], "c": [0]}) == ["a", "c"]


def test_the_drafts_never_go_through_the_tp_all_gather():
    """vLLM's PP send slices a tensor for the TP group's all-gather where vLLM's
    own rule (``GroupCoordinator._should_use_all_gather``, called here as it
    is) says so; the receiver then all-gathers it over the TP group's device
    communicator, which takes no CPU tensor on CUDA. The drafts' length never
    lets it, whatever the TP size, the number of requests and K; at TP = 1
    nothing is padded."""
    from vllm.distributed.parallel_state import GroupCoordinator

    def sliced(tensor: torch.Tensor, tp: int) -> bool:
        group = SimpleNamespace(world_size=tp)
        should = GroupCoordinator._should_use_all_gather
        return should(None, wire.KEY, tensor.numel(), group, None)  # type: ignore[arg-type]

    for tp in range(2, 9):
        for n in range(0, 20):
            for k in range(1, 9):
                drafts = {str(i): [7] * k for i in range(n)}
                sent = wire.encode(drafts, k, tp)
                assert not sliced(sent, tp), (tp, n, k)
                assert wire.decode(sent, list(drafts)) == drafts
    assert wire.encode({"a": [5, 6]}, 2).tolist() == [1, 2, 5, 6]  # TP = 1: as it was
    assert wire.encode({"a": [5, 6]}, 2, tp=2).tolist() == [1, 2, 5, 6, -1]
    # The planted break: unpadded, TP = 2 and K = 2 always slices.
    assert sliced(wire.encode({"a": [5, 6]}, 2), 2)


def _batch(rows: dict[str, list[int]], computed: dict[str, int], block_size: int = 4):
    """An input batch of ``rows`` (token ids); row i's j-th block is 10 * i + 2 * j + 3."""
    width = 64
    tokens = np.zeros((len(rows), width), dtype=np.int32)
    for i, ids in enumerate(rows.values()):
        tokens[i, : len(ids)] = ids
    blocks = np.array(
        [[10 * i + 2 * j + 3 for j in range(width // block_size)] for i in range(len(rows))]
    )
    table = SimpleNamespace(block_size=block_size, get_numpy_array=lambda: blocks)
    return SimpleNamespace(
        req_id_to_index={r: i for i, r in enumerate(rows)},
        token_ids_cpu=tokens,
        num_tokens_no_spec=np.array([len(ids) for ids in rows.values()]),
        num_computed_tokens_cpu=np.array([computed[r] for r in rows]),
        spec_token_ids=[[] for _ in rows],
        block_table=[table],
    )


class StandInDrafter:
    kv_cache_gid = 0

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def propose(self, k, token_ids, positions, hidden, next_ids, sample_at, cad, sampling):
        assert hidden is None and sample_at is None and sampling.all_greedy
        self.calls.append(
            {
                "k": k,
                "tokens": token_ids.tolist(),
                "positions": positions.tolist(),
                "next": next_ids.tolist(),
                "query_start": cad.query_start_loc_cpu.tolist(),
                "seq_lens": cad.seq_lens.tolist(),
                "slots": cad.slot_mapping.tolist(),
            }
        )
        return torch.tensor([[100 + i * 10 + j for j in range(k)] for i in range(len(next_ids))])


def _runner(batch, limit: int = 512):
    """``limit``: the drafter's length limit (vLLM's effective_drafter_max_model_len)."""
    return SimpleNamespace(
        drafter=StandInDrafter(),
        input_batch=batch,
        device="cpu",
        num_spec_tokens=3,
        effective_drafter_max_model_len=limit,
    )


def _step(scheduled: dict[str, int], spec: dict[str, list[int]], finished=()):
    return SimpleNamespace(
        num_scheduled_tokens=scheduled,
        scheduled_spec_decode_tokens=spec,
        finished_req_ids=set(finished),
        total_num_scheduled_tokens=sum(scheduled.values()),
    )


def test_a_prefill_chunk_fills_the_drafters_cache_without_drafting():
    prompt = [1, 2, 3, 4, 5, 6]
    runner = _runner(_batch({"p": prompt}, {"p": 0}))
    catch_up = fs.DraftCatchUp(runner)
    assert catch_up.step(_step({"p": 6}, {})) == {}
    (call,) = runner.drafter.calls
    # Positions 0..4 as the target's tokens, position 5 as the next: all six in the cache.
    assert call["k"] == 0 and call["tokens"] == [1, 2, 3, 4, 5] and call["next"] == [6]
    assert call["positions"] == [0, 1, 2, 3, 4] and call["seq_lens"] == [5]
    # Blocks 3 and 5 of 4 slots: positions 0-3 in block 3, position 4 in block 5.
    assert call["slots"] == [12, 13, 14, 15, 20]
    assert catch_up.valid == {"p": 6}


def test_decode_rounds_draft_from_the_last_token_and_catch_up_what_was_accepted():
    # Prompt of 6, first token 7 sampled: the scheduler sends [7] + 3 slots.
    batch = _batch({"r": [1, 2, 3, 4, 5, 6, 7]}, {"r": 6})
    runner = _runner(batch)
    catch_up = fs.DraftCatchUp(runner)
    catch_up.valid["r"] = 6  # the prompt went in with the prefill
    spec = {"r": [0, 0, 0]}
    drafts = catch_up.step(_step({"r": 4}, spec))
    assert drafts == {"r": [100, 101, 102]}
    call = runner.drafter.calls[-1]
    # At least the token before the last one (position 5), and 7 at position 6.
    assert call["k"] == 3 and call["tokens"] == [6] and call["positions"] == [5]
    assert call["next"] == [7] and call["seq_lens"] == [6]
    fs.write_drafts(SimpleNamespace(input_batch=batch), drafts, spec)
    assert batch.token_ids_cpu[0, 7:10].tolist() == [100, 101, 102]
    assert batch.spec_token_ids[0] == [100, 101, 102]

    # Every draft accepted, bonus 55 at position 10. vLLM's _update_states on a
    # non-last rank fills positions 7..10 with the one new token: the first
    # stage puts its accepted drafts back, and catches up the third (never fed).
    batch.token_ids_cpu[0, 7:11] = 55
    batch.num_computed_tokens_cpu[0] = 10
    batch.num_tokens_no_spec[0] = 11
    catch_up.step(_step({"r": 4}, spec))
    assert batch.token_ids_cpu[0, 7:11].tolist() == [100, 101, 102, 55]
    call = runner.drafter.calls[-1]
    assert call["tokens"] == [102] and call["positions"] == [9] and call["next"] == [55]

    # One draft accepted (120), then 66 at position 12: the rejected draft's
    # cache entry (position 12) is overwritten by the pass over 66.
    batch.token_ids_cpu[0, 11:13] = 66
    batch.num_computed_tokens_cpu[0] = 12
    batch.num_tokens_no_spec[0] = 13
    catch_up.step(_step({"r": 4}, spec))
    assert batch.token_ids_cpu[0, 11:13].tolist() == [100, 66]  # 100: its accepted draft
    call = runner.drafter.calls[-1]
    assert call["tokens"] == [100] and call["positions"] == [11] and call["next"] == [66]


def test_rounds_without_draft_slots_keep_the_drafters_cache_filled():
    """K = 0 for a while (a K schedule, a grammar): each such step passes the new
    token through the drafter with K = 0, so the next drafting round needs only
    its own last token (a stale bound would leave positions out)."""
    batch = _batch({"r": [1, 2, 3, 4, 5, 6, 7]}, {"r": 6})
    runner = _runner(batch)
    catch_up = fs.DraftCatchUp(runner)
    catch_up.valid["r"] = 6
    catch_up.step(_step({"r": 4}, {"r": [0, 0, 0]}))  # drafts 100, 101, 102 from position 6
    # Nothing accepted: 8 at position 7, then two steps without slots (9 at 8, 10 at 9).
    for computed, token in ((7, 8), (8, 9), (9, 10)):
        batch.token_ids_cpu[0, computed] = token
        batch.num_computed_tokens_cpu[0] = computed
        batch.num_tokens_no_spec[0] = computed + 1
        assert catch_up.step(_step({"r": 1}, {})) == {}
        call = runner.drafter.calls[-1]
        assert call["k"] == 0 and call["next"] == [token] and call["positions"] == [computed - 1]
        assert catch_up.valid["r"] == computed + 1
    batch.token_ids_cpu[0, 10] = 11
    batch.num_computed_tokens_cpu[0] = 10
    batch.num_tokens_no_spec[0] = 11
    catch_up.step(_step({"r": 4}, {"r": [0, 0, 0]}))
    call = runner.drafter.calls[-1]
    assert call["k"] == 3 and call["tokens"] == [10] and call["next"] == [11]


def test_finished_requests_are_forgotten():
    batch = _batch({"r": [1, 2, 3, 4]}, {"r": 3})
    catch_up = fs.DraftCatchUp(_runner(batch))
    catch_up.step(_step({"r": 3}, {"r": [0, 0]}))
    assert "r" in catch_up.valid and "r" in catch_up.drafted
    catch_up.forget({"r"})
    assert catch_up.valid == {} and catch_up.drafted == {}


def test_a_draft_count_that_differs_from_the_slots_is_refused():
    batch = _batch({"r": [1, 2, 3]}, {"r": 2})
    with pytest.raises(RuntimeError, match="2 drafts for request r, it has 3 draft slots"):
        fs.write_drafts(SimpleNamespace(input_batch=batch), {"r": [1, 2]}, {"r": [0, 0, 0]})


def test_the_last_ranks_placeholders_are_as_many_as_the_scheduler_chose():
    """vLLM's zero drafts are K wide; a K schedule (or adaptive K) chose the
    step's K, which vLLM's own drafter would have drafted: the slots follow it."""
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

    from vllm_ppspec.runner.steps.sync import DeliverDrafts
    from vllm_ppspec.sched.draft_delivery import attached_drafts, placeholders_attached

    for k, want in ((1, [[0], [0]]), (0, [[], []]), (3, [[0, 0, 0], [0, 0, 0]])):
        view = SimpleNamespace(take_drafts=lambda: DraftTokenIds(["a", "b"], [[0, 0, 0]] * 2))
        state = SimpleNamespace(scheduler_output=SimpleNamespace(num_spec_tokens_to_schedule=k))
        out = ModelRunnerOutput(req_ids=["a", "b"], req_id_to_index={"a": 0, "b": 1})
        DeliverDrafts(placeholders=True).after_sample(view, state, out)
        assert attached_drafts(out).draft_token_ids == want and placeholders_attached(out)


def test_one_reading_of_the_config_for_the_split_and_the_runner(monkeypatch):
    """policy.drafter_placement_of: async scheduling and the external launcher (the
    EXTERNAL mode, whose runner keeps the drafter last) both count as not sync."""
    monkeypatch.setenv(policy.DRAFTER_STAGE_ENV, "first")

    def config(async_scheduling=False, backend="mp", dp=1, method="draft_model"):
        return SimpleNamespace(
            speculative_config=SimpleNamespace(method=method, parallel_drafting=False),
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
            parallel_config=SimpleNamespace(
                distributed_executor_backend=backend, data_parallel_size=dp
            ),
        )

    assert policy.drafter_placement_of(config()) is None
    assert "async scheduling" in policy.drafter_placement_of(config(async_scheduling=True))
    assert "async scheduling" in policy.drafter_placement_of(config(backend="external_launcher"))
    assert "data parallelism" in policy.drafter_placement_of(config(dp=2))
    assert "only a draft model" in policy.drafter_placement_of(config(method="eagle3"))


def test_past_the_drafters_length_limit_the_batch_drafts_zeros_and_catches_up_later():
    """vLLM at PP = 1 (``GPUModelRunner._input_fits_in_drafter``): where the
    batch's longest sequence plus K passes the drafter's max model length, no
    drafter pass runs and every request drafts zeros. The first stage does the
    same, keeps the drafter's cache bound where it was, and still puts back the
    accepted drafts; once the batch fits again it catches up from that bound."""
    batch = _batch({"r": [1, 2, 3, 4, 5, 6, 7], "s": [9, 8, 7]}, {"r": 6, "s": 2})
    runner = _runner(batch, limit=12)
    catch_up = fs.DraftCatchUp(runner)
    catch_up.valid.update(r=6, s=2)
    spec = {"r": [0, 0, 0], "s": [0, 0, 0]}
    # r: 6 computed + 4 scheduled = 10, + K = 13 > 12: nothing fits.
    assert not catch_up.fits(_step({"r": 4, "s": 4}, spec))
    assert catch_up.step(_step({"r": 4, "s": 4}, spec)) == {"r": [0, 0, 0], "s": [0, 0, 0]}
    assert runner.drafter.calls == []
    assert catch_up.valid == {"r": 6, "s": 2}
    # Within the limit: the same step drafts, from the bound it kept.
    runner.effective_drafter_max_model_len = 13
    drafts = catch_up.step(_step({"r": 4, "s": 4}, spec))
    assert drafts == {"r": [100, 101, 102], "s": [110, 111, 112]}
    (call,) = runner.drafter.calls
    assert call["positions"] == [5, 1] and call["next"] == [7, 7]


def test_zero_drafts_accepted_past_the_limit_are_put_back():
    batch = _batch({"r": [1, 2, 3, 4, 5, 6, 7]}, {"r": 6})
    runner = _runner(batch, limit=12)
    catch_up = fs.DraftCatchUp(runner)
    spec = {"r": [0, 0, 0]}
    assert catch_up.step(_step({"r": 4}, spec)) == {"r": [0, 0, 0]}
    # Two zeros accepted, then 55 at position 9; vLLM wrote 55 over 7..9.
    batch.token_ids_cpu[0, 7:10] = 55
    batch.num_computed_tokens_cpu[0] = 9
    catch_up.step(_step({"r": 1}, {}))
    assert batch.token_ids_cpu[0, 7:10].tolist() == [0, 0, 55]


def test_a_one_token_prompt_given_draft_slots_before_its_first_pass_drafts_zeros():
    """Across two hosts the scheduler can give a one-token prompt draft slots at
    its first step (computed 0, 1 token + 3 slots): with no token before the
    last one there is nothing to draft from, so zeros (rejected, lossless) and
    no pass; the next step catches the drafter's cache up from position 0.
    Before, the request had slots and no drafts: a KeyError ended the engine."""
    batch = _batch({"one": [444]}, {"one": 0})
    runner = _runner(batch)
    catch_up = fs.DraftCatchUp(runner)
    assert catch_up.step(_step({"one": 4}, {"one": [0, 0, 0]})) == {"one": [0, 0, 0]}
    assert runner.drafter.calls == [] and catch_up.valid == {"one": 0}
