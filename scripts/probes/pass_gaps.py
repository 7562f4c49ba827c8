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
would fit beside down's and the pass's would not. (Measured: it starts as early
as the step's; NOTES-57, the `pass_gaps.py` section.)

    PYTHONPATH=code timeout 120 python scripts/probes/pass_gaps.py [T ...]

The token counts T default to 1, 2 and 5; `4 5` shows which kernels make the pass of 5
tokens cost 15 % of a step more than the pass of 4 (Chapter 6's H100 recording of
2026-12-07: 255 against 296 µs).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_mma as sm  # noqa: E402  TARGET, config, prompt, START, CAPACITY, ready
from gpuinfer.decode.triton_pass import MmaPassDecoder  # noqa: E402
from gpuinfer.measure.profiling import profile_steps  # noqa: E402
from gpuinfer.model.configs import build_model  # noqa: E402
from spec_trace import gaps  # noqa: E402  (lag, duration, charge a launch)

STEPS = 6


def main():
    model = build_model(sm.config(sm.TARGET), seed=0, dtype=sm.BF16, device="cuda")
    dec = MmaPassDecoder(model, capacity=sm.CAPACITY, max_query=8)
    with torch.no_grad():
        dec.prefill(sm.prompt(sm.PROMPT, model.config.vocab_size))
        for q in [int(t) for t in sys.argv[1:]] or (1, 2, 5):
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
