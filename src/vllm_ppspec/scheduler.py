"""Export ``vllm_ppspec.scheduler.PPSpecScheduler`` for ``--scheduler-cls``.

It is the scheduler of the sync filled pipeline, :mod:`vllm_ppspec.sched.filled`."""

from vllm_ppspec.sched.filled import PPSpecScheduler

__all__ = ["PPSpecScheduler"]
