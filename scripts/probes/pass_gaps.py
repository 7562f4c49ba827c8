"""Probe (issue 57): why the target's q/k/v product costs more inside a pass than alone.

With the pass's norm rounded by cvt (H100, 2026-12-06 14:30 UTC), a pass of 5 tokens
charged q/k/v 81.6 µs (end minus the end before it, 16 layers: 5.1 a launch) against
2.7 µs a launch alone (`pass_breakdown.py`, back to back), while the step's q/k/v
charges what it costs alone (35.7: 2.2 a launch). Here each kernel of the step and of
the passes of 2 and 5 tokens is traced (6 replays, `profile_steps`, head start), and
for each kernel name, per launch: its start minus the end of the kernel before it
(negative: it became resident before that one ended, as PDL allows), its duration
(start to end: with PDL its wait included) and its charge. If q/k/v starts only once
down has ended, its weights are not loaded ahead: the step's q/k/v, smaller programs,
would fit beside down's and the pass's would not.

    PYTHONPATH=code timeout 120 python scripts/probes/pass_gaps.py
"""
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_mma as sm  # noqa: E402  TARGET, config, prompt, START, CAPACITY, ready
from gpuinfer.decode.triton_pass import MmaPassDecoder  # noqa: E402
from gpuinfer.measure.profiling import profile_steps  # noqa: E402
from gpuinfer.model.configs import build_model  # noqa: E402
from gpuinfer.report.kernel_names import kernel_name  # noqa: E402
from gpuinfer.report.trace import step_kernels  # noqa: E402

STEPS = 6


def gaps(trace, steps):
    """kernel name -> (launches a step, lag µs, duration µs, charge µs), means a launch
    over steps 2..steps (the first step follows the head start)."""
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


def main():
    model = build_model(sm.config(sm.TARGET), seed=0, dtype=sm.BF16, device="cuda")
    dec = MmaPassDecoder(model, capacity=sm.CAPACITY, max_query=8)
    with torch.no_grad():
        dec.prefill(sm.prompt(sm.PROMPT, model.config.vocab_size))
        for q in (1, 2, 5):
            rep = sm.ready(dec, q)  # compiled ahead, from a fixed position
            per = gaps(profile_steps(rep, steps=STEPS, head_start=True), STEPS)
            print(f"{torch.cuda.get_device_name()} target T={q}: per launch, µs "
                  "(start - previous end / duration / charge), launches a pass",
                  flush=True)
            for name, (count, lag, dur, ch) in sorted(per.items(),
                                                     key=lambda x: -x[1][0] * x[1][3]):
                print(f"  {name:24s} x{count:4.1f}  lag {lag:6.2f}  dur {dur:6.2f}  "
                      f"charge {ch:6.2f}  (charge a pass {count * ch:6.1f})",
                      flush=True)


if __name__ == "__main__":
    main()
