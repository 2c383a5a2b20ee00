"""Run the last rank's drafter as a single-stage model.

vLLM builds the drafter only on the last PP rank, but model code asks the
global PP group where it stands (``make_layers`` keeps only this stage's slice
of layers; ``LlamaModel.forward`` expects intermediate tensors on a non-first
rank). A drafter is a whole model living on one rank, so while it is built and
while it runs, :func:`single_stage_pp` shows it a PP group of size one. No
collective is issued on that view; everything but the stage layout is the real
group. The config the drafter is built from gets a copy of the parallel config
with ``pipeline_parallel_size = 1`` too (EAGLE's Llama head names its layers
after ``get_num_layers(parallel_config)``: under PP that is the last stage's
share, and the names collide with the target's layers on that stage).

While the drafter is built, ``VLLM_PP_LAYER_PARTITION`` is hidden: it gives the
target's layers per stage, and vLLM's ``get_pp_indices`` applies it to any
model, so a drafter built as one stage (``make_layers``, EAGLE's
``get_num_layers``) would raise "len(partitions)=3 does not match pp_size=1".
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import vllm.distributed.parallel_state as parallel_state
import vllm.envs as envs

# Drafter methods that build or run the draft model.
DRAFTER_MODEL_METHODS = ("_get_model", "propose", "dummy_run")


class SingleStageGroupView:
    """A PP GroupCoordinator seen as one stage holding every layer."""

    def __init__(self, real: Any) -> None:
        self._real = real

    world_size = 1
    rank_in_group = 0
    is_first_rank = True
    is_last_rank = True

    @property
    def ranks(self) -> list[int]:
        return [self._real.rank]

    @property
    def first_rank(self) -> int:
        return int(self._real.rank)

    @property
    def last_rank(self) -> int:
        return int(self._real.rank)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextmanager
def single_stage_pp() -> Iterator[None]:
    real = parallel_state._PP
    if real is None or isinstance(real, SingleStageGroupView) or real.world_size == 1:
        yield
        return
    parallel_state._PP = SingleStageGroupView(real)  # type: ignore[assignment]
    try:
        yield
    finally:
        parallel_state._PP = real


PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


@contextmanager
def target_partition_hidden() -> Iterator[None]:
    """Hide ``VLLM_PP_LAYER_PARTITION`` (the target's stage layout) for a while.

    vLLM reads it through ``vllm.envs``; if that module already caches values
    (``enable_envs_cache``, after the worker's set-up), the cache is dropped
    for the while and enabled again after.
    """
    if os.environ.get(PARTITION_ENV) is None:
        yield
        return
    cached = envs._is_envs_cache_enabled()
    if cached:
        envs.disable_envs_cache()
    saved = os.environ.pop(PARTITION_ENV)
    try:
        yield
    finally:
        os.environ[PARTITION_ENV] = saved
        if cached:
            envs.enable_envs_cache()


def _built_as_one_stage(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with single_stage_pp(), target_partition_hidden():
            return fn(*args, **kwargs)

    return wrapper


def _in_single_stage(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with single_stage_pp():
            return fn(*args, **kwargs)

    return wrapper


def _single_stage_config(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        vllm_config = fn(*args, **kwargs)
        parallel_config = copy.copy(vllm_config.parallel_config)
        parallel_config.pipeline_parallel_size = 1
        return dataclasses.replace(vllm_config, parallel_config=parallel_config)

    return wrapper


def isolate_drafter(drafter: Any) -> None:
    """Make ``drafter`` build and run its model as a single PP stage.

    Wraps the bound methods on this one instance; the class is untouched.
    """
    if getattr(drafter, "_ppspec_isolated", False):
        return
    drafter._ppspec_isolated = True
    create = getattr(drafter, "_create_draft_vllm_config", None)
    if create is not None:
        drafter._create_draft_vllm_config = _single_stage_config(create)
    for name in DRAFTER_MODEL_METHODS:
        method = getattr(drafter, name, None)
        if method is not None:
            wrap = _built_as_one_stage if name == "_get_model" else _in_single_stage
            setattr(drafter, name, wrap(method))


class DrafterlessSpecConfig:
    """The speculative config as a rank without a drafter must see it.

    vLLM builds the drafter on the last PP rank only. This config is falsy, so
    vLLM's ``if self.speculative_config and ...`` blocks that reach for
    ``self.drafter`` are skipped on the other ranks, yet ``is not None`` still
    holds, so paths that only ask "is spec decoding on" (attention metadata
    for spec decoding, buffer sizes) behave as on the last rank. Attributes
    come from the real config.
    """

    def __init__(self, real: Any) -> None:
        self._real = real

    def __bool__(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextmanager
def drafter_hidden(runner: Any, hide: bool) -> Iterator[None]:
    """While the block runs, ``runner.speculative_config`` is drafterless if ``hide``."""
    saved = runner.speculative_config
    if not hide or isinstance(saved, DrafterlessSpecConfig):
        yield
        return
    runner.speculative_config = DrafterlessSpecConfig(saved)
    try:
        yield
    finally:
        runner.speculative_config = saved
