"""Tools run from the command line (``python -m vllm_ppspec.tools.<name>``); the
plugin itself never imports them."""
