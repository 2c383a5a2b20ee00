"""Replace the CPU ``expand_kernel`` of vLLM's rejection sampler with one that writes its output.

Without Triton (vLLM's CPU backend), vLLM replaces
``vllm.v1.sample.rejection_sampler.expand_kernel`` with
``vllm.utils.cpu_triton_utils._expand_kernel_impl``. That function passes its
``output`` through ``_ensure_int64``, which makes a new int64 tensor for any
other dtype: the C++ kernel writes into that copy, the copy is dropped, and
the caller's tensor (made with ``new_empty``) keeps whatever memory it had.
Float inputs are also truncated to int64 on the way in.

``expand_batch_to_tokens`` uses it to spread each request's temperature,
top-k and top-p over its draft tokens. In a speculative batch with any
temperature > 0 request, ``apply_sampling_constraints`` then divides every
row's logits (greedy rows included) by that garbage, and the greedy argmax
changes. A grammar row that allows only EOS becomes all -inf or NaN and yields
token 0 ("grammar rejected tokens [0]"), with vLLM's own worker too.

:func:`expand_kernel` does what the Triton ``expand_kernel`` does, in torch,
writing into ``output`` in its own dtype. The plugin's CPU worker registers it
over vLLM's fallback (after vLLM registered its own; vLLM logs "already
registered. Overwriting"), only when vLLM uses that fallback (no Triton).
"""

from __future__ import annotations

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel(
    output: torch.Tensor,
    input: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: int | float,
    replace_to: int | float,
    MAX_NUM_TOKENS: int | None = None,
) -> None:
    """``output[start_i:end_i] = input[i]`` (``replace_from`` -> ``replace_to``).

    Mirrors the Triton kernel ``expand_kernel`` in
    vllm/v1/sample/rejection_sampler.py: request ``i`` covers
    ``cu_num_tokens[i-1]:cu_num_tokens[i]`` (0 for the first). Replaces vLLM's
    CPU fallback ``_expand_kernel_impl`` in vllm/utils/cpu_triton_utils.py.
    """
    del MAX_NUM_TOKENS  # the Triton kernel's block size; not a bound here
    ends = cu_num_tokens.to(torch.long)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(
        input == replace_from, torch.as_tensor(replace_to, dtype=input.dtype), input
    )
    total = int(ends[-1]) if ends.numel() else 0
    output[:total] = values.repeat_interleave(counts).to(output.dtype)


def install(worker: object = None) -> bool:
    """Register :func:`expand_kernel` where vLLM uses its CPU fallback; True if it did
    (the ``worker`` group's entry; ``worker`` unused)."""
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:  # the Triton kernel runs (GPU, or Triton-CPU): nothing to fix
        return False
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({KERNEL: expand_kernel})
    return True
