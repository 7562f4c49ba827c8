"""Probe (issue 57): where a chained tensor-core pass's time goes in the whole pass.

pass_chains.py (H100, 2026-12-05 14:47 UTC) took every product of Chapter 6's target
to 1.03-1.34x the step's kernel alone (down 1.74x), which predicts a pass of 5 tokens
~90 µs over the step; whole, it cost 154 µs more (1.561 steps), and 93 µs more than its
own pass of 2 tokens. Here the step and the passes of 2 and 5 tokens of the rule's
tiling and of that best tiling are traced (6 replays), each kernel charged with its end
minus the end before it (under PDL a kernel's duration includes its wait), summed a
pass by kernel name; and the best with the target's down (2816 columns: 3 tiles, two
of them loaded after the PDL wait) split in 3, one tile a split, all before the wait.

    PYTHONPATH=code timeout 200 python scripts/probes/pass_trace.py   # 42 s on an H100 with 2
    # variants; ~70 s with 4 (estimate)
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_mma as sm  # noqa: E402  TARGET, config, prompt, START, CAPACITY
from spec_trace import charged  # noqa: E402
from gpuinfer.decode.speculative import repeatable  # noqa: E402
from gpuinfer.decode.triton_pass import MmaPassDecoder  # noqa: E402
from gpuinfer.kernels.common import compile_ahead  # noqa: E402
from gpuinfer.kernels.pass_mma import MmaConfig as M  # noqa: E402
from gpuinfer.measure.profiling import profile_steps  # noqa: E402
from gpuinfer.model.configs import build_model  # noqa: E402

# pass_chains.py's best at the target, T = 5 (each product alone)
BEST = {"qkv": M(8, 1024, 1, 4, 2, 8), "o": M(8, 1024, 1, 4, 2, 16),
        "gate_up": M(8, 1024, 1, 4, 2, 16), "down": M(8, 1024, 1, 4, 2, 8),
        "lm_head": M(32, 256, 1, 4, 2, 1)}
STEPS = 6


def main():
    model = build_model(sm.config(sm.TARGET), seed=0, dtype=sm.BF16, device="cuda")
    out = {}
    variants = (("rule", None), ("best", BEST),
                ("down split 3", {**BEST, "down": M(8, 1024, 3, 4, 1, 16)}),
                ("down 16r split 3", {**BEST, "down": M(16, 1024, 3, 4, 1, 16)}))
    for label, tiling in variants:
        dec = MmaPassDecoder(model, capacity=sm.CAPACITY, max_query=5,
                             pass_tiling=tiling)
        dec.prefill(sm.prompt(sm.PROMPT, sm.VOCAB))
        for q in (1, 2, 5):
            if label != "rule" and q == 1:
                continue
            fn = dec.device_step if q == 1 else (lambda q=q: dec.verify_step(q))
            compile_ahead(fn)
            rep = repeatable(dec.pos, sm.START + q - 1, fn)
            with torch.no_grad():
                out[label, q] = charged(profile_steps(rep, steps=STEPS, head_start=True),
                                        STEPS)
            print(f"{label} T={q}: traced", flush=True)
    cols = list(out)
    names = sorted({n for p in out.values() for n in p},
                   key=lambda n: -out["best", 5].get(n, 0))
    print(f"{'kernel (µs a pass)':36s}" + "".join(f"{str(c):>26s}" for c in cols))
    for n in names:
        print(f"{n[:36]:36s}" + "".join(f"{out[c].get(n, 0):26.1f}" for c in cols))
    print(f"{'total':36s}" + "".join(f"{sum(out[c].values()):26.1f}" for c in cols))


if __name__ == "__main__":
    main()
