"""List every change the plugin makes to vLLM outside its own classes, and install them by group.

Four groups, by the process and the moment they apply (``Patch.when``), each
installed by one call of :func:`install_group` from the one place it applies:

* ``config``: in every vLLM process (API server, engine core, workers), from
  the general-plugin hook (:func:`vllm_ppspec.plugin.register`) before any
  config is built. Each wrapper calls vLLM's function unchanged unless the
  plugin's worker is selected.
* ``engine core``: in the engine core process, at the first ``post_step`` of
  an engine core running one of the plugin's schedulers (PP + spec with the
  plugin's worker): ``patches.config``'s ``post_step`` wrapper.
* ``worker``: inside the plugin's worker (CPU and GPU), at ``init_device``,
  before vLLM's (the runner and the distributed groups not built yet), or
  after it (``after_init``: the worker's threads bound). Entries with
  ``cpu_only`` only in the CPU worker. vLLM's own worker never gets them.
* ``runner``: inside the plugin's runner, on one object (a drafter instance:
  its class is untouched; a runner output) or for the length of one call (a
  module global put back after it). These need the object: ``install`` is
  None and ``how`` names the call that applies each (with its arguments).

The plugin's own subclasses (worker, runner, schedulers) are not patches: they
are selected by name (``--worker-cls``, and the config patch that sets the
scheduler class). The entries are data, in :mod:`vllm_ppspec.compat.registry`
(with the names derived from them). ``tests/test_patches_registry.py``
checks each entry against vLLM and the modules that install it, and scans
the plugin's code for changes to vLLM objects that no entry lists. No vLLM
import: :func:`install_group` imports each entry's module when it installs it.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm_ppspec.compat.registry import REGISTRY

__all__ = ["install_group"]


# The groups install_group has installed in this process.
installed_groups: set[str] = set()


def install_group(when: str, *args: Any, cpu: bool = False, after_init: bool = False) -> None:
    """Install the registry's ``when`` entries, in registry order: import each
    entry's module and call its ``install`` function with ``args``.

    Entries whose ``install`` is None are applied by their own call (``how``).
    ``cpu`` and ``after_init`` select the worker entries: ``cpu_only`` ones
    only with ``cpu``, and those of the moment asked (before or after vLLM's
    ``init_device``). Each install is idempotent or the caller installs once.
    """
    for patch in REGISTRY:
        if patch.when != when or patch.install is None:
            continue
        if (patch.cpu_only and not cpu) or patch.after_init != after_init:
            continue
        getattr(importlib.import_module(patch.module), patch.install)(*args)
    installed_groups.add(when)
