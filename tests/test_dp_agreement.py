"""dp_agreement: DP ranks holding drafters agree on each drafter run, or all raise.

On spawned gloo ranks (tests/distributed.py): agreed values are the same on
every rank; a disagreement raises DPAgreementError on every rank within
seconds; a rank that never arrives is waited for only up to the timeout; the
hook on a drafter shaped like vLLM's SpecDecodeBaseProposer (propose /
dummy_run around _determine_batch_execution_and_padding and per-forward
collectives) lets an idle rank's dummy_run match a drafting rank's propose,
and the dp_disagree fault makes both ranks raise before any drafter forward.
"""

from __future__ import annotations

import time

import torch

from tests.distributed import run_ranks
from vllm_ppspec.protocol import dp_agreement, faults
from vllm_ppspec.protocol.dp_agreement import Agreement, DPAgreementError
from vllm_ppspec.runner.drafter import dp_hook


def _world():
    import torch.distributed as dist

    return dist.group.WORLD


def _disagreement(rank: int, **fields):
    t0 = time.monotonic()
    try:
        dp_agreement.agree(_world(), rank, **fields)
    except DPAgreementError as e:
        return time.monotonic() - t0, str(e)
    return None


def _agree_cases(rank: int, world: int):
    # Every agreement completes its all_gather, so the group stays usable after a raise.
    agreed = dp_agreement.agree(
        _world(), rank, run=7, drafts=rank == 0, forwards=3, tokens=[5, 1][rank]
    )
    forwards = _disagreement(rank, run=8, drafts=True, forwards=3 + rank, tokens=4)
    runs = _disagreement(rank, run=10 + rank, drafts=False, forwards=3, tokens=1)
    return agreed, forwards, runs


def test_agreement_is_the_same_on_every_rank_and_disagreement_raises_on_every_rank():
    results = run_ranks(_agree_cases, world=2, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
        agreed, forwards, runs = r.value
        assert agreed == Agreement(run=7, forwards=3, tokens=(5, 1), drafts=(True, False))
        assert agreed.padded_tokens == 5
        for raised, words in ((forwards, "forwards differ"), (runs, "run counts differ")):
            assert raised is not None, f"rank {r.rank} did not raise ({words})"
            secs, msg = raised
            assert secs < 5 and words in msg and "DP rank 1" in msg, msg


def _one_rank_absent(rank: int, world: int):
    if rank == 1:
        time.sleep(6)  # never joins this agreement
        return None
    t0 = time.monotonic()
    try:
        dp_agreement.agree(_world(), rank, run=0, drafts=True, forwards=1, tokens=1, timeout=2)
    except DPAgreementError as e:
        return time.monotonic() - t0, str(e)
    return None


def test_a_rank_that_never_arrives_is_waited_for_only_up_to_the_timeout():
    results = run_ranks(_one_rank_absent, world=2, timeout=60)
    assert results[0].error is None, results[0].message
    secs, msg = results[0].value
    assert 2 <= secs < 4 and "within 2 s" in msg, (secs, msg)


def test_vllm_coordination_must_cover_the_agreed_tokens():
    agreed = Agreement(run=0, forwards=3, tokens=(5, 1), drafts=(True, False))
    dp_agreement.check_coordination(agreed, torch.tensor([5, 1]), 0)  # eager: as agreed
    dp_agreement.check_coordination(agreed, torch.tensor([8, 8]), 0)  # padded (CUDA graphs)
    dp_agreement.check_coordination(agreed, None, 0)  # DP coordination skipped
    try:
        dp_agreement.check_coordination(agreed, torch.tensor([4, 1]), 0)
    except DPAgreementError as e:
        assert "[4, 1]" in str(e) and "[5, 1]" in str(e)
    else:
        raise AssertionError("fewer tokens than agreed were accepted")


class _Drafter:
    """Shaped like vLLM's SpecDecodeBaseProposer where DP collectives happen."""

    parallel_drafting = False

    def __init__(self, rank: int, k: int = 3) -> None:
        self.rank = rank
        self.num_speculative_tokens = k
        self.forwards = 0

    def _determine_batch_execution_and_padding(self, num_tokens: int, use_cudagraphs=True):
        import torch.distributed as dist

        across = torch.zeros(2, dtype=torch.int32)
        across[self.rank] = num_tokens
        dist.all_reduce(across, group=_world())  # coordinate_batch_across_dp
        return 0, num_tokens, across

    def _forward(self) -> None:
        import torch.distributed as dist

        dist.all_reduce(torch.ones(1), group=_world())  # a MoE layer's collective
        self.forwards += 1

    def propose(self, num_speculative_tokens: int, num_tokens: int, batch: int):
        self._determine_batch_execution_and_padding(num_tokens)
        self._forward()
        if num_speculative_tokens > 1:
            self._determine_batch_execution_and_padding(batch)
            for _ in range(num_speculative_tokens - 1):
                self._forward()

    def dummy_run(self, num_tokens: int, use_cudagraphs=True, is_graph_capturing=False):
        for i in range(self.num_speculative_tokens):
            if i <= 1:
                self._determine_batch_execution_and_padding(num_tokens)
            self._forward()


def _hooked_steps(rank: int, world: int, disagree_at: int = 0):
    drafter = _Drafter(rank)
    dp_hook.install(drafter, _world(), rank, disagree_at=disagree_at)
    hook = drafter._ppspec_dp_hook
    agreements = []
    try:
        for step in range(3):
            # Rank 0 drafts every step; rank 1 is idle in step 1 (dummy batch).
            if rank == 1 and step == 1:
                drafter.dummy_run(1)
            else:
                drafter.propose(3, num_tokens=6 + rank, batch=2)
            agreements.append(hook.last)
    except DPAgreementError as e:
        return {"error": str(e), "forwards": drafter.forwards, "steps": len(agreements)}
    return {"agreements": agreements, "forwards": drafter.forwards}


def test_hooked_drafter_idle_rank_dummy_run_matches_propose():
    results = run_ranks(_hooked_steps, world=2, timeout=60)
    for r in results:
        assert r.error is None and not r.hung, r.message
        assert r.value["forwards"] == 9
        runs = r.value["agreements"]
        assert [a.run for a in runs] == [0, 1, 2]
        assert runs[1].drafts == (True, False) and runs[1].tokens == (6, 1)
        assert runs[0].padded_tokens == 7


def _hooked_with_fault(rank: int, world: int):
    import os

    os.environ[faults.FAULT] = "dp_disagree@2"  # parsed as the runner reads it
    parsed = faults.Faults.from_env()
    assert parsed.kind == "dp_disagree" and parsed.at_step == 2
    return _hooked_steps(rank, world, disagree_at=parsed.at_step)


def test_dp_disagree_fault_raises_on_every_rank_before_the_drafter_forward():
    t0 = time.monotonic()
    results = run_ranks(_hooked_with_fault, world=2, timeout=60)
    elapsed = time.monotonic() - t0
    for r in results:
        assert r.error is None and not r.hung, r.message
        # Steps 0 and 1 ran (3 forwards each); rank 1's second propose (step 2)
        # misreports: both raise at its agreement, before any forward of step 2.
        assert r.value["steps"] == 2 and r.value["forwards"] == 6, r.value
        assert "forwards differ" in r.value["error"]
    assert elapsed < 45
