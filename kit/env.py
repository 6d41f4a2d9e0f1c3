"""Where the kit runs: Colab or not, smoke mode, the GPU, Google Drive, secrets. No other kit module is imported.

    in_colab(), smoke()             Colab? KIT_SMOKE=1 (the notebooks' CPU smoke mode, used by CI)
    gpu_summary()                   "NVIDIA A100-SXM4-40GB, 39.6 GiB" or a clear line on a CPU runtime
    require_gpu(preset)             stop full mode on a CPU runtime with how to switch it
    mount_drive(), flush_drive()    Google Drive (only in Colab); None elsewhere
    drive_mounted(), unmounted_drive(path)  Drive really mounted (a mount point), a path on an unmounted Drive
    secret("ANTHROPIC_API_KEY")     from the environment or Colab secrets; never printed
    secret_status(name)             "found", "not set", or "grant access" (a Colab secret this notebook may not read)
    release_freed_memory()          hand the C heap's freed blocks back to the OS (glibc; a no-op elsewhere)
    cpu_bf16()                      whether this CPU computes bf16 natively, from its own flags (which ones, why)
    data_path("rows.jsonl")         a relative data path: as given, else in data/ ($KIT_DATA_DIR), else None
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

DRIVE_ROOT = "/content/drive"


def release_freed_memory() -> None:
    """Return the freed blocks of the C heap to the operating system (glibc's malloc_trim); a no-op without glibc.

    On a CPU, torch takes tensors under glibc's mmap threshold (which grows to 32 MB) from the heap, and glibc keeps
    what a forward frees for later: one micro-batch of long rows (the activations of ~1,200 tokens of a 0.5B model
    are gigabytes) leaves the process that much bigger, and the next phase's tensors, of other sizes, do not fit in
    the holes. bench/memory_phases.py measures a tool-round step's resident peak with and without this.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    import ctypes

    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # macOS, Windows (no such library), musl (no such call)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


# The CPU flags that mean bf16 matmuls run in hardware: x86's AVX512-BF16 and AMX-BF16 (Linux /proc/cpuinfo names),
# ARM's BF16 extension (Linux "Features: bf16", macOS hw.optional.arm.FEAT_BF16). Without them torch computes bf16 by
# converting to fp32 and back: measured on an AVX2-only AMD EPYC (bench/README.md, "CPU step"), a 0.5B model's bf16
# forward of 8 x 64 tokens took 6.4x and a decoding step 1.55x the fp32 time.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


@dataclass(frozen=True)
class CpuBf16:
    native: bool  # bf16 matmuls in hardware
    flags: tuple[str, ...]  # the bf16 flags found (empty: none)
    source: str  # where they were read: /proc/cpuinfo, sysctl, or why nothing could be read


def cpu_bf16(cpuinfo: str | None = None) -> CpuBf16:
    """Whether this CPU computes bf16 natively, read from its own flags (`cpuinfo`: a /proc/cpuinfo text, for tests)."""
    if cpuinfo is None:
        return _cpu_bf16_here()
    words = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):  # x86 "flags", ARM "Features"
            words.update(value.split())
    found = tuple(f for f in BF16_FLAGS if f in words)
    return CpuBf16(bool(found), found, "/proc/cpuinfo")


@functools.cache
def _cpu_bf16_here() -> CpuBf16:
    try:
        return cpu_bf16(Path("/proc/cpuinfo").read_text())
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                                 timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        return CpuBf16(out == "1", ("FEAT_BF16",) if out == "1" else (), "sysctl")
    return CpuBf16(False, (), f"no CPU flags readable on {platform.system() or 'this system'}")


def data_dir() -> Path:
    """Where a user's own data lives: $KIT_DATA_DIR, else `data/` of the current folder when it exists, else `data/`
    at the top of this checkout (data/README.md)."""
    if os.environ.get("KIT_DATA_DIR"):
        return Path(os.environ["KIT_DATA_DIR"])
    here = Path.cwd() / "data"
    return here if here.is_dir() else Path(__file__).resolve().parents[1] / "data"


def data_path(path: str | Path) -> Path | None:
    """A data file named by the user: the path as given when it exists, else a relative one found in data_dir(),
    else None (the caller may look among the bundled files, then say what is missing)."""
    given = Path(path).expanduser()
    if given.exists():
        return given
    if not given.is_absolute() and (data_dir() / given).exists():
        return data_dir() / given
    return None


def in_colab() -> bool:
    try:
        import google.colab  # noqa: F401

        return True
    except ImportError:
        return False


def smoke() -> bool:
    """KIT_SMOKE=1: notebooks switch to the tiny CPU preset and a few steps (how CI runs them)."""
    return os.environ.get("KIT_SMOKE", "") not in ("", "0", "false", "False")


def gpu_summary() -> str:
    import torch

    if not torch.cuda.is_available():
        return ("no GPU: this runtime has only a CPU. In Colab choose Runtime > Change runtime type > GPU "
                "(A100 for the paper's recipe, T4 for colab_t4). The CPU presets run here: smol_writing and coder_code "
                "(real models, minutes a step), tiny_cpu (the built-in tiny model, seconds)")
    props = torch.cuda.get_device_properties(0)
    return f"{props.name}, {props.total_memory / 2**30:.1f} GiB"


def drive_mounted(root: str | None = None) -> bool:
    """Is Google Drive mounted at `root` (Colab's /content/drive): a mount point, not merely a folder? After
    `flush_drive()` unmounts it, the path can still exist (or be made again) as a plain folder of this disk."""
    return os.path.ismount(root or DRIVE_ROOT)


def unmounted_drive(path: str | Path) -> bool:
    """Does `path` lie under Colab's Drive mount point while Drive is not mounted there? Then a file written there
    stays on this runtime's disk, and what is read there is not Drive. Paths elsewhere (any folder used as a
    mirror outside Colab) are never "unmounted"."""
    root, path = os.path.abspath(DRIVE_ROOT), os.path.abspath(path)
    return (path == root or path.startswith(root + os.sep)) and not drive_mounted(root)


def mount_drive(root: str | None = None, log=print) -> Path | None:
    """Mount Google Drive (when it is not mounted already: a mount point, not a folder); outside Colab say so in
    one line and return None. Files that an earlier cell wrote to the mount path while Drive was unmounted are
    moved aside first (Colab refuses to mount over them), and said."""
    if not in_colab():
        log("[kit] not in Colab: no Drive, runs stay on this disk")
        return None
    root = Path(root or DRIVE_ROOT)
    if not drive_mounted(str(root)):
        if root.is_dir() and any(root.iterdir()):
            import time

            aside = root.with_name(f"{root.name}_not_on_drive_{time.strftime('%Y%m%d_%H%M%S')}")
            root.rename(aside)
            log(f"[kit] {root} held files written while Drive was not mounted (they never reached Drive): moved to "
                f"{aside}")
        from google.colab import drive

        drive.mount(str(root))
    return root / "MyDrive"


def flush_drive(root: str | None = None, log=print, checked: str = "") -> bool:
    """Make sure everything written to Drive is uploaded (Colab only), then unmount it: said, with how to mount it
    again (a later cell that trains or reads the run on Drive needs it). `checked`: what the caller verified on Drive
    (kit.colab.flush_drive checks the run's copy first), added to the line. True when Drive was flushed."""
    root = root or DRIVE_ROOT
    if not (in_colab() and drive_mounted(root)):
        return False
    from google.colab import drive

    drive.flush_and_unmount()
    log("[kit] Drive flushed and UNMOUNTED: every file written to Drive is uploaded." + checked + " To train longer "
        "or resume in this runtime, run the Drive cell again (colab.mount_drive()) first; without it nothing is "
        "backed up")
    return True


def secret(name: str, log=print) -> str | None:
    """A secret from the environment or Colab's secrets panel, or None. The value is never printed or logged,
    and a panel secret is returned, never exported to os.environ: it then lives only in the object that uses it
    (the judge's SDK client), not in this process's /proc/<pid>/environ nor in any child's environment.
    A panel secret this notebook may not read is said in one line (how to grant access)."""
    value, why = _lookup(name)
    if why == "no access":
        log(f"[kit] {secret_status(name)}")
    return value


def secret_status(name: str) -> str:
    """00_setup's line about a secret: found, not set, or set in Colab but not granted to this notebook."""
    value, why = _lookup(name)
    if value:
        return f"{name}: found"
    if why == "no access":
        return (f"{name} is in Colab's secrets but this notebook may not read it: grant access (the key icon on "
                "the left, switch 'Notebook access' on for it), then run this cell again")
    if why:
        return f"{name}: Colab's secrets could not be read ({why})"
    return f"{name}: not set"


def _lookup(name: str) -> tuple[str | None, str | None]:
    """(value, None), or (None, why): why is None when the secret is simply not set."""
    value = os.environ.get(name)
    if value or not in_colab():
        return value or None, None
    try:
        from google.colab import userdata

        return userdata.get(name) or None, None
    except Exception as err:  # google.colab.userdata: SecretNotFoundError, NotebookAccessError, TimeoutException
        kind = type(err).__name__
        if kind == "SecretNotFoundError":
            return None, None
        if kind == "NotebookAccessError":
            return None, "no access"
        return None, f"{kind}: {err}"


CPU_PRESET_PREFIXES = ("tiny", "smol", "coder")  # presets sized for a laptop CPU (tiny, SmolLM2-135M, the 0.5B coder)


class GPUNeeded(RuntimeError):
    """A preset made for a GPU asked for on a machine without one."""


def cpu_advice(task: str | None = None, cli: bool = False) -> str:
    """What to run on a CPU instead: a preset with a task its built-in tiny model learns there (it has never read
    text, so code or writing stays at reward 0 however long it trains)."""
    if cli:
        return ("To try the kit on a CPU: --preset tiny_cpu (the tiny model on its toy task, a minute) or --preset "
                "tiny_hanabi (a small card game); a real pretrained team: --preset smol_writing, smol_code or "
                "smol_hanabi (SmolLM2-135M, minutes); a code team that passes tests: --preset coder_code "
                "(Qwen2.5-Coder-0.5B, 2-3 minutes a step).")
    if task == "game":
        return ("To try the kit on a CPU, set PRESET = 'tiny_hanabi' and TASK_ARGS = {'game': 'tiny_hanabi', "
                "'prompt_style': 'compact'} (the tiny model learns that small game in a minute)")
    return ("To try the kit on a CPU, set PRESET = 'tiny_cpu' with TASK = None (the preset's: the tiny model learns "
            "its toy task in a minute; it cannot learn code or writing), or for a real pretrained team PRESET = "
            "'smol_writing' (SmolLM2-135M on TLDR, minutes), or a code team that passes tests: PRESET = 'coder_code' "
            "(Qwen2.5-Coder-0.5B, 2-3 minutes a step)")


def require_gpu(preset: str, task: str | None = None, cli: bool = False) -> None:
    """Full mode on a CPU runtime would load a billion-parameter model in fp32 and crawl: stop with the way out
    (for a notebook's `task`, or the command line's flags)."""
    import torch

    if not preset.startswith(CPU_PRESET_PREFIXES) and not torch.cuda.is_available():
        smoke_mode = "" if cli else (", or use smoke mode: in Colab, add a cell at the top with `%env KIT_SMOKE=1` and "
                                     "Run all (a shell: export KIT_SMOKE=1).")
        raise GPUNeeded(f"preset {preset!r} needs a GPU and this runtime has none. In Colab: Runtime > Change "
                        "runtime type > GPU (A100 for colab_a100, T4 for colab_t4), then Run all again. "
                        f"{cpu_advice(task, cli)}{smoke_mode}")
