"""What of vLLM the plugin uses and changes, per release.

* :mod:`.data`: the supported releases, the private names the plugin uses
  without patching them, and the upstream functions it mirrors (hash-pinned);
* :mod:`.registry` (entries of :mod:`.patch`; the runner's in
  :mod:`.registry_runner`): every change the plugin makes to vLLM, and the
  names derived from it;
* :mod:`.guard`: the installed vLLM checked against both;
* :mod:`.no_v1_runner`: what the hook and the worker say on a vLLM without
  the V1 runner (0.34.0 on).

Data and checks only: nothing here changes vLLM.
"""
