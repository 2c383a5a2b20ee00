"""``python -m vllm_ppspec.soak`` keeps working: the tool is
:mod:`vllm_ppspec_tools.soak`."""

from vllm_ppspec_tools.soak import main

if __name__ == "__main__":
    raise SystemExit(main())
