"""``python -m vllm_ppspec.async_cpu_bench`` keeps working: the tool is
:mod:`vllm_ppspec_tools.async_cpu_bench`."""

from vllm_ppspec_tools.async_cpu_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
