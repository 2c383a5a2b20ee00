"""The configurations ``vllm-ppspec-bench-serve`` starts (bench_serve): their
names, ``vllm serve`` arguments and environment, and ``--configs``' selection.

PP=1 and PP=2, no spec and ngram (k=3, prompt lookup 2-5 tokens, as the demo),
eager and compiled, and PP=2 + ngram with the plugin's adaptive K
(:data:`CONFIGS`: the full measurement). An ngram configuration named with its
own K after ``ngram`` (``pp2 ngram k6 adaptive K compiled``; :func:`variant`)
runs that K. A ``suffix`` configuration (``pp2 suffix compiled``, ``pp1 suffix
k8 compiled``) runs suffix decoding (arctic-inference) in ngram's place:
:func:`spec_config`. A PP=2 + spec name may end with ``split=A:B`` (``pp2
ngram k6 adaptive K compiled split=19:11``): that server runs with
``VLLM_PP_LAYER_PARTITION=A,B``, the target's layer split the user sets
(:func:`with_split`).

``draft`` in ngram's place (``pp1 draft compiled``, ``pp2 draft adaptive K
compiled``) runs ``draft_model`` with the workload's drafter: the real pair
(``--model qwen-coder``: Qwen2.5-Coder-1.5B drafted by its 0.5B sibling;
:data:`WORKLOADS`); ``draft first`` (``pp2 draft first eager``) runs it on the
first PP stage (``VLLM_PPSPEC_DRAFTER_STAGE=first``), and a PP=2 ``draft``
without it on the last (``=last``, vLLM's place), whatever the default puts
where: each name holds one placement.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

SERVED_NAME = "smollm2"
# --model: the served names of the workloads (bench_serve.workload).
WORKLOADS = ("smollm2", "qwen-coder")
MAX_MODEL_LEN = 1024
K = 3
SUFFIX_K = 16  # suffix decoding's K where the name gives none
WORKER_CLS = "vllm_ppspec.worker.PPSpecWorker"


@dataclass(frozen=True)
class Config:
    name: str
    pp: int
    spec: bool
    eager: bool
    adaptive: bool = False
    k: int | None = None  # the name's K; None: the run's ``-k`` (ngram), SUFFIX_K
    method: str = "ngram"
    split: str | None = None  # VLLM_PP_LAYER_PARTITION, where the name sets it
    drafter_first: bool = False  # VLLM_PPSPEC_DRAFTER_STAGE=first ("draft first")

    def describe(self) -> dict[str, Any]:
        return {
            "pp": self.pp,
            "spec": self.spec,
            "eager": self.eager,
            "adaptive": self.adaptive,
            **({"k": self.k} if self.k is not None else {}),
            **({"method": self.method} if self.method != "ngram" else {}),
            **({"split": self.split} if self.split is not None else {}),
            **({"drafter_stage": self.drafter_stage} if self.drafter_stage else {}),
        }

    @property
    def drafter_stage(self) -> str | None:
        """``VLLM_PPSPEC_DRAFTER_STAGE`` for a PP draft model configuration."""
        if self.method != "draft_model" or self.pp < 2:
            return None
        return "first" if self.drafter_first else "last"


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
        {"suffix": "suffix", "draft": "draft_model"}.get(spec.split()[0], "ngram"),
        drafter_first=spec.startswith("draft first"),
    )


def variant(name: str) -> Config | None:
    """A configuration of :data:`CONFIGS` with ngram's K in its name (``pp2
    ngram k6 compiled``, ``pp2 ngram k6 adaptive K compiled``): the same
    server with that K; or one with ``suffix`` in ngram's place (``pp2 suffix
    compiled``, ``pp2 suffix k8 compiled``): suffix decoding; or ``draft``
    (``pp2 draft compiled``, ``pp2 draft adaptive K compiled``): the
    workload's draft model. Not part of the full measurement."""
    words = name.split()
    if len(words) < 3 or words[1] not in ("ngram", "suffix", "draft"):
        return None
    ks = [w for w in words if _is_k(w) and int(w[1:]) >= 1]
    if len(ks) > 1 or (ks and words.index(ks[0]) != 2):
        return None
    if "first" in words:  # the draft model on the first stage: "pp2 draft first ..."
        if words[1] != "draft" or words.index("first") != 2 + len(ks) or words[0] == "pp1":
            return None
        words = [w for w in words if w != "first"]
    if words[1] == "ngram" and not ks:
        return None
    base = ["ngram" if w in ("suffix", "draft") else w for w in words if w not in ks]
    if " ".join(base) not in CONFIGS or (words[1] == "suffix" and "adaptive" in words):
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


def with_split(name: str) -> Config | None:
    """A PP + spec configuration (of :data:`CONFIGS` or a :func:`variant`) whose
    name ends with ``split=A:B``, one count per stage: that server with
    ``VLLM_PP_LAYER_PARTITION=A,B``. Not part of the full measurement."""
    *words, last = name.split()
    if not last.startswith("split="):
        return None
    base = " ".join(words)
    cfg = CONFIGS.get(base) or variant(base)
    counts = last[len("split=") :].split(":")
    if cfg is None or not cfg.spec or cfg.pp < 2 or len(counts) != cfg.pp:
        return None
    if not all(c.isdigit() and int(c) > 0 for c in counts):
        return None
    return dataclasses.replace(cfg, name=name, split=",".join(counts))


def spec_config(k: int = K, method: str = "ngram", drafter: str = "") -> dict[str, Any]:
    """ngram as the demo; ``draft_model`` with ``drafter``; or suffix decoding
    with vLLM's defaults but no cross-request cache
    (``suffix_decoding_max_cached_requests`` 0): the bench sends each prompt
    more than once, and a cache of earlier responses would replay them instead
    of drafting from the request's own prompt and output."""
    from vllm_ppspec_tools.fixtures import spec_configs

    if method == "draft_model":
        if not drafter:
            raise SystemExit("a 'draft' configuration needs a workload with a drafter")
        return {"method": "draft_model", "model": drafter, "num_speculative_tokens": k}
    if method == "suffix":
        return {
            "method": "suffix",
            "num_speculative_tokens": k,
            "suffix_decoding_max_cached_requests": 0,
        }
    return spec_configs.real("ngram", k, target="", self_drafter="")


def serve_args(
    cfg: Config, model: str, k: int = K, drafter: str = "", served: str = SERVED_NAME
) -> list[str]:
    """``vllm serve`` arguments of ``cfg`` (the host and port come from
    fixtures.server); the K is the configuration's own, else ``k`` (ngram,
    draft) or :data:`SUFFIX_K` (suffix)."""
    if cfg.k is not None:
        k = cfg.k
    elif cfg.method == "suffix":
        k = SUFFIX_K
    args = [model, "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN)]
    args += ["--served-model-name", served]
    if cfg.eager:
        args.append("--enforce-eager")
    if cfg.pp > 1:
        args += ["--pipeline-parallel-size", str(cfg.pp), "--distributed-executor-backend", "mp"]
        if plugin_worker(cfg) and not cfg.spec:  # vLLM's own eager PP fails on CPU
            args += ["--worker-cls", WORKER_CLS]
    if cfg.spec:
        args += ["--speculative-config", json.dumps(spec_config(k, cfg.method, drafter))]
    return args


def plugin_worker(cfg: Config) -> bool:
    """The plugin's worker serves ``cfg``: PP + spec (it selects itself), and eager
    PP without spec (named: vLLM's own eager PP fails on CPU)."""
    return cfg.pp > 1 and (cfg.spec or cfg.eager)


def serve_env(cfg: Config) -> dict[str, str]:
    """One core per stage at PP=2, both cores at PP=1 (fixtures.run_offline.cpu_env);
    ``VLLM_PPSPEC_ADAPTIVE_K=1`` for the adaptive configurations;
    ``VLLM_PPSPEC_DRAFTER_STAGE`` for a PP draft model (:attr:`Config.drafter_stage`);
    ``VLLM_PP_LAYER_PARTITION`` where the name sets a split;
    ``VLLM_SERVER_DEV_MODE=1`` where the plugin's worker serves, so that the bench
    reads each stage's runner clocks (``/collective_rpc``)."""
    from vllm_ppspec.choice.policy import ADAPTIVE_K_ENV, SPLIT_ENV
    from vllm_ppspec_tools.fixtures.run_offline import cpu_env

    env = cpu_env(cfg.pp) | ({ADAPTIVE_K_ENV: "1"} if cfg.adaptive else {})
    env |= {"VLLM_PPSPEC_DRAFTER_STAGE": cfg.drafter_stage} if cfg.drafter_stage else {}
    env |= {"VLLM_SERVER_DEV_MODE": "1"} if plugin_worker(cfg) else {}
    return env | ({SPLIT_ENV: cfg.split} if cfg.split else {})


def selected(names: str | None) -> list[Config]:
    """The configurations ``--configs`` names (all by default), with a PP=1
    no-spec reference added if none is named (the outputs are checked against it)."""
    if not names:
        return list(CONFIGS.values())
    picked = [" ".join(n.split()) for n in names.split(",") if n.strip()]
    known = {n: CONFIGS.get(n) or variant(n) or with_split(n) for n in picked}
    unknown = [n for n, c in known.items() if c is None]
    if unknown:
        raise SystemExit(
            f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)} "
            "(or an ngram one with its K after 'ngram': 'pp2 ngram k6 compiled'; or "
            "suffix decoding: 'pp2 suffix compiled', 'pp2 suffix k8 compiled'; or the "
            "workload's draft model: 'pp2 draft compiled'; a PP=2 + "
            "spec one may end with a layer split: '... compiled split=19:11')"
        )
    if not any(c.pp == 1 and not c.spec for c in known.values() if c is not None):
        print("adding 'pp1 no spec eager': the reference the outputs are checked against")
        known = {"pp1 no spec eager": CONFIGS["pp1 no spec eager"], **known}
    return [c for c in known.values() if c is not None]
