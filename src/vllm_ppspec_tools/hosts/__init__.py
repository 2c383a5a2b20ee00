"""Hosts on this machine, for PP across hosts without a second machine.

Shared by the tests and the tools (``scripts/bench_two_hosts.py``); needs root
and iproute2.

- ``netns``: network namespaces joined by a veth pair, a bridge (in a
  namespace of its own) or nothing, deleted by name afterwards;
- ``delay_line``: a link with a one-way delay between two namespaces (TUN
  devices; no ``tc netem`` needed);
- ``two_hosts``: two or more "hosts" (network + pid namespace, own
  ``/dev/shm`` and hostname), each running a fork server, and
  ``vllm serve --nnodes N`` across them, one PP rank per host;
- ``node_init``: a host, forked from the caller's fork server: its
  namespaces, its process 1 and its fork server.
"""
