"""fixtures/run_offline.kv_blocks: a test job's KV cache holds every sequence at its
longest (no preemption that vLLM's 1 GiB default would not have), except where
the job sets its own blocks, block size or KV connector."""

from __future__ import annotations

import pytest

from tests.engine_jobs import job
from vllm_ppspec_tools.fixtures.run_offline import KV_BLOCK_TOKENS, kv_blocks


@pytest.mark.parametrize("seqs,length", [(8, 512), (4, 1024), (1, 100), (16, 2048)])
def test_every_sequence_fits_at_its_longest_with_room_to_spare(seqs, length):
    blocks = kv_blocks(job("m"), max_model_len=length, max_num_seqs=seqs)
    assert blocks is not None
    # k lookahead slots and a partly filled last block fit too.
    assert blocks * KV_BLOCK_TOKENS >= 2 * seqs * (length + KV_BLOCK_TOKENS)


def test_a_jobs_own_blocks_block_size_or_connector_win():
    assert kv_blocks(job("m", num_kv_blocks=5), 512, 8) == 5  # a test that forces preemption
    assert kv_blocks(job("m", block_size=32), 512, 8) is None
    assert kv_blocks(job("m", kv_transfer_config={"kv_connector": "x"}), 512, 8) is None
