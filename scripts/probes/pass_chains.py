"""Probe (issue 57): is a tensor-core pass's fixed cost the chain of MMAs over K?

pass_breakdown.py (H100, 2026-12-05 14:10 UTC) found every pass product slower than
the step's GEMV for the same matrix even at one token and the same tiling (target qkv,
8 rows x 1024 columns a program, split 1: 3.75 µs against the step's 2.45), and the
best tiling per product no faster as a whole pass. A tile of 1024 columns is 64 MMAs
(m16n8k16) into one accumulator, each waiting for the one before: ~64 x 30 cycles
~ 1.1 µs, about that gap. `MmaConfig.chains` cuts the tile into independent
accumulators (kernels/mma_dot.py). This probe measures it:

a. per product at T = 5 (and the best at T = 2), alone and graphed as
   pass_breakdown's (a): block_n x block_k (x split for down) x chains x warps, each
   checked against PyTorch first; the step's kernel and the rule beside them.
b. whole passes (`MmaPassDecoder(pass_tiling=...)`): the rule, the rule with chains,
   and (a)'s best per product, T = 2, 5, 8, against the step, interleaved rounds;
   each tiling's pass first checked against its own steps (teacher-forced top-1).

    PYTHONPATH=code timeout 560 python scripts/probes/pass_chains.py \
        [--shapes target 1b] [--rounds 5] [--smoke]  # --smoke: toy, CPU, interpreted

About 2.5 minutes a shape on an H100 (estimate); prints as it goes.
"""

import argparse
import dataclasses
import itertools

import torch

import pass_breakdown as pb  # SMOKE, say, graphed, timed_us, check_all, whole, ...
from gpuinfer.kernels.common import compile_ahead
from gpuinfer.kernels.pass_mma import MmaConfig
from gpuinfer.model.configs import build_model

pm, sw, sm, say = pb.pm, pb.sw, pb.sm, pb.say


def candidates(name: str, k: int) -> list[MmaConfig]:
    """Tiles of 256-1024 columns (16384 weights a program at most), chains 1, a chain
    of 8 MMAs a tile and of 4, at 4 warps, 2 stages; no duplicates."""
    per = 2 if name in sw.PAIRED else 1
    splits = (1, 2) if name == "down" else (1,)
    seen, out = set(), []
    for rows, bk, split, warps in itertools.product((8, 16, 32), (256, 512, 1024),
                                                    splits, (4,)):
        if rows * bk > 16384 or name == "lm_head" and split > 1:
            continue
        for chains in (1, bk // 128, bk // 64):
            c = MmaConfig(max(1, rows // per), bk, split, warps, 2, chains).fit(k)
            if c.splits(k) < split or c in seen:
                continue
            seen.add(c)
            out.append(c)
    return out[:4] if pb.SMOKE else out


def with_chains(tiling: dict, per_tile: int = 4) -> dict:
    """The tiling with `per_tile` MMAs a chain a tile: block_k / 16 per_tile chains."""
    return {n: dataclasses.replace(c, chains=max(1, c.block_k // (16 * per_tile)))
            for n, c in tiling.items()}


def per_product(label, b, rounds, t=5):
    """(a): {name: best MmaConfig at T = t}, every variant's µs printed, best first."""
    checker, best = sw.Checker(b), {}
    for name in pm.PRODUCTS:
        k = b.mats[name][1]
        cases, bad = pb.check_all(checker, [(name, t, c) for c in candidates(name, k)]
                                  + [(name, t, with_chains(b.new)[name])])
        cfgs = [c for _, _, c in cases]
        compile_ahead(lambda: [sw.launch(b, name, t, c) for c in cfgs])
        count = max(16, len(b.w[name]))
        fns = {c: pb.graphed(lambda i, c=c: sw.launch(b, name, t, c, i), count)
               for c in cfgs}
        fns["step"] = pb.graphed(lambda i: b.launch("step", name, 1, i), count)
        fns["rule"] = pb.graphed(lambda i: sw.launch(b, name, t, b.new[name], i), count)
        us = pb.timed_us(fns, rounds)
        step, rule = us.pop("step"), us.pop("rule")
        ranked = sorted(us, key=us.get)
        say(f"{label} {name} T={t}: {len(cfgs)} variants ({bad} failed); step "
            f"{step:.2f} µs, rule {rule:.2f}")
        for c in ranked[:8]:
            say(f"{label} {name:8s} {us[c]:7.2f} µs = {us[c] / step:5.2f} x step, "
                f"{us[c] / rule:5.2f} x rule: {c}")
        by_chains = {}
        for c in ranked:
            by_chains.setdefault(c.chains, c)
        say(f"{label} {name:8s} best by chains: " + ", ".join(
            f"{ch}: {us[c]:.2f}" for ch, c in sorted(by_chains.items())))
        best[name] = ranked[0]
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", nargs="*", default=["target", "1b"])
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if pb.SMOKE:
        pb.smoke_sizes()
        a.shapes, a.rounds = ["toy"], 1
    torch.backends.cuda.matmul.allow_tf32 = False
    for label in a.shapes:
        cfg = pb.shape_config(label)
        b = pm.Bench(cfg)
        best = per_product(label, b, a.rounds)
        rule = dict(b.new)
        del b
        if pm.DEV == "cuda":
            torch.cuda.empty_cache()
        model = build_model(cfg, seed=0, dtype=pm.BF16, device=pm.DEV)
        for name, tiling in (("chains", with_chains(rule)), ("best", best)):
            say(f"{label}: (b) {name} against the rule")
            pb.whole(label, model, tiling, [2, 5] if pb.SMOKE else [2, 5, 8], a.rounds)
        del model
        if pm.DEV == "cuda":
            torch.cuda.empty_cache()
    say("done")


if __name__ == "__main__":
    main()
