"""Ranks that fail, die, stop or start differently end the engine instead of
hanging it or producing wrong tokens: an error on a rank whose reply vLLM does
not read ends the process (``rank_errors.py``); each rank watches its PP peers
over idle TCP and ends when one is gone (``peer_watch.py``, listening where
``placement.py`` says the ranks are); a worker that vLLM stops in order says
goodbye first (``orderly_stop.py``); at start-up the PP ranks agree that they
run the same plugin the same way (``startup_check.py``)."""
