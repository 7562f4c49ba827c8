"""Probe (issue 56): does a launch probe beside each round tell which pace the host is
in, and does pinning the process to one core keep it in one pace?

`host_pace.py` found the lean loop's typical step (small model, FP32, 4096-token prompt)
at ~4.2 ms in some stretches and ~7-8 ms in others, in one process, whatever ran beside
it. Here every round is one 16-token lean generation with, right before it, a launch
probe (`launch_us`: host µs per tiny kernel launch, ~30 ms), and, after it, the core the
process ran on and that core's clock. Phases:

  free    the process may run on any core (as the chapters do today), ROUNDS rounds;
  pinned  the process pinned to the core it started the phase on, ROUNDS rounds;
  free    again, to see the switch happen either way.

Printed per round: seconds since start, launch µs, lean ms (typical step), core, MHz;
per phase: median and range of both, and the rank correlation between them. If the
launch µs separates the two paces (the correlation near 1), Chapter 2 can time it beside
every round and report each host-bound figure with the pace it ran at; if pinning keeps
one pace, `measuring.py` pins instead (and that stales all six chapters).
Usage on the GPU: python scripts/probes/host_pace_rounds.py [ROUNDS]  (~3 min at 40)
"""

import functools
import os
import statistics
import sys
import time

import torch

from gpuinfer.decode import loops as dec
from gpuinfer.measure.launch import launch_us
from gpuinfer.measure.rounds import split_rounds
from gpuinfer.model.configs import build_model, model_config, random_prompt

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
# On a CPU: a dry run of the code path (a short prompt), not a measurement.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT = 4096 if DEVICE == "cuda" else 64
START = time.perf_counter()


def core_and_mhz() -> tuple[int, float]:
    """The core this process last ran on (/proc/self/stat field 39) and its clock."""
    with open("/proc/self/stat") as f:
        core = int(f.read().rsplit(")", 1)[1].split()[36])
    try:
        with open(f"/sys/devices/system/cpu/cpu{core}/cpufreq/scaling_cur_freq") as f:
            return core, int(f.read()) / 1000
    except OSError:
        return core, float("nan")


def ranks(xs):
    order = sorted(range(len(xs)), key=xs.__getitem__)
    r = [0] * len(xs)
    for i, j in enumerate(order):
        r[j] = i
    return r


def spearman(a, b) -> float:
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def phase(tag: str, lean) -> None:
    rows = []
    for _ in range(ROUNDS):
        probe = launch_us(200, device=DEVICE, rounds=10).median
        typical = split_rounds({"lean": lean}, 16, rounds=1).typical["lean"].median
        core, mhz = core_and_mhz()
        rows.append((time.perf_counter() - START, probe, typical, core, mhz))
    print(f"\n{tag}: t s, launch us, lean ms, core, MHz", flush=True)
    for t, probe, typical, core, mhz in rows:
        print(f"  {t:6.1f} {probe:7.2f} {typical:7.2f} {core:4d} {mhz:7.0f}")
    probes, steps = [r[1] for r in rows], [r[2] for r in rows]
    spread = lambda xs: f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"
    print(f"  launch {spread(probes)} us, lean {spread(steps)} ms,"
          f" rank correlation {spearman(probes, steps):.2f},"
          f" cores {sorted({r[3] for r in rows})}", flush=True)


torch.set_float32_matmul_precision("highest")
model = build_model(model_config("small"), seed=0, device=DEVICE,
                    attn_implementation="eager")
prompt = random_prompt(model.config, PROMPT, device=DEVICE)
lean16 = functools.partial(dec.LOOPS["lean"], model, prompt, 16)
lean16()  # warm-up: allocator, cuBLAS handles
print(f"{os.cpu_count()} cores; allowed {sorted(os.sched_getaffinity(0))}", flush=True)
allowed = os.sched_getaffinity(0)
phase("free", lean16)
os.sched_setaffinity(0, {core_and_mhz()[0]})
phase("pinned", lean16)
os.sched_setaffinity(0, allowed)
phase("free again", lean16)
