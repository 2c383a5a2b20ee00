"""One entry of the patch registry: what a change to vLLM is, why, and how it is installed."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_ppspec.compat.data import SUPPORTED_VLLM_VERSIONS


@dataclass(frozen=True)
class Patch:
    module: str  # the plugin module that makes the change
    when: str  # "config" (every vLLM process), "engine core" (with the plugin's
    # scheduler), "worker" (the plugin's worker), "runner" (one object or one call)
    targets: tuple[str, ...]  # vLLM names replaced or wrapped, "module:qualname"
    why: str
    how: str
    upstream: str  # the vLLM issue or PR behind it, or "none found" and the source
    remove_when: str
    versions: tuple[str, ...] = SUPPORTED_VLLM_VERSIONS  # the vLLM releases that need it
    # The function of ``module`` that install_group(when, *args) calls; None where
    # another call applies the change (``how`` says which).
    install: str | None = "install"
    # Attributes the change sets on vLLM objects besides its targets ("Owner.name":
    # marks, an instance's attribute), as the code scan finds them.
    attributes: tuple[str, ...] = ()
    cpu_only: bool = False  # "worker": only the plugin's CPU worker installs it
    after_init: bool = False  # "worker": after vLLM's init_device, not before
    # Its targets among compat.guard.PRIVATE_NAMES, resolved when the worker is
    # imported; False where importing the target's module there changes vLLM.
    checked_at_import: bool = True
