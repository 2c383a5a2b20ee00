"""Moved to :mod:`vllm_ppspec_tools.hosts.two_hosts` (the tools use it too);
this name stays for tests/test_e2e_two_hosts.py."""

from vllm_ppspec_tools.hosts.two_hosts import Pipeline, two_hosts

__all__ = ["Pipeline", "two_hosts"]
