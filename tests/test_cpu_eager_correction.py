"""The CPU worker runs vLLM's async spec-decode correction eagerly (patches/worker/cpu_eager.py)."""

from __future__ import annotations

import torch


def _inputs():
    # 4 requests: r0 and r2 had drafts last step (rows 1 and 0 then), r1 is new
    # (prev position -1), r3 had no drafts.
    return dict(
        num_computed_tokens=torch.tensor([10, 20, 30, 40, 0, 0], dtype=torch.int32),
        num_accepted_tokens=torch.ones(4, dtype=torch.int32),
        prev_positions=torch.tensor([1, -1, 0, 2], dtype=torch.int32),
        valid_sampled_token_count=torch.tensor([3, 2, 4], dtype=torch.int32),
        prev_num_draft_tokens=torch.tensor([3, 3, 0], dtype=torch.int32),
        cpu_num_computed_tokens=torch.tensor([99, 7, 98, 41], dtype=torch.int32),
    )


def test_install_swaps_in_the_uncompiled_function_with_the_same_results(monkeypatch):
    import vllm.v1.worker.gpu_model_runner as runner_module
    from vllm.v1.spec_decode import utils

    from vllm_ppspec.patches.worker import cpu_eager as fix

    compiled = utils.update_num_computed_tokens_for_batch_change
    monkeypatch.setattr(runner_module, fix.NAME, compiled)
    monkeypatch.delenv(fix.KEEP_COMPILED_ENV, raising=False)
    assert fix.install() is True
    eager = getattr(runner_module, fix.NAME)
    assert eager is compiled._torchdynamo_orig_callable  # type: ignore[attr-defined]
    assert fix.install() is False  # installing twice changes nothing

    got, want = _inputs(), _inputs()
    eager(*got.values())
    compiled(*want.values())  # vLLM's inductor-compiled version (compiles here, slowly)
    for name in got:
        assert torch.equal(got[name], want[name]), name
    # r0: 20 + 2 accepted; r1 (new) and r3 (no drafts) keep the CPU values;
    # r2: 10 + 3; tail untouched.
    assert got["num_computed_tokens"].tolist() == [22, 7, 13, 41, 0, 0]
    assert got["num_accepted_tokens"].tolist() == [2, 1, 3, 1]


def test_the_comparison_switch_keeps_vllms_compiled_function(monkeypatch):
    import vllm.v1.worker.gpu_model_runner as runner_module
    from vllm.v1.spec_decode import utils

    from vllm_ppspec.patches.worker import cpu_eager as fix

    compiled = utils.update_num_computed_tokens_for_batch_change
    monkeypatch.setattr(runner_module, fix.NAME, compiled)
    monkeypatch.setenv(fix.KEEP_COMPILED_ENV, "1")
    assert fix.install() is False
    assert getattr(runner_module, fix.NAME) is compiled
