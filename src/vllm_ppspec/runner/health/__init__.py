"""Ranks that fail, die, stop or start differently end the engine instead of
hanging it or producing wrong tokens.

* ``startup_check.py``: at set-up the PP ranks agree that they run the same
  plugin the same way (a fingerprint), or every rank refuses;
* ``rank_errors.py``: an error on a rank whose reply vLLM does not read ends
  the process;
* the peer watch: ``peer_watch.py`` ends this worker when a PP peer is gone;
  ``placement.py`` says where it listens (loopback or this node's address);
  ``peer_links.py`` connects each pair of ranks once; ``heartbeat.py`` sees
  a frozen peer; ``keepalive.py`` bounds a silent one; ``guardian.py`` (run
  by path, standard library only) kills the worker when its watch stops
  beating;
* ``orderly_stop.py``: a worker that vLLM stops in order says goodbye first.
"""
