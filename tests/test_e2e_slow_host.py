"""A pipeline over two hosts, one held to half a core: the measured layer split.

Host 1 (PP rank 1, the last stage) runs inside a cgroup whose processes get at
most half of one core (``hosts/cpu_quota.py``, the cgroup v1 ``cpu`` controller).
With ``VLLM_PPSPEC_LAYER_SPLIT=measured`` on both hosts, each stage measures
itself at set-up and the first decides (``runner/stage_speed.py``):

* both hosts log the same split, the figures of both stages beside it;
* the slow host holds fewer of the tiny target's 4 layers than the weights
  rule gives it at equal speed (2,2: its LM head is small), so this fails with
  the measurement turned off;
* the tokens equal PP=1 without spec, from vLLM's own worker.
"""

from __future__ import annotations

import re

import pytest

from tests.test_e2e_two_hosts import greedy_all
from tests.two_hosts import Pipeline, two_hosts
from vllm_ppspec_tools.hosts import cpu_quota

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not cpu_quota.available(), reason="needs the cgroup v1 cpu controller"),
]
SPLIT_LINE = re.compile(r"vllm-ppspec: target layers split (\d+),(\d+) \(measured; [^\n]*")


def test_a_half_speed_host_gets_fewer_layers_and_the_tokens_stay(models, pp1_greedy, tmp_path):
    want = pp1_greedy["target"]
    with cpu_quota.cpu_quota(0.5, "slow-host") as group, two_hosts("slow") as hosts:
        cpu_quota.join(group, hosts.nodes[1].pids())  # its fork server's children inherit it
        pipe = Pipeline(
            hosts,
            models,
            "ngram",
            tmp_path,
            "--max-num-batched-tokens",
            "64",
            common={"VLLM_PPSPEC_LAYER_SPLIT": "measured"},
        )
        try:
            pipe.wait_ready()
            got = greedy_all(pipe.base)
        finally:
            pipe.stop()
    logs = [p.read_text() for p in pipe.logs]
    lines = [SPLIT_LINE.search(log) for log in logs]
    assert all(lines), [log[-3000:] for log in logs]
    said = [m.group(0).split("; measured in")[0] for m in lines if m]
    assert said[0] == said[1], said  # one split, decided once, on both hosts
    first, last = (int(n) for n in lines[0].groups())  # type: ignore[union-attr]
    assert (first, last) == (3, 1), said[0]  # the weights rule's split here is 2,2
    assert "the weights rule's 2,2" in said[0], said[0]
    assert got == want
    print(said[0])
