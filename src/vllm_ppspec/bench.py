"""``python -m vllm_ppspec.bench`` keeps working: the tool is
:mod:`vllm_ppspec_tools.bench`."""

from vllm_ppspec_tools.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
