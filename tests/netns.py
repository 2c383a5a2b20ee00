"""Moved to :mod:`vllm_ppspec_tools.hosts.netns` (the tools use it too);
this name stays for tests/test_e2e_two_hosts.py."""

from vllm_ppspec_tools.hosts.netns import link_down

__all__ = ["link_down"]
