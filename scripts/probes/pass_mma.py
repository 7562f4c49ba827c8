"""Probe (issue 57): a verify pass's products on the tensor cores. At Chapter 6's
target's shapes and the 1B model's, for passes of T = 1 ... 8 and 16 tokens, each
product (qkv with rotary, o with the residual, gate/up with SiLU, down with the
residual, lm_head with the argmax) timed three ways in the same interleaved rounds:

- "rows": today's kernels with x of T rows (`gemv`, `gemv_silu`, `qkv_rope`,
  `lm_head_argmax`; `tiling.pass_configs`, as Chapter 6's passes run them);
- "mma": the new tensor-core kernels (`kernels.pass_mma*`, `mma_configs`);
- "cublas": torch.nn.functional.linear on the T rows (the product alone, no fusion).

Each call replays a CUDA graph of many launches (PDL on for the Triton kernels, as the
decoder runs them), cycling over enough copies of the weights that they come from HBM
and not from L2 (as in a step, where every layer's are other weights); µs are per
launch. "step" is today's kernel at T = 1 with the step's tiling (`default_configs`):
each line's ratio is to it. First, every new kernel's output is checked against the
PyTorch reference on the GPU (BF16: rel. error <= 1e-2; FP32 with ieee dots: 1e-5;
int8: 1e-2).

    PYTHONPATH=code python scripts/probes/pass_mma.py [--rounds 5] [--quick]
"""

import argparse
import math
import os
import time

import torch

from gpuinfer.kernels.common import Workspace, compile_ahead
from gpuinfer.kernels.embed_head import ArgmaxWorkspace, lm_head_argmax
from gpuinfer.kernels.gemv import gemv, gemv_reference, gemv_silu, gemv_silu_reference
from gpuinfer.kernels.pass_mma import gemv_pass, gemv_silu_pass, mma_configs
from gpuinfer.kernels.pass_mma_heads import lm_head_argmax_pass, qkv_rope_pass
from gpuinfer.kernels.qkv_rope import qkv_rope, qkv_rope_reference
from gpuinfer.kernels.tiling import default_configs, pass_configs
from gpuinfer.measure.rounds import interleaved_rounds
from gpuinfer.model.configs import model_config
from gpuinfer.model.quant import quantize_int8

TARGET = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
              num_attention_heads=16, num_key_value_heads=4)
BF16, DEV = torch.bfloat16, "cuda"
PRODUCTS = ("qkv", "o", "gate_up", "down", "lm_head")
HBM_BYTES = 256 << 20  # weights cycled through per graph: several times the L2
CAPACITY = 4096
PDL = True  # as the decoder launches them on Hopper


def shapes(cfg):
    """{product: (N rows of W, K)} and the heads."""
    d = cfg.hidden_size // cfg.num_attention_heads
    h, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    return {"qkv": ((heads + 2 * kv) * d, h), "o": (h, heads * d),
            "gate_up": (2 * cfg.intermediate_size, h), "down": (h, cfg.intermediate_size),
            "lm_head": (cfg.vocab_size, h)}, heads, kv, d


class Bench:
    """Weights, buffers and launchers of one model shape."""

    def __init__(self, cfg, dtype=BF16, copies=True):
        self.cfg, self.dtype = cfg, dtype
        self.mats, self.heads, self.kv, self.d = shapes(cfg)
        g = torch.Generator(device=DEV).manual_seed(0)
        self.w = {}
        for name, (n, k) in self.mats.items():
            count = max(1, min(64, math.ceil(HBM_BYTES / (n * k * 2)))) if copies else 1
            self.w[name] = [(torch.randn(n, k, device=DEV, generator=g) / k ** 0.5)
                            .to(dtype) for _ in range(count)]
        h = cfg.hidden_size
        self.norm = (1 + 0.1 * torch.randn(h, device=DEV, generator=g)).to(dtype)
        if os.environ.get("PASS_NO_NORM"):  # what x's RMSNorm costs a pass's products
            self.norm = None
        self.k_cache = torch.zeros(self.kv, CAPACITY, self.d, device=DEV, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        ang = torch.arange(CAPACITY, device=DEV)[:, None] * 1e-3 * torch.arange(
            self.d, device=DEV)[None]
        self.cos, self.sin = ang.cos().to(dtype), ang.sin().to(dtype)
        self.pos = torch.tensor([CAPACITY // 2], device=DEV)
        self.head_pos = torch.tensor([0], device=DEV)
        self.tokens = torch.zeros(CAPACITY, device=DEV, dtype=torch.long)
        self.ws = Workspace(DEV, 1 << 24, 1 << 16)
        self.aws = {t: ArgmaxWorkspace(DEV, cfg.vocab_size // 8 + 1, rows=t)
                    for t in range(1, 17)}
        self.new = mma_configs(cfg, gpu=True)
        ks = {n: k for n, (_, k) in self.mats.items()}
        self.rows_cfg = {n: c.fit(ks[n]) for n, c in pass_configs(cfg, True).items()}
        self.step_cfg = {n: c.fit(ks[n]) for n, c in default_configs(True).items()}
        self.bufs = {}

    def x(self, t, k):
        key = ("x", t, k)
        if key not in self.bufs:
            self.bufs[key] = torch.randn(t, k, device=DEV).to(self.dtype)
        return self.bufs[key]

    def out(self, t, n, tag):
        key = ("out", t, n, tag)
        if key not in self.bufs:
            self.bufs[key] = torch.zeros(t, n, device=DEV, dtype=self.dtype)
        return self.bufs[key]

    def launch(self, way, name, t, i=0):
        """One launch of product `name` for T = t tokens, the weights' copy i."""
        w = self.w[name][i % len(self.w[name])]
        n, k = self.mats[name]
        x = self.x(t, k)
        cfg = {"mma": self.new, "rows": self.rows_cfg, "step": self.step_cfg}.get(way)
        if way == "cublas":
            return torch.mm(x, w.t(), out=self.out(t, n, "cublas"))  # F.linear's GEMM
        one = way == "step"
        xx = x[0] if one else x
        pdl = PDL
        if name == "qkv":
            q = self.out(t, self.heads * self.d, way)
            q = q[0] if one else q
            fn = qkv_rope_pass if way == "mma" else qkv_rope
            return fn(w, xx, q, self.k_cache, self.v_cache, self.cos, self.sin, self.pos,
                      n_heads=self.heads, norm=self.norm, config=cfg[name], pdl=pdl,
                      workspace=self.ws)
        if name == "lm_head":
            logits = self.out(t, n, way)
            fn = lm_head_argmax_pass if way == "mma" else lm_head_argmax
            return fn(w, xx, logits[0] if one else logits, self.tokens, self.head_pos,
                      norm=self.norm, config=cfg[name], inline=False, pdl=pdl,
                      workspace=self.aws[t])
        if name == "gate_up":
            o = self.out(t, n // 2, way)
            fn = gemv_silu_pass if way == "mma" else gemv_silu
            return fn(w, xx, o[0] if one else o, norm=self.norm, config=cfg[name],
                      pdl=pdl, workspace=self.ws)
        o = self.out(t, n, way)  # o and down: the residual in place
        o = o[0] if one else o
        fn = gemv_pass if way == "mma" else gemv
        return fn(w, xx, o, residual=o, config=cfg[name], pdl=pdl, workspace=self.ws)

    def graph(self, way, name, t):
        """(replay, launches a replay): a graph cycling over the weights' copies."""
        launches = max(16, len(self.w[name]))
        for i in range(2):
            self.launch(way, name, t, i)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(launches):
                self.launch(way, name, t, i)
        return g.replay, launches


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def check(bench, tokens, tol, label, int8=False):
    """Every new kernel against its PyTorch reference, per token; a line per product.
    The kernels are compiled ahead, all at once (`compile_ahead`), then run."""
    cases = []  # (product, launch, error of the launch's outputs)
    for name in PRODUCTS:
        n, k = bench.mats[name]
        w = bench.w[name][0]
        if int8:
            w = quantize_int8(w.to(BF16))
        for t in tokens:
            x, norm, c = bench.x(t, k), bench.norm, bench.new[name]
            if name == "qkv":
                q = torch.zeros(t, bench.heads * bench.d, device=DEV, dtype=x.dtype)
                kc, vc = torch.zeros_like(bench.k_cache), torch.zeros_like(bench.v_cache)

                def launch(w=w, x=x, q=q, kc=kc, vc=vc, c=c):
                    qkv_rope_pass(w, x, q, kc, vc, bench.cos, bench.sin, bench.pos,
                                  n_heads=bench.heads, norm=bench.norm, config=c)

                def err(w=w, x=x, q=q, kc=kc, vc=vc, t=t):
                    errs, pos = [], int(bench.pos)
                    for r in range(t):
                        slot = pos - t + 1 + r
                        rq, rk, rv = qkv_rope_reference(
                            w, x[r], bench.cos, bench.sin, slot, n_heads=bench.heads,
                            n_kv=bench.kv, norm=bench.norm)
                        errs += [rel(q[r], rq), rel(kc[:, slot], rk), rel(vc[:, slot], rv)]
                    return max(errs)
            else:
                out = torch.zeros(t, n // 2 if name == "gate_up" else n, device=DEV,
                                  dtype=x.dtype)
                res = torch.randn(t, n, device=DEV).to(x.dtype)

                def launch(name=name, w=w, x=x, out=out, res=res, c=c):
                    if name == "lm_head":
                        lm_head_argmax_pass(w, x, out, torch.zeros_like(bench.tokens),
                                            torch.tensor([100], device=DEV),
                                            norm=bench.norm, config=c)
                    elif name == "gate_up":
                        gemv_silu_pass(w, x, out, norm=bench.norm, config=c)
                    else:
                        gemv_pass(w, x, out, residual=res, config=c)

                def err(name=name, w=w, x=x, out=out, res=res, t=t):
                    if name == "lm_head":
                        ref = [gemv_reference(w, x[r], norm=bench.norm) for r in range(t)]
                    elif name == "gate_up":
                        ref = [gemv_silu_reference(w, x[r], norm=bench.norm)
                               for r in range(t)]
                    else:
                        ref = [gemv_reference(w, x[r], residual=res[r]) for r in range(t)]
                    return rel(out, torch.stack(ref))
            cases.append((name, launch, err))
    compile_ahead(lambda: [launch() for _, launch, _ in cases])
    worst = dict.fromkeys(PRODUCTS, 0.0)
    for name, launch, err in cases:
        launch()
        worst[name] = max(worst[name], err())
    ok = all(e <= tol for e in worst.values())
    print(f"check {label}: {'ok' if ok else 'FAILED'} (tol {tol:g}) " + "  ".join(
        f"{n} {e:.2e}" for n, e in worst.items()), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="T = 1, 2, 5, 16 only")
    a = ap.parse_args()
    t0 = time.time()
    target = model_config("tiny", vocab_size=8192, tie_word_embeddings=True,
                          max_position_embeddings=2048, **TARGET)
    models = {"target": target, "1b": model_config("1b")}
    queries = [1, 2, 5, 16] if a.quick else [1, 2, 3, 4, 5, 6, 7, 8, 16]
    torch.backends.cuda.matmul.allow_tf32 = False
    # 1. correctness on the GPU
    fp32 = Bench(target, torch.float32, copies=False)
    check(fp32, [2, 5, 16], 1e-5, "target fp32 (ieee)")
    del fp32
    for label, cfg in models.items():
        b = Bench(cfg, copies=False)
        check(b, [1, 2, 5, 8, 16], 1e-2, f"{label} bf16")
        check(b, [3, 16], 1e-2, f"{label} int8", int8=True)
        del b
    torch.cuda.empty_cache()
    print(f"checked in {time.time() - t0:.0f} s", flush=True)
    # 2. timings
    for label, cfg in models.items():
        b = Bench(cfg)
        ways = [("step", 1)] + [(way, t) for t in queries
                                for way in ("rows", "mma", "cublas")]

        def everything():
            for name in PRODUCTS:
                for way, t in ways:
                    b.launch(way, name, t)

        compile_ahead(everything)
        print(f"{label}: compiled ({time.time() - t0:.0f} s)", flush=True)
        fns, per = {}, {}
        for name in PRODUCTS:
            for way, t in ways:
                fns[name, way, t], per[name, way, t] = b.graph(way, name, t)
        print(f"{label}: {len(fns)} graphs captured ({time.time() - t0:.0f} s)",
              flush=True)
        timed = interleaved_rounds(fns, rounds=a.rounds, warmup=1)
        us = {key: [1e3 * v / per[key] for v in timed.times_ms[key]] for key in fns}

        def fmt(key, step):
            v = sorted(us[key])
            med = v[len(v) // 2]
            return f"{med:7.2f} ({v[0]:.2f}-{v[-1]:.2f}) {med / step:5.2f}x"

        print(f"\n{label}: µs a launch, median (min-max) over {a.rounds} rounds, and "
              "the ratio to the step's product (today's kernel, T = 1)")
        for name in PRODUCTS:
            step = sorted(us[name, "step", 1])[a.rounds // 2]
            print(f"{label} {name:8s} step {fmt((name, 'step', 1), step)}")
            for t in queries:
                print(f"{label} {name:8s} T={t:2d}  rows {fmt((name, 'rows', t), step)}"
                      f"  mma {fmt((name, 'mma', t), step)}"
                      f"  cublas {fmt((name, 'cublas', t), step)}", flush=True)
        layers = cfg.num_hidden_layers
        print(f"\n{label}: a pass's products (layers x (qkv + o + gate_up + down) + "
              "lm_head), medians, in steps' products")

        def total(way, t):
            med = {n: sorted(us[n, way, t])[a.rounds // 2] for n in PRODUCTS}
            return layers * sum(med[n] for n in PRODUCTS[:4]) + med["lm_head"]

        step_total = total("step", 1)
        print(f"{label} step products: {step_total:.1f} µs")
        for t in queries:
            print(f"{label} T={t:2d}: " + "  ".join(
                f"{way} {total(way, t):7.1f} µs {total(way, t) / step_total:5.2f}"
                for way in ("rows", "mma", "cublas")), flush=True)
        del b, fns
        torch.cuda.empty_cache()
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
