"""``python -m vllm_ppspec.transport_bench`` keeps working: the tool is
:mod:`vllm_ppspec_tools.transport_bench`."""

from vllm_ppspec_tools.transport_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
