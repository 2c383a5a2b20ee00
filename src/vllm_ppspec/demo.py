"""``python -m vllm_ppspec.demo`` keeps working: the tool is
:mod:`vllm_ppspec_tools.demo`."""

from vllm_ppspec_tools.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
