"""The configurations ``vllm-ppspec-bench-serve`` starts (bench_serve): their
names, ``vllm serve`` arguments and environment, and ``--configs``' selection.

PP=1 and PP=2, no spec and ngram (k=3, prompt lookup 2-5 tokens, as the demo),
eager and compiled, and PP=2 + ngram with the plugin's adaptive K
(:data:`CONFIGS`: the full measurement). An ngram configuration named with its
own K after ``ngram`` (``pp2 ngram k6 adaptive K compiled``; :func:`variant`)
runs that K.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SERVED_NAME = "smollm2"
MAX_MODEL_LEN = 1024
K = 3
WORKER_CLS = "vllm_ppspec.worker.PPSpecWorker"


@dataclass(frozen=True)
class Config:
    name: str
    pp: int
    spec: bool
    eager: bool
    adaptive: bool = False
    k: int | None = None  # ngram's K; None: the run's ``-k``

    def describe(self) -> dict[str, Any]:
        return {
            "pp": self.pp,
            "spec": self.spec,
            "eager": self.eager,
            "adaptive": self.adaptive,
            **({"k": self.k} if self.k is not None else {}),
        }


def _is_k(word: str) -> bool:
    """A configuration name's K word: ``k6``."""
    return word[0] == "k" and word[1:].isdigit()


def _config(name: str) -> Config:
    pp, *middle, mode = name.split()
    k = [int(w[1:]) for w in middle if _is_k(w)]
    spec = " ".join(w for w in middle if not _is_k(w))
    return Config(
        name,
        int(pp[2:]),
        spec != "no spec",
        mode == "eager",
        "adaptive" in spec,
        k[0] if k else None,
    )


def variant(name: str) -> Config | None:
    """A configuration of :data:`CONFIGS` with ngram's K in its name (``pp2
    ngram k6 compiled``, ``pp2 ngram k6 adaptive K compiled``): the same
    server with that K. Not part of the full measurement."""
    words = name.split()
    ks = [w for w in words if _is_k(w) and int(w[1:]) >= 1]
    if len(ks) != 1 or words.index(ks[0]) != 2 or words[1] != "ngram":
        return None
    if " ".join(w for w in words if w != ks[0]) not in CONFIGS:
        return None
    return _config(name)


CONFIGS: dict[str, Config] = {
    n: _config(n)
    for n in (
        *(
            f"pp{pp} {spec} {mode}"
            for pp in (1, 2)
            for spec in ("no spec", "ngram")
            for mode in ("eager", "compiled")
        ),
        "pp2 ngram adaptive K eager",
        "pp2 ngram adaptive K compiled",
    )
}


def spec_config(k: int = K) -> dict[str, Any]:
    from vllm_ppspec_tools.fixtures import spec_configs

    return spec_configs.real("ngram", k, target="", self_drafter="")


def serve_args(cfg: Config, model: str, k: int = K) -> list[str]:
    """``vllm serve`` arguments of ``cfg`` (the host and port come from
    fixtures.server); ngram's K is the configuration's own, else ``k``."""
    k = cfg.k if cfg.k is not None else k
    args = [model, "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN)]
    args += ["--served-model-name", SERVED_NAME]
    if cfg.eager:
        args.append("--enforce-eager")
    if cfg.pp > 1:
        args += ["--pipeline-parallel-size", str(cfg.pp), "--distributed-executor-backend", "mp"]
        if cfg.eager and not cfg.spec:  # vLLM's own eager PP fails on CPU
            args += ["--worker-cls", WORKER_CLS]
    if cfg.spec:
        args += ["--speculative-config", json.dumps(spec_config(k))]
    return args


def serve_env(cfg: Config) -> dict[str, str]:
    """One core per stage at PP=2, both cores at PP=1 (fixtures.run_offline.cpu_env);
    ``VLLM_PPSPEC_ADAPTIVE_K=1`` for the adaptive configurations."""
    from vllm_ppspec.sched.adaptive_k import ADAPTIVE_ENV
    from vllm_ppspec_tools.fixtures.run_offline import cpu_env

    return cpu_env(cfg.pp) | ({ADAPTIVE_ENV: "1"} if cfg.adaptive else {})


def selected(names: str | None) -> list[Config]:
    """The configurations ``--configs`` names (all by default), with a PP=1
    no-spec reference added if none is named (the outputs are checked against it)."""
    if not names:
        return list(CONFIGS.values())
    picked = [" ".join(n.split()) for n in names.split(",") if n.strip()]
    known = {n: CONFIGS.get(n) or variant(n) for n in picked}
    unknown = [n for n, c in known.items() if c is None]
    if unknown:
        raise SystemExit(
            f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)} "
            "(or an ngram one with its K after 'ngram': 'pp2 ngram k6 compiled')"
        )
    if not any(c.pp == 1 and not c.spec for c in known.values() if c is not None):
        print("adding 'pp1 no spec eager': the reference the outputs are checked against")
        known = {"pp1 no spec eager": CONFIGS["pp1 no spec eager"], **known}
    return [c for c in known.values() if c is not None]
