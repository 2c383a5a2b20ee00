"""The last rank's drafter sees a single-stage PP group while it builds and runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import vllm.distributed.parallel_state as ps

from vllm_ppspec.runner.drafter.scope import SingleStageGroupView, isolate_drafter, single_stage_pp


def _fake_pp_group(rank=5, world=3, rank_in_group=2):
    return SimpleNamespace(
        rank=rank,
        world_size=world,
        rank_in_group=rank_in_group,
        is_first_rank=False,
        is_last_rank=True,
        ranks=[3, 4, 5],
        cpu_group="cpu-group",
    )


def test_view_is_one_stage_and_delegates_the_rest():
    real = _fake_pp_group()
    view = SingleStageGroupView(real)
    assert (view.world_size, view.rank_in_group) == (1, 0)
    assert view.is_first_rank and view.is_last_rank
    assert view.ranks == [5] and view.first_rank == view.last_rank == 5
    assert view.cpu_group == "cpu-group"


def test_drafter_methods_run_under_the_view_and_restore_it(monkeypatch):
    real = _fake_pp_group()
    monkeypatch.setattr(ps, "_PP", real)
    seen = {}

    class Drafter:
        def propose(self, x):
            seen["propose"] = (ps.get_pp_group().world_size, ps.get_pp_group().is_first_rank)
            return x + 1

        def dummy_run(self):
            raise RuntimeError("boom")

    d = Drafter()
    isolate_drafter(d)
    isolate_drafter(d)  # idempotent: not wrapped twice
    assert d.propose(1) == 2
    assert seen["propose"] == (1, True)
    assert ps._PP is real
    try:
        d.dummy_run()
    except RuntimeError:
        pass
    assert ps._PP is real  # restored after an exception too
    with single_stage_pp():
        with single_stage_pp():  # nested use keeps one view
            assert isinstance(ps._PP, SingleStageGroupView)
            assert ps._PP._real is real
    assert ps._PP is real


def test_drafter_build_does_not_see_the_targets_stage_partition(monkeypatch):
    """VLLM_PP_LAYER_PARTITION lays out the target's stages; the drafter is built as
    one stage, so vLLM's get_pp_indices would refuse that partition for it."""
    import vllm.envs as envs
    from vllm.distributed.utils import get_pp_indices

    monkeypatch.setattr(ps, "_PP", _fake_pp_group())
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "2,1,1")
    with pytest.raises(ValueError, match="does not match pp_size=1"):
        get_pp_indices(1, 0, 1)  # what an unwrapped drafter build hits

    class Drafter:
        def _get_model(self):
            return get_pp_indices(1, 0, 1), envs.VLLM_PP_LAYER_PARTITION

    d = Drafter()
    isolate_drafter(d)
    assert d._get_model() == ((0, 1), None)
    assert envs.VLLM_PP_LAYER_PARTITION == "2,1,1"  # restored for the target
    envs.enable_envs_cache()  # as the worker does after set-up
    try:
        assert d._get_model() == ((0, 1), None)
        assert envs._is_envs_cache_enabled()
        assert envs.VLLM_PP_LAYER_PARTITION == "2,1,1"
    finally:
        envs.disable_envs_cache()
