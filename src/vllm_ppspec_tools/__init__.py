"""Tools (demo, bench, soak, transport and async benches, drift check) and the
test fixtures they share (``fixtures``). The plugin (``vllm_ppspec``) never
imports this package; ``python -m vllm_ppspec_tools.<tool>`` runs a tool."""
