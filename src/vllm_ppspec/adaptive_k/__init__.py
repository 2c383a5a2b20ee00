"""Adaptive K: with ``VLLM_PPSPEC_ADAPTIVE_K=1`` the plugin's schedulers choose K by batch size.

The room holds all of it:

* here, the config's side (the switch is read with the plan's others,
  ``choice/policy.py``): vLLM must know
  beforehand that K will change at run time, so a static-K schedule stands in
  for the measured one before ``VllmConfig.__post_init__`` (:func:`stand_in`,
  called by the config patch);
* :mod:`.chooser`: what the schedulers measure while they serve, and the
  schedule they set;
* :mod:`.k_model`: the batch-cost fit and the choice of K (pure arithmetic).
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec.choice import policy

# On the speculative config: the schedule there is this module's stand-in.
STAND_IN_FLAG = "_vllm_ppspec_adaptive_k"


def stand_in(vllm_config: Any, plugin_acts: bool) -> bool:
    """Before vLLM's ``VllmConfig.__post_init__``, on a line the plugin serves:
    stand a schedule of the static K in for the one the scheduler will measure.

    vLLM then treats the line as dynamic K everywhere it must know it (CUDA
    graphs captured piecewise on the V1 runner, no padded decode batches, the
    schedule dropped with data parallelism), and the plugin's scheduler
    replaces the schedule once measured. A user's schedule is left alone.
    Whether it stood one in (the caller then sets :data:`STAND_IN_FLAG`)."""
    spec = vllm_config.speculative_config
    if not policy.adaptive_k() or not plugin_acts or spec is None:
        return False
    if spec.num_speculative_tokens_per_batch_size or not spec.num_speculative_tokens:
        return False
    spec.num_speculative_tokens_per_batch_size = [(1, 1, int(spec.num_speculative_tokens))]
    return True
