"""Each rank's steps, by mode: the hooks and the chain of parts (``base.py``),
the parts of sync mode (``sync.py``), of lanes mode (``lanes.py``, which
posts, receives and uses the rounds, with the sampled tensor ``capture.py``
keeps), of hybrid models (``hybrid.py``), of EAGLE-3's middle stages
(``relay.py``) and of a draft model on the first stage (``drafts.py``), and
the one place that builds them for a rank and checks the engine runs the
matching scheduler (``build.py``). The runner mixin
(``runner/mixin.py``) holds one steps object and calls its hooks; the parts
reach vLLM's runner only through ``runner/view.py``."""
