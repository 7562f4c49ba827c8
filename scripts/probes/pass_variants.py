"""Probe (issue 57): the pass's tiling and attention in whole passes, each variant
against the step in interleaved rounds, and traced kernel by kernel at T = 5.

pass_trace.py (H100, 2026-12-05 16:52 UTC): the target's down split in 3 (one tile a
split, all loaded before the PDL wait) took o + down from 151 to 97 µs a pass of 5
tokens. `mma_configs` now splits o and down into one tile a split up to 4 tiles, and
`MmaPassDecoder.shared_attention` runs a pass's attention in one program per
key/value head (`kernels/pass_attention.py`): the target's pass of 5 tokens 1.371
steps, against 1.580 before both (H100, 17:00 UTC). The trace then charged the pass
(µs over the step's kernel): gate/up +41, q/k/v +22, o + down +20, attention +16.
Here each VARIANTS entry changes one thing from the rule: tilings of gate/up, q/k/v
and o, attention per token or at 4 warps; at the 1B shape gate/up's split, q/k/v's
pairs and o's split. Each variant's passes are first checked against its own steps
(teacher-forced top-1); then rounds of the step and passes of T = 2, 5, 7; then a
trace of each at T = 5 (µs a pass by kernel, each charged with its end minus the end
before it).

    PYTHONPATH=code timeout 400 python scripts/probes/pass_variants.py \
        [--shapes target 1b] [--rounds 5] [--smoke]

About 2 minutes for the target and 1 for the 1B on an H100 (estimate).
"""

import argparse

import torch

import pass_breakdown as pb  # say, shape_config, smoke_sizes, sm (spec_mma)
from gpuinfer.decode.speculative import repeatable
from gpuinfer.decode.triton_pass import MmaPassDecoder
from gpuinfer.decode.triton_step import TritonDecoder
from gpuinfer.kernels.pass_mma import MmaConfig
from gpuinfer.model.configs import build_model

sm, say = pb.sm, pb.say
QUERIES = (2, 5, 7)


M = MmaConfig
# name: (pass_tiling over the rule's, one-program attention, attention's num_warps)
VARIANTS = {
    # (The target's unsplit down and o at 8 warps were slower at T = 5 on the H200:
    # NOTES-57, "One tile a program, no split-K sum"; removed 2026-12-06.)
    "target": {
        "rule": ({}, True, None),
        # q/k/v: 96 programs of 8 pairs on 132 SMs; half the pairs, twice the programs
        "qkv 4p x1024": ({"qkv": M(4, 1024, chains=16)}, True, None),
        "qkv 8p x1024 w8": ({"qkv": M(8, 1024, num_warps=8, chains=16)}, True, None),
    },
    "1b": {
        # The rule since 2026-12-06 takes q/k/v and o in one tile of 2048 at 8 warps
        # (each alone was 0.025 and 0.017 steps faster at T = 5 on the H200); "before" is
        # the rule they replaced, to time the two together against it.
        "rule": ({}, True, None),
        "before": ({"qkv": M(4, 1024, num_stages=2, chains=16),
                    "o": M(8, 1024, 2, chains=16)}, True, None),
        "qkv only": ({"o": M(8, 1024, 2, chains=16)}, True, None),
        "o only": ({"qkv": M(4, 1024, num_stages=2, chains=16)}, True, None),
        "down 8x4096 w8 s2": ({"down": M(8, 4096, 2, num_warps=8, chains=16)}, True,
                              None),
    },
    "toy": {"rule": ({}, True, None), "rule, per-token attention": ({}, False, None)},
}


def build(model, tiling, attention, warps):
    dec = MmaPassDecoder(model, capacity=sm.CAPACITY, max_query=max(QUERIES),
                         pass_tiling=tiling)
    if attention and not dec.shared_attention:
        raise SystemExit(f"one-program attention is off at capacity {sm.CAPACITY}")
    dec.shared_attention = attention
    if warps:  # the passes' attention (and this decoder's step, not timed here)
        dec.attention = {**dec.attention, "num_warps": warps}
    return dec


def shape(label, rounds, trace):
    config = pb.shape_config(label)
    gpu = torch.cuda.is_available()
    model = build_model(config, seed=0, dtype=sm.BF16, device=sm.DEVICE)
    vocab = config.vocab_size
    decs = {}
    for name, (tiling, attention, warps) in VARIANTS[label].items():
        decs[name] = build(model, tiling, attention, warps)
        if name == "rule":
            say(f"{label} rule: {decs[name].pass_tiling}")
        pb.check_passes(f"{label} check {name}", decs[name], vocab, QUERIES)
    alone = TritonDecoder(model, capacity=sm.CAPACITY)
    fns = {}
    with torch.no_grad():
        alone.prefill(sm.prompt(sm.PROMPT, vocab))
        fns["step"] = sm.ready(alone, 1)
        for name, dec in decs.items():
            dec.prefill(sm.prompt(sm.PROMPT, vocab))
            for q in QUERIES:
                fns[name, q] = sm.ready(dec, q)
    pb.in_steps(label, fns, rounds, width=28)
    if trace and gpu:
        from spec_trace import charged
        from gpuinfer.measure.profiling import profile_steps
        runs = [("step", alone, 1), ("rule", decs["rule"], 2)]
        for name, dec, q in runs + [(n, d, 5) for n, d in decs.items()]:
            fn = dec.device_step if q == 1 else (lambda d=dec, q=q: d.verify_step(q))
            rep = repeatable(dec.pos, sm.START + q - 1, fn)
            with torch.no_grad():
                per = charged(profile_steps(rep, steps=6, head_start=True), 6)
            say(f"{label} trace {name} T={q}: " + ", ".join(
                f"{n.replace('_kernel', '')} {v:.1f}"
                for n, v in sorted(per.items(), key=lambda x: -x[1]) if v >= 2)
                + f"; total {sum(per.values()):.1f} µs")
    del decs, alone, model
    if gpu:
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", nargs="*", default=["target", "1b"])
    ap.add_argument("--smoke", action="store_true", help="tiny, CPU, interpreted")
    a = ap.parse_args()
    if a.smoke:
        pb.smoke_sizes()
        sm.CAPACITY = 64
    for label in (["toy"] if a.smoke else a.shapes):
        shape(label, 1 if a.smoke else a.rounds, trace=label != "toy")
    say("done")


if __name__ == "__main__":
    main()
