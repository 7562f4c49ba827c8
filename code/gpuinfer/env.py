"""Where the code runs: the device, smoke mode, and the provenance of a run.

Chapters run for real on a CUDA GPU. On a machine without one they still run end to end in
*smoke mode*: small sizes, host-clock timing, and a visible warning that the numbers are not
GPU results. Nothing in smoke mode may be presented as a GPU measurement.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import os
import platform
import shutil
import subprocess
import tempfile

import torch

SMOKE_WARNING = (
    "**Smoke mode: no CUDA device.** This run uses small sizes and a host clock so that "
    "the chapter can be executed end to end on a CPU. Its numbers are *not* GPU results; "
    "the recorded GPU run is in `book/_recorded/`."
)


def smoke_mode() -> bool:
    """True when no CUDA device is visible: chapters then shrink their sizes and warn."""
    return not torch.cuda.is_available()


def device() -> torch.device:
    """The device chapters run on: the current CUDA device, else the CPU (smoke mode)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# What a chapter may hold on its GPU, all its processes together (a 24 GB card's worth,
# the CUDA contexts included): every process a chapter starts caps its caching allocator
# below this (cap_gpu_memory), so the peak a recording reports is what a reader's card needs.
GPU_BUDGET_GIB = 22.0
# A process's own CUDA context (the driver's, outside the caching allocator), kept free of
# the allocator's cap: about 0.5 GiB on an H200 with torch 2.11's lazy module loading.
CONTEXT_GIB = 1.0


def cap_gpu_memory(budget_gib: float = GPU_BUDGET_GIB) -> float | None:
    """Cap this process's caching allocator at `budget_gib` less its CUDA context
    (CONTEXT_GIB), so the process stays within `budget_gib` on the device; returns the cap
    in GiB (None without CUDA). Past the cap the allocator frees what it caches and
    retries before it raises an out-of-memory error: a chapter that fits runs as before."""
    if not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    cap = budget_gib - CONTEXT_GIB
    if not 0 < cap * 2**30 <= total:
        raise ValueError(f"a GPU budget of {budget_gib:g} GiB leaves {cap:g} GiB for the "
                         f"allocator of this {total / 2**30:.0f} GiB device: give a budget "
                         f"above {CONTEXT_GIB:g} GiB and at most the device's memory")
    torch.cuda.set_per_process_memory_fraction(cap * 2**30 / total)
    return cap


def gpu_name() -> str | None:
    """The CUDA device's name as the driver reports it (e.g. 'NVIDIA H200'), or None."""
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def driver_version() -> str | None:
    """The NVIDIA driver version (e.g. '580.159.04') from nvidia-smi; None without it."""
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


CPUINFO = "/proc/cpuinfo"  # Linux's description of the host's CPUs


def cpuinfo() -> dict[str, str]:
    """Each field's first value in /proc/cpuinfo ({'model name': ..., 'cpu MHz': ...}),
    read once for `cpu_model` and `cpu_clock`; empty where there is no such file."""
    fields: dict[str, str] = {}
    try:
        with open(CPUINFO, encoding="utf8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if value.strip():
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model(info: dict[str, str] | None = None) -> str:
    """The host CPU's model as Linux names it ('model name' in /proc/cpuinfo, e.g. 'AMD
    EPYC 9654 96-Core Processor'); elsewhere what the platform says, else its architecture.
    `info`: `cpuinfo()` already read."""
    name = (cpuinfo() if info is None else info).get("model name")
    return name or platform.processor() or platform.machine() or "unknown"


def logical_cpus() -> int:
    """The logical CPUs this process may run on (its affinity, not the machine's count: a
    container or a job scheduler often gives a process fewer)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# Where a CPU clock is read, best first: the highest clock the kernel's frequency driver
# allows (kHz), the hardware's rated maximum (kHz), else the clock of the moment (MHz).
CPUFREQ = "/sys/devices/system/cpu/cpu0/cpufreq/"
CLOCK_SOURCES = ((CPUFREQ + "scaling_max_freq", "maximum (cpufreq scaling_max_freq)"),
                 (CPUFREQ + "cpuinfo_max_freq", "maximum (cpufreq cpuinfo_max_freq)"))


def cpu_clock(info: dict[str, str] | None = None) -> tuple[float | None, str | None]:
    """(the CPU's clock in GHz, which clock it is), or (None, None) where none is readable.
    The maximum from cpufreq where the kernel exposes it; else the 'cpu MHz' of
    /proc/cpuinfo, the clock of the moment (a VM often shows its nominal clock there).
    `info`: `cpuinfo()` already read."""
    for path, said in CLOCK_SOURCES:
        try:
            with open(path, encoding="utf8") as f:
                khz = float(f.read().strip())
        except (OSError, ValueError):
            continue
        if khz > 0:
            return round(khz / 1e6, 2), said
    try:
        mhz = float((cpuinfo() if info is None else info)["cpu MHz"])
    except (KeyError, ValueError):
        return None, None
    return round(mhz / 1e3, 2), "current (/proc/cpuinfo cpu MHz)"


def triton_version() -> str | None:
    """Triton's version (the compiler of torch.compile's GPU kernels and of Chapter 5's),
    from its package metadata, else from the module; None where it is not installed."""
    found = _version("triton") or _version("pytorch-triton")
    if found:
        return found
    try:
        import triton
    except Exception:  # not installed, or broken: either way no version to state
        return None
    return getattr(triton, "__version__", None)


def provenance() -> dict:
    """What produced a run: hardware (the GPU and the host CPU: host-bound figures, such as
    launch costs, depend on it), software versions and the date (UTC)."""
    props = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    info = cpuinfo()  # one parse for the model and the clock
    clock_ghz, clock_source = cpu_clock(info)
    return {
        "gpu": gpu_name(),
        "gpu_memory_gib": round(props.total_memory / 2**30, 1) if props else None,
        "sm_count": props.multi_processor_count if props else None,
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton_version(),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),  # the architecture, as before
        "cpu_model": cpu_model(info),
        "cpu_count": logical_cpus(),
        "cpu_clock_ghz": clock_ghz,
        "cpu_clock_source": clock_source,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "smoke": smoke_mode(),
    }


def host_text(info: dict) -> str:
    """The host CPU as a line ('AMD EPYC 9654 96-Core Processor, 16 logical CPUs, 3.7 GHz
    maximum (cpufreq ...)'); "not recorded" for a run that predates these fields."""
    if "cpu_model" not in info:
        return "not recorded"
    clock = (f"{info['cpu_clock_ghz']:g} GHz {info.get('cpu_clock_source') or ''}".strip()
             if isinstance(info.get("cpu_clock_ghz"), (int, float)) else "clock not readable")
    return f"{info['cpu_model']}, {info.get('cpu_count', '?')} logical CPUs, {clock}"


def announce() -> dict:
    """At the top of a chapter: cap this process's memory at GPU_BUDGET_GIB on a GPU
    (cap_gpu_memory), so the chapter runs on a card of that size, and warn loudly in
    smoke mode. What the run executes on is not shown here: the record command keeps it
    in the recording's provenance, and the page shows it in its "Recorded on" box.

    Returns the provenance dict, and the cap as "gpu_memory_cap_gib", so the chapter can
    glue its fields into the prose.
    """
    from IPython.display import Markdown, display

    cap = cap_gpu_memory()
    info = provenance()
    if info["smoke"]:
        display(Markdown(f":::{{warning}}\n{SMOKE_WARNING}\n:::"))
    return {**info, "gpu_memory_cap_gib": cap}


def sync() -> None:
    """Wait until the GPU has finished the work queued so far (on the CPU: nothing to wait
    for). Host clocks around GPU work need it on both sides."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def artifact_dir(chapter: str) -> str:
    """Folder where a chapter writes large artifacts (profiler traces).

    The record command points GPUINFER_ARTIFACTS at a staging folder and keeps what lands
    there beside the recording; otherwise (a CPU preview, a test) artifacts go to a scratch
    folder of this process (`scratch_dir`), so that a build never dirties the git tree.
    """
    root = os.environ.get("GPUINFER_ARTIFACTS") or _artifact_scratch()
    path = os.path.join(root, chapter)
    os.makedirs(path, exist_ok=True)
    return path


SCRATCH_PREFIX = "gpuinfer-"
# The file every scratch folder holds first, with the pid of the process that made it:
# clean-up deletes only folders that hold it, never a look-alike a person made by hand.
SCRATCH_MARKER = ".gpuinfer-scratch"


def scratch_dir(kind: str) -> str:
    """A new folder `gpuinfer-<pid>-<kind>-...` in the temporary directory, its marker
    (SCRATCH_MARKER) written first, removed when this process exits. One left behind by
    a process that was killed (no exit handler runs then) is removed by the next call,
    once its process is gone."""
    remove_stale_scratch()
    path = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{kind}-")
    with open(os.path.join(path, SCRATCH_MARKER), "w", encoding="utf8") as f:
        f.write(f"{os.getpid()}\n")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def remove_stale_scratch() -> list[str]:
    """Remove the scratch folders (`scratch_dir`: `gpuinfer-<pid>-...` holding the marker
    with that pid) of processes that no longer run; return their paths. A folder without
    the marker is not this package's: it stays, whatever its name."""
    removed = []
    for name in os.listdir(tempfile.gettempdir()):
        ours = name.startswith(SCRATCH_PREFIX)
        parts = name[len(SCRATCH_PREFIX):].split("-") if ours else []
        pid = next((int(p) for p in parts[:1] if p.isdigit()), None)
        if pid is None or pid == os.getpid() or _alive(pid):
            continue
        path = os.path.join(tempfile.gettempdir(), name)
        try:  # the marker, and the pid the folder's name says in it
            with open(os.path.join(path, SCRATCH_MARKER), encoding="utf8") as f:
                marked = f.read(32).strip() == str(pid)
        except OSError:
            marked = False
        if os.path.islink(path) or not marked:  # not made by scratch_dir: not ours
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@functools.cache
def _artifact_scratch() -> str:
    return scratch_dir("artifacts")
