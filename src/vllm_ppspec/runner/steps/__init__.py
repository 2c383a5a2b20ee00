"""The mode's steps objects and what builds them: the hooks every mode
implements and ``OFF``'s (``base.py``), ``SYNC``'s (``sync.py``), ``LANES``'
(``lanes.py``, which posts, receives and uses the rounds), the sampled tensor
the lanes capture (``capture.py``), and the one place that turns the policy's
mode into its steps object and checks the engine runs the matching scheduler
(``parts.py``). The runner mixin (``runner/mixin.py``) holds one of these and
calls its hooks; the steps reach vLLM's runner only through
``runner/view.py``."""
