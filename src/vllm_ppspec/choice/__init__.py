"""Who serves, and how: decided from the config and the environment, once.

* :mod:`.worker`: the one rule of where the plugin acts, and who serves each
  line (the plugin's worker, vLLM's V1 or its Model Runner V2);
* :mod:`.policy`: the mode (sync, lanes, external launcher) and what follows
  from it, and where a draft model runs;
* :mod:`.plan`: the plan of one engine configuration, decided once from the two
  above and read by every place that asks;
* :mod:`.deployment`: every rank of a deployment decided the same;
* :mod:`.unserved`: the methods the plugin refuses under PP, naming why;
* :mod:`.layer_split`: the target's layers across the PP stages.

No module here patches vLLM or imports the plugin's patches, runner or schedulers.
"""
