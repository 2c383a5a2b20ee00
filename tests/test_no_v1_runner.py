"""On a vLLM without the V1 runner (0.34.0 removed it) the plugin hook warns
once, saying what serves PP + speculative decoding there and which vLLM
releases the plugin serves, and installs nothing; the plugin's worker named
with ``--worker-cls`` is refused with the same words (``no_v1_runner``).

Version-neutral: scripts/test.sh runs this file on the 0.34.0 overlay
(tests/on_vllm_0.34.txt: vLLM 0.34.0's Python, which has no V1 runner) and on
.venv (0.32.0), where each case hides the V1 runner module and reports the
release as 0.34.0. No engine starts.
"""

from __future__ import annotations

import subprocess
import sys

# A vLLM that still has the V1 runner is made to look like 0.34.0: the
# runner's module hidden (find_spec returns None for a None entry in
# sys.modules) and the release renamed. On the overlay nothing is hidden.
AS_0_34 = """
import importlib.util, sys
if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None:
    sys.modules["vllm.v1.worker.gpu_model_runner"] = None
    import vllm
    vllm.__version__ = "0.34.0"
import vllm
print("RELEASE", vllm.__version__.split("+")[0])
"""

HOOK = """
import logging
import vllm.logger  # vLLM's logging configured first: it disables loggers made before
records = []
class Records(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))
logging.getLogger("vllm.ppspec").addHandler(Records())
from vllm.plugins import load_general_plugins
load_general_plugins()  # vLLM's loader runs the entry point, as in every vLLM process
from vllm_ppspec import plugin
plugin.register()  # vLLM may load plugins more than once
from vllm.config import VllmConfig
from vllm_ppspec.patches import config as config_patches
print("PATCHED", bool(getattr(VllmConfig, config_patches.PATCHED_FLAG, False)))
for level, message in records:
    print("LOGGED", level, message)
"""

# What vLLM's worker process does with --worker-cls (WorkerWrapperBase.init_worker).
NAMED_WORKER = """
from vllm.utils.import_utils import resolve_obj_by_qualname
try:
    resolve_obj_by_qualname("vllm_ppspec.worker.PPSpecWorker")
except Exception as e:
    print("REFUSED", type(e).__name__, e)
else:
    print("ACCEPTED")
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-c", AS_0_34 + code], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "RELEASE 0.34.0" in proc.stdout, proc.stdout
    return proc


def test_the_hook_warns_once_what_serves_there_and_which_releases_the_plugin_serves():
    proc = _run(HOOK)
    logged = [line for line in proc.stdout.splitlines() if line.startswith("LOGGED")]
    assert len(logged) == 1, proc.stdout + proc.stderr[-4000:]
    assert logged[0].startswith("LOGGED WARNING vllm-ppspec: "), logged
    for words in (
        "vLLM 0.34.0 removed the V1 model runner that vllm-ppspec extends",
        "vLLM's own Model Runner V2 runs pipeline parallelism with speculative decoding "
        "(with async scheduling on CUDA)",
        "vllm-ppspec serves vLLM 0.32.0 and 0.33.0 only",
        "installs nothing",
    ):
        assert words in logged[0], (words, logged[0])
    from vllm_ppspec.compat import no_v1_runner

    assert logged[0] == "LOGGED WARNING " + no_v1_runner.warning("0.34.0"), logged
    assert "PATCHED False" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]


def test_the_named_worker_is_refused_with_the_same_words():
    proc = _run(NAMED_WORKER)
    refused = [line for line in proc.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 1, proc.stdout + proc.stderr[-4000:]
    assert refused[0].startswith("REFUSED VLLMVersionError "), refused
    assert "--worker-cls vllm_ppspec.worker.PPSpecWorker cannot run" in refused[0], refused
    from vllm_ppspec.compat import no_v1_runner

    assert no_v1_runner.advice("0.34.0") in refused[0], refused[0]  # the warning's words
    assert no_v1_runner.advice("0.34.0") in no_v1_runner.warning("0.34.0")
