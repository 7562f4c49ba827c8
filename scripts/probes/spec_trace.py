"""Probe (issue 47): where a verify pass's time goes, kernel by kernel: the step and the
pass of T tokens traced, each kernel charged with its end minus the end before it (under
PDL a kernel's own duration includes its wait).

    PYTHONPATH=code python scripts/probes/spec_trace.py
"""

import collections

import torch

from gpuinfer.decode.speculative import repeatable
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.kernels.common import compile_ahead
from gpuinfer.measure.profiling import profile_steps
from gpuinfer.report.kernel_names import kernel_name
from gpuinfer.report.trace import step_kernels
from spec_rows import BF16, ONE_TILE, START, TARGET, config, prompt

from gpuinfer.model.configs import build_model


def gaps(trace, steps=5):
    """kernel name -> (launches a step, lag, duration, charge), the last three µs a
    launch averaged over steps 2..steps (the first follows the trace's start): its
    start minus the end of the kernel before it (negative under PDL: resident before
    that one ended), its start to its end (with PDL its wait included), and its charge,
    its end minus the end before it."""
    lag, dur, charge = (collections.defaultdict(list) for _ in range(3))
    for i in range(2, steps + 1):
        ks = sorted((e for e in step_kernels(trace, i) if e.cat == "kernel"),
                    key=lambda e: e.end)
        prev = ks[0].ts
        for e in ks:
            name = kernel_name(e.name)
            lag[name].append(e.ts - prev)
            dur[name].append(e.end - e.ts)
            charge[name].append(e.end - prev)
            prev = e.end
    n = steps - 1
    return {name: (len(v) / n, sum(v) / len(v), sum(dur[name]) / len(v),
                   sum(charge[name]) / len(v)) for name, v in lag.items()}


def charged(trace, steps=5):
    """kernel name -> µs a step charged to its launches (`gaps`)."""
    return {name: count * ch for name, (count, _, _, ch) in gaps(trace, steps).items()}


def main():
    tm = build_model(config(TARGET), seed=0, dtype=BF16, device="cuda")
    for label, cfg in (("base", {}), ("one tile", ONE_TILE)):
        dec = TritonDecoder(tm, capacity=256, max_query=5, configs=cfg)
        dec.prefill(prompt(128, 8192))
        out = {}
        for q in (1, 5):
            fn = dec.device_step if q == 1 else (lambda: dec.verify_step(5))
            compile_ahead(fn)
            rep = repeatable(dec.pos, START + q - 1, fn)
            with torch.no_grad():
                out[q] = charged(profile_steps(rep, steps=6, head_start=True), 6)
        names = sorted(set(out[1]) | set(out[5]), key=lambda n: -out[5].get(n, 0))
        print(f"--- {label}: step {sum(out[1].values()):.1f} µs, T=5 "
              f"{sum(out[5].values()):.1f} µs")
        for n in names:
            print(f"{n[:40]:40s} {out[1].get(n, 0):8.1f} {out[5].get(n, 0):8.1f}")


if __name__ == "__main__":
    main()
