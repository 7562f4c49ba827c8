"""Probe (issue 58): where the folded eight-bit 1B step loses what its kernels gain
alone (NOTES-58 §7: alone the folded o, gate/up and down save ~45 µs a step; in the
step the folded decoder is 29 µs slower than today's int8). Each decoder's graphed step
traced (6 steps), each kernel charged with its end minus the end of the kernel before
it (under PDL a kernel's own duration includes its wait), summed by kernel name over
a step; then the same by layer position (qkv, attention, o, gate/up, down, head).

    PYTHONPATH=code timeout 300 python scripts/probes/step8_trace.py
    (~1.5 min on an H100, estimate)
"""

import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spec_trace import charged  # noqa: E402
from gpuinfer.decode.speculative import repeatable  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.decode.triton_step8 import EightBitDecoder  # noqa: E402
from gpuinfer.kernels.common import compile_ahead  # noqa: E402
from gpuinfer.kernels.gemv import GemvConfig as C  # noqa: E402
from gpuinfer.measure.profiling import profile_steps  # noqa: E402
from gpuinfer.model.configs import build_model, model_config, random_prompt  # noqa
from gpuinfer.model.llama import INT8  # noqa: E402

PROMPT, STEPS = 128, 6
VARIANTS = {
    "BF16": (TritonDecoder, {}),
    "int8 today": (TritonDecoder, {"weights": INT8}),
    "int8 fold": (EightBitDecoder, {"format": "int8"}),
    "fold g/u 8x1024 w4": (EightBitDecoder, {"format": "int8", "eight_bit": {
        "gate_up": (C(8, 1024, 1, 4), 16)}}),
}


def main():
    cfg = model_config("1b")
    model = build_model(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    prompt = random_prompt(cfg, PROMPT, seed=1, device="cuda")
    per = {}
    for name, (cls, kw) in VARIANTS.items():
        try:
            dec = cls(model, capacity=PROMPT + 64, **kw)
            dec.prefill(prompt)
            compile_ahead(dec.device_step)
            rep = repeatable(dec.pos, PROMPT, dec.device_step)
            with torch.no_grad():
                per[name] = charged(profile_steps(rep, steps=STEPS, head_start=True),
                                    STEPS)
        except Exception as e:  # a variant that fails is named, the rest still run
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
        print(f"{name}: traced", flush=True)
    names = sorted({n for p in per.values() for n in p},
                   key=lambda n: -per.get("int8 today", {}).get(n, 0))
    cols = list(per)
    print(f"{'kernel (µs a step)':44s}" + "".join(f"{c[:18]:>20s}" for c in cols))
    for n in names:
        print(f"{n[:44]:44s}" + "".join(f"{per[c].get(n, 0):20.1f}" for c in cols))
    print(f"{'total':44s}" + "".join(f"{sum(per[c].values()):20.1f}" for c in cols))
    counts = collections.Counter()
    for c in cols:
        counts[c] = len(per[c])
    print("kernel names a variant:", dict(counts))


if __name__ == "__main__":
    main()
