"""The CPU expand kernel (patches/worker/cpu_expand.py): vLLM 0.32's fallback leaves its
output unwritten; ours matches the Triton kernel, and a greedy row of a mixed
greedy / temperature-1.0 speculative batch keeps its tokens."""

from __future__ import annotations

import pytest
import torch

from vllm_ppspec.patches.worker import cpu_expand as cpu_expand_fix


def _reference(values: list, ends: list[int], replace_from, replace_to) -> list:
    out, start = [], 0
    for v, end in zip(values, ends, strict=True):
        out += [replace_to if v == replace_from else v] * (end - start)
        start = end
    return out


@pytest.fixture(scope="module")
def cpu_kernels():
    """vLLM's CPU kernel fallbacks, registered as WorkerBase does, then ours."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    assert cpu_expand_fix.install(), "expected vLLM's CPU fallback (no Triton) on this machine"


def test_vllm_cpu_fallback_leaves_a_float_output_unwritten(cpu_kernels):
    """The upstream bug this module fixes (vllm/utils/cpu_triton_utils.py)."""
    from vllm.utils import cpu_triton_utils

    out = torch.full((4,), -7.0)
    cpu_triton_utils._expand_kernel_impl(
        out, torch.tensor([0.0, 0.7]), torch.tensor([2, 4], dtype=torch.int32), 0, 1
    )
    assert out.tolist() == [-7.0] * 4


@pytest.mark.parametrize(
    "dtype,values,replace",
    [
        (torch.float32, [0.0, 0.7, 1.0], (0, 1)),  # temperature: greedy 0 -> 1
        (torch.int32, [5, 0, 7], (0, 0)),  # top-k
        (torch.int64, [3, 9, 3], (3, 4)),
        (torch.float32, [0.9, 1.0, 0.5], (0, 0)),  # top-p
    ],
)
def test_expand_kernel_matches_the_triton_kernels_semantics(dtype, values, replace):
    ends = [2, 2, 6]  # the middle request has no tokens
    out = torch.full((8,), -3, dtype=dtype)
    cpu_expand_fix.expand_kernel(
        out, torch.tensor(values, dtype=dtype), torch.tensor(ends, dtype=torch.int32), *replace
    )
    want = _reference(torch.tensor(values, dtype=dtype).tolist(), ends, *replace)
    assert out[:6].tolist() == pytest.approx(want)
    assert out[6:].tolist() == [-3, -3]  # past the last request: untouched


def test_expand_batch_to_tokens_goes_through_the_fix(cpu_kernels):
    from vllm.v1.sample import rejection_sampler

    cu = torch.tensor([2, 4], dtype=torch.int32)
    got = rejection_sampler.expand_batch_to_tokens(torch.tensor([0.0, 0.7]), cu, 4, 0, 1)
    assert got.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7])


def _metadata(temps: list[float]):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    n = len(temps)
    return SamplingMetadata(
        temperature=torch.tensor(temps, dtype=torch.float32),
        all_greedy=all(t == 0 for t in temps),
        all_random=all(t > 0 for t in temps),
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def test_greedy_row_of_a_mixed_speculative_batch_keeps_its_tokens(cpu_kernels):
    """vLLM's RejectionSampler on CPU: request 0 greedy with drafts equal to the
    target's argmax (all accepted), request 1 at temperature 1.0."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    k, vocab = 3, 50
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2 * (k + 1), vocab, generator=gen)
    greedy = [int(logits[i].argmax()) for i in range(k + 1)]
    meta = SpecDecodeMetadata.make_dummy([greedy[:k], [1, 2, 3]], torch.device("cpu"))
    meta.target_logits_indices = torch.tensor([0, 1, 2, 4, 5, 6], dtype=torch.int32)
    meta.bonus_logits_indices = torch.tensor([3, 7], dtype=torch.int32)
    sampler = RejectionSampler(Sampler())
    for _ in range(8):  # the unfixed kernel read leftover memory: wrong most times
        out = sampler(meta, None, logits.clone(), _metadata([0.0, 1.0]))
        assert out.sampled_token_ids[0].tolist() == greedy
