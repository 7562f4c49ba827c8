"""Probe (issue 57): where a tensor-core verify pass's fixed cost is (a pass of 2 tokens
cost 1.43 steps on the H100, 5 tokens 1.60: ~120 µs over the step at Chapter 6's
target, ~400 µs at 1B, and only 13-25 µs a token more), and what tiling removes it.

    PYTHONPATH=code timeout 290 python scripts/probes/pass_breakdown.py \
        [--rounds 5] [--shapes target 1b] [--skip a b c] [--smoke]

a. Each kernel of a layer, and the head, timed alone: a CUDA graph of many launches
   (PDL on) cycling over enough weight copies that they come from HBM (`pass_mma.py`'s
   Bench), for the step (today's kernels, `default_configs`, T = 1) and the mma pass
   (`mma_configs`) at T = 2 and 5: µs a launch, and (pass - step) x layers, each
   kernel's share of the pass's extra time. The sums give a pass's kernels' total.
b. A sweep of MmaConfig per product at T = 5 (`pass_sweep`): block_n x block_k x
   split_k at 2 stages and 4 warps (and one tile a split: block_k 512/1024), then the
   stages x warps of the best 3; what spilled at AOT skipped. Every variant is checked
   against the PyTorch reference first (BF16: rel <= 1e-2; failures printed first, never
   timed). Printed: the best 5 a product, µs and the ratio to the step's kernel for the
   same matrix at T = 1 and to the rule's tiling.
c. Whole passes: `MmaPassDecoder` with the rule's tiling and with (b)'s best
   (`pass_tiling=`), T = 2, 5, 8, against the step of a `TritonDecoder`, as
   `spec_mma.py` times them (graphed, interleaved rounds); the tuned decoder's logits
   first checked against its own steps (teacher-forced top-1 and max |diff|).

`PASS_NO_NORM=1`: the products without x's RMSNorm (`pass_mma.Bench`), to see what
the norm costs each product (checked against the reference without it).
`PASS_HW_ROUND=1`: the norm's roundings by the conversion instruction (`hw_round.py`).

Every stage prints as it goes. About 3.5 minutes on an H100 (compiles: about a third);
`--shapes target` about half. `--smoke`: tiny shapes on the CPU under the interpreter,
every path once (about 2 minutes on a 2-core CPU).
"""

import argparse
import os
import statistics
import sys
import time

import torch

T0 = time.time()
SMOKE = "--smoke" in sys.argv
if SMOKE:  # before any kernel module is imported
    from gpuinfer.kernels.interpret import use_interpreter
    use_interpreter()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("PASS_HW_ROUND"):  # the norm rounded by cvt (`hw_round.py`)
    import hw_round
    hw_round.patch()
import pass_mma as pm  # noqa: E402  the probe: Bench, shapes, rel
import pass_sweep as sw  # noqa: E402
import spec_mma as sm  # noqa: E402  prompt, forced, ready, ratio
from gpuinfer.kernels.attention import AttentionWorkspace, decode_attention  # noqa
from gpuinfer.kernels.common import compile_ahead  # noqa: E402
from gpuinfer.kernels.embed_head import embed  # noqa: E402
from gpuinfer.kernels.pass_attention import pass_attention  # noqa: E402
from gpuinfer.kernels.tiling import default_attention  # noqa: E402
from gpuinfer.measure.rounds import interleaved_rounds  # noqa: E402
from gpuinfer.model.configs import build_model, model_config  # noqa: E402

LAYER = ("qkv", "attn", "o", "gate_up", "down")
TOL = 1e-2
TOY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2)


def say(*args):
    print(f"[{time.time() - T0:6.1f} s]", *args, flush=True)


def graphed(fn, count):
    """A replay of `count` calls fn(i) (a CUDA graph), and count."""
    for i in range(2):
        fn(i)
    if SMOKE:
        return (lambda: [fn(i) for i in range(2)]), 2
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(count):
            fn(i)
    return g.replay, count


def timed_us(fns, rounds):
    """{key: median µs a launch} of {key: (replay, launches)}, interleaved."""
    r = interleaved_rounds({k: f for k, (f, _) in fns.items()}, rounds=rounds)
    return {k: 1e3 * statistics.median(r.times_ms[k]) / n for k, (_, n) in fns.items()}


class Layer:
    """Attention and embed launches beside the Bench's products."""

    def __init__(self, b, cfg):
        self.b, self.layers = b, cfg.num_hidden_layers
        dev, cap = b.k_cache.device, sm.CAPACITY
        self.attention = default_attention(not SMOKE, cap)
        self.caches = [(torch.randn(b.kv, cap, b.d, device=dev).to(b.dtype),
                        torch.randn(b.kv, cap, b.d, device=dev).to(b.dtype))
                       for _ in range(self.layers)]
        self.ws = {t: AttentionWorkspace(dev, b.kv, b.heads // b.kv, b.d,
                                         self.attention["n_split"], rows=t)
                   for t in range(1, 9)}
        self.pos = {t: torch.tensor([sm.START + t - 1], device=dev) for t in range(1, 9)}

    def attn(self, t, i):
        b, (k, v) = self.b, self.caches[i % self.layers]
        q, o = b.out(t, b.heads * b.d, "q"), b.out(t, b.heads * b.d, "attn")
        if t == 1:
            q, o = q[0], o[0]
        if t > 1 and self.attention["n_split"] == 1 and \
                self.attention["block_s"] >= sm.CAPACITY:  # as MmaPassDecoder runs it
            pass_attention(q, k, v, self.pos[t], o, block_s=self.attention["block_s"],
                           num_warps=self.attention["num_warps"], pdl=pm.PDL)
            return
        decode_attention(q, k, v, self.pos[t], o, pdl=pm.PDL, workspace=self.ws[t],
                         **self.attention)

    def embed(self, t, i):
        b = self.b
        x = b.out(t, b.cfg.hidden_size, "embed")
        embed(b.w["lm_head"][0], b.tokens, self.pos[t], x[0] if t == 1 else x,
              pdl=pm.PDL)

    def fn(self, name, t, cfg):
        if name == "attn":
            return lambda i: self.attn(t, i)
        if name == "embed":
            return lambda i: self.embed(t, i)
        if t == 1:
            return lambda i: self.b.launch("step", name, 1, i)
        return lambda i: sw.launch(self.b, name, t, cfg[name], i)


def check_all(checker, cases):
    """[(name, t, cfg)] -> those within TOL; failures printed first."""
    ok, bad = [], []
    for name, t, cfg in cases:
        err = checker.error(name, t, cfg)
        (ok if err <= TOL else bad).append((name, t, cfg, err))
    for name, t, cfg, err in bad:
        say(f"FAILED check {name} T={t} {cfg}: rel {err:.3g}")
    return [(n, t, c) for n, t, c, _ in ok], len(bad)


def breakdown(label, b, layer, rounds):
    """(a): every kernel alone, step and mma T = 2, 5 (or `PASS_T`, e.g. 4,5)."""
    ts = tuple(int(t) for t in os.environ.get("PASS_T", "2,5").split(","))
    names = ("embed",) + LAYER + ("lm_head",)
    checked, _ = check_all(sw.Checker(b), [(n, t, b.new[n]) for t in ts
                                           for n in pm.PRODUCTS])
    say(f"{label}: (a) rule tiling checks: {len(checked)} of 10 ok")
    fns, keys = {}, [(n, t) for t in (1,) + ts for n in names]
    compile_ahead(lambda: [layer.fn(n, t, b.new)(0) for n, t in keys])
    for n, t in keys:
        count = max(16, len(b.w[n]) if n in b.w else layer.layers)
        fns[n, t] = graphed(layer.fn(n, t, b.new), count)
    us = timed_us(fns, rounds)
    L = layer.layers
    say(f"{label}: (a) µs a launch (alone, graphed, from HBM); (pass - step) x "
        "layers = the kernel's share of a pass's extra time")
    for n in names:
        times = "  ".join(f"T={t} {us[n, t]:7.2f}" for t in (1,) + ts)
        mult = L if n in LAYER else 1
        extra = "  ".join(f"+{(us[n, t] - us[n, 1]) * mult:6.1f} µs (T={t})"
                          for t in ts)
        say(f"{label} {n:8s} {times}   {extra}")
    for t in (1,) + ts:
        total = sum(us[n, t] * (L if n in LAYER else 1) for n in names)
        say(f"{label} sum T={t}: {total:7.1f} µs")
    return us


def sweep(label, b, rounds, t=5, keep=3):
    """(b): per product, the candidates at T = t; {name: best MmaConfig}."""
    checker, best = sw.Checker(b), {}
    for name in pm.PRODUCTS:
        k = b.mats[name][1]
        stage = sw.first_stage(name, k)[:3 if SMOKE else None]
        found = {}
        for depth in (1, 2):
            cases, bad = check_all(checker, [(name, t, c) for c in stage])
            cfgs = [c for _, _, c in cases]
            compile_ahead(lambda: [sw.launch(b, name, t, c) for c in cfgs])
            fns = {c: graphed(lambda i, c=c: sw.launch(b, name, t, c, i),
                              max(16, len(b.w[name]))) for c in cfgs}
            fns["step"] = graphed(lambda i: b.launch("step", name, 1, i),
                                  max(16, len(b.w[name])))
            fns["rule"] = graphed(lambda i: sw.launch(b, name, t, b.new[name], i),
                                  max(16, len(b.w[name])))
            us = timed_us(fns, rounds)
            step, rule = us.pop("step"), us.pop("rule")
            found.update(us)
            ranked = sorted(us, key=us.get)
            say(f"{label} {name} T={t} stage {depth}: {len(cfgs)} variants "
                f"({bad} failed); step {step:.2f} µs, rule {rule:.2f}")
            if depth == 1:
                stage = sw.second_stage(ranked[:keep], name)[:3 if SMOKE else None]
        ranked = sorted(found, key=found.get)
        for c in ranked[:5]:
            say(f"{label} {name:8s} {found[c]:7.2f} µs = {found[c] / step:5.2f} x "
                f"step, {found[c] / rule:5.2f} x rule: {c}")
        best[name] = ranked[0] if found[ranked[0]] < rule else b.new[name]
    return best


def whole(label, model, best, queries, rounds):
    """(c): the step, the rule's passes and the tuned passes, interleaved."""
    from gpuinfer.decode.triton_pass import MmaPassDecoder
    from gpuinfer.decode.triton_step import TritonDecoder
    vocab, cap = model.config.vocab_size, sm.CAPACITY
    alone = TritonDecoder(model, capacity=cap)
    rule = MmaPassDecoder(model, capacity=cap, max_query=max(queries))
    tuned = MmaPassDecoder(model, capacity=cap, max_query=max(queries),
                           pass_tiling=best)
    say(f"{label}: (c) tuned tiling {tuned.pass_tiling}")
    check_passes(f"{label} check tuned", tuned, vocab, queries)
    fns = {}
    with torch.no_grad():
        for dec in (alone, rule, tuned):
            dec.prefill(sm.prompt(sm.PROMPT, vocab))
        fns["step"] = sm.ready(alone, 1)
        for q in queries:
            fns["rule", q] = sm.ready(rule, q)
            fns["tuned", q] = sm.ready(tuned, q)
    in_steps(f"{label} (c)", fns, rounds, width=14)


def check_passes(label, dec, vocab, queries):
    """A decoder's passes against its own steps, teacher-forced: max |diff| and top-1,
    a line each T."""
    p, ids = sm.prompt(sm.PROMPT, vocab), sm.prompt(max(queries), vocab, seed=5)
    steps, passes = sm.forced(dec, p, ids, queries)
    for t, got in passes.items():
        ref = steps[:t]
        diff = (ref - got).abs().max().item()
        top1 = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
        flag = "" if top1 == 1 else "  DISAGREES"
        say(f"{label} T={t}: max |diff| {diff:.3g} "
            f"(rel {diff / ref.abs().max().item():.2g}), top-1 {top1:.3f}{flag}")


def in_steps(label, fns, rounds, width):
    """{name: replay} ("step" among them) timed in interleaved rounds, each printed in
    µs and in steps (its time over the step's, round by round: median, low-high)."""
    reps = 2 if SMOKE else sm.REPLAYS
    timed = interleaved_rounds({n: lambda f=f: [f() for _ in range(reps)]
                                for n, f in fns.items()},
                               rounds=rounds, per_call=reps / 1e3)
    for name in fns:
        med, lo, hi = sm.ratio(timed, name, "step")
        say(f"{label} {str(name):{width}s} {timed[name].median:8.1f} µs = {med:.3f} "
            f"steps ({lo:.3f}-{hi:.3f})")


def smoke_sizes():
    """The probes' shared modules at --smoke's sizes: CPU, no PDL, small buffers."""
    pm.DEV, pm.PDL, pm.HBM_BYTES, pm.CAPACITY = "cpu", False, 1 << 16, 256
    sm.DEVICE, sm.PROMPT, sm.START = "cpu", 8, 20


def shape_config(label):
    """The LlamaConfig of a shape: "toy" (--smoke), "target" (Chapter 6's) or "1b"."""
    if label == "toy":
        return model_config("tiny", vocab_size=256, tie_word_embeddings=True,
                            max_position_embeddings=512, **TOY)
    if label == "target":
        return model_config("tiny", vocab_size=8192, tie_word_embeddings=True,
                            max_position_embeddings=2048, **pm.TARGET)
    return model_config("1b")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", nargs="*", default=["target", "1b"])
    ap.add_argument("--skip", nargs="*", default=[], choices=["a", "b", "c"])
    ap.add_argument("--smoke", action="store_true", help="tiny, CPU, interpreted")
    a = ap.parse_args()
    if SMOKE:
        smoke_sizes()
        a.shapes, a.rounds = ["toy"], 1
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = pm.DEV
    for label in a.shapes:
        cfg = shape_config(label)
        b = pm.Bench(cfg)
        layer = Layer(b, cfg)
        copies = ", ".join(f"{n} x{len(w)}" for n, w in b.w.items())
        say(f"{label}: weights ready ({copies})")
        if "a" not in a.skip:
            breakdown(label, b, layer, a.rounds)
        best = dict(b.new)
        if "b" not in a.skip:
            best = sweep(label, b, a.rounds)
        say(f"{label}: best at T=5 {best}")
        del b, layer
        if dev == "cuda":
            torch.cuda.empty_cache()
        if "c" not in a.skip:
            model = build_model(cfg, seed=0, dtype=pm.BF16, device=dev)
            whole(label, model, best, [2, 5] if SMOKE else [2, 5, 8], a.rounds)
            del model
            if dev == "cuda":
                torch.cuda.empty_cache()
    say("done")


if __name__ == "__main__":
    main()
