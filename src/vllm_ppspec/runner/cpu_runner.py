"""Put the runner mixin on vLLM's CPUModelRunner (a GPUModelRunner subclass)."""

from __future__ import annotations

from typing import Any

from vllm.distributed.parallel_state import get_pp_group
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from vllm_ppspec.runner.mixin import PPSpecRunnerMixin  # runs the version guard first


class PPSpecCPUModelRunner(PPSpecRunnerMixin, CPUModelRunner):
    """vLLM's CPUModelRunner with speculative decoding under PP."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ppspec_setup()

    def sync_and_gather_intermediate_tensors(
        self, num_tokens: int, intermediate_tensors: Any, sync_self: bool
    ) -> Any:
        # vLLM allocates the receive buffer of a non-first PP rank in its warm-up
        # dummy run, which the CPU worker skips in eager mode (and with
        # VLLM_CPU_CI_ENV). Allocate it on first use instead.
        if getattr(self, "intermediate_tensors", None) is None and not get_pp_group().is_first_rank:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens,
                dtype=self.model_config.dtype,
                device=self.device,
            )
        return super().sync_and_gather_intermediate_tensors(
            num_tokens, intermediate_tensors, sync_self
        )
