"""Helpers of pass_breakdown.py (issue 57): a pass product launched with any MmaConfig,
checked against its PyTorch reference, the candidate tilings of the sweep, and their
registers and spills compiled ahead for sm_90 on a CPU:

    PYTHONPATH=code python scripts/probes/pass_sweep.py [--tokens 5]   # no GPU

prints a line per candidate (product, config, regs, stack) at both shapes; the GPU
sweep (`pass_breakdown.py`) skips what spills here (`SPILLS`).
"""

import argparse
import itertools

import torch

import pass_mma as pm  # the probe of scripts/probes, for its Bench (weights, buffers)
from gpuinfer.kernels.pass_mma import MmaConfig, gemv_pass, gemv_silu_pass
from gpuinfer.kernels.pass_mma_heads import lm_head_argmax_pass, qkv_rope_pass

PAIRED = ("qkv", "gate_up")
ROWS, BLOCK_KS, SPLITS = (16, 32, 64), (64, 128, 256), (1, 2, 4)
WHOLE_KS = (512, 1024)  # one tile a split at 16 rows: all of it before the PDL wait
STAGES, WARPS = (2, 3, 4), (4, 8)


def spills(rows: int, block_k: int, warps: int, stages: int) -> bool:
    """What spilled in `python pass_sweep.py` at T = 5 (sm_90, BF16, target shape):
    nothing in this grid (the most: 213 registers, gate/up 8 pairs x 1024 columns at
    4 warps; 16 pairs x 256: 185), so only tiles past 16384 weights are dropped."""
    return rows * block_k > 16384


def first_stage(name: str, k: int, prune: bool = True) -> list[MmaConfig]:
    """block_n (rows of W; pairs are half) x block_k x split_k at 2 stages, 4 warps,
    and the one-tile variants (block_k 512 / 1024, 16 rows), fitted to K; no
    duplicates, no split of the lm_head, no split that leaves a split empty."""
    per = 2 if name in PAIRED else 1
    seen, out = set(), []
    grid = list(itertools.product(ROWS, BLOCK_KS, SPLITS))
    grid += [(16, bk, s) for bk in WHOLE_KS for s in SPLITS]
    for rows, bk, split in grid:
        if name == "lm_head" and split > 1 or prune and spills(rows, bk, 4, 2):
            continue
        c = MmaConfig(rows // per, bk, split, 4, 2).fit(k)
        if c.splits(k) < split:
            continue
        key = (c.block_n, c.block_k, c.split_k)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def second_stage(best: list[MmaConfig], name: str,
                 prune: bool = True) -> list[MmaConfig]:
    """The stages x warps of each of the first stage's best."""
    per = 2 if name in PAIRED else 1
    out = []
    for c in best:
        for st, wp in itertools.product(STAGES, WARPS):
            if (st, wp) != (c.num_stages, c.num_warps) and \
                    not (prune and spills(c.block_n * per, c.block_k, wp, st)):
                out.append(MmaConfig(c.block_n, c.block_k, c.split_k, wp, st))
    return out


def launch(b, name, t, cfg, i=0, pdl=None, tag="sweep"):
    """Product `name` of Bench b for T = t tokens with `cfg`, weights' copy i."""
    w = b.w[name][i % len(b.w[name])]
    n, k = b.mats[name]
    x, pdl = b.x(t, k), pm.PDL if pdl is None else pdl
    if name == "qkv":
        return qkv_rope_pass(w, x, b.out(t, b.heads * b.d, tag), b.k_cache, b.v_cache,
                             b.cos, b.sin, b.pos, n_heads=b.heads, norm=b.norm,
                             config=cfg, pdl=pdl, workspace=b.ws)
    if name == "lm_head":
        return lm_head_argmax_pass(w, x, b.out(t, n, tag), b.tokens, b.head_pos,
                                   norm=b.norm, config=cfg, inline=False, pdl=pdl,
                                   workspace=b.aws[t])
    if name == "gate_up":
        return gemv_silu_pass(w, x, b.out(t, n // 2, tag), norm=b.norm, config=cfg,
                              pdl=pdl, workspace=b.ws)
    o = b.out(t, n, tag)
    return gemv_pass(w, x, o, residual=o, config=cfg, pdl=pdl, workspace=b.ws)


class Checker:
    """A variant's outputs against the references (computed once a product and T)."""

    def __init__(self, b):
        self.b, self.refs = b, {}

    def reference(self, name, t):
        from gpuinfer.kernels.gemv import gemv_reference, gemv_silu_reference
        from gpuinfer.kernels.qkv_rope import qkv_rope_reference
        b = self.b
        n, k = b.mats[name]
        w, x = b.w[name][0], b.x(t, k)
        res = torch.randn(t, n, device=x.device, generator=torch.Generator(
            device=x.device).manual_seed(t)).to(x.dtype)
        pos = int(b.pos)
        if name == "qkv":
            ref = [qkv_rope_reference(w, x[r], b.cos, b.sin, pos - t + 1 + r,
                                      n_heads=b.heads, n_kv=b.kv, norm=b.norm)
                   for r in range(t)]
        elif name == "gate_up":
            ref = torch.stack([gemv_silu_reference(w, x[r], norm=b.norm)
                               for r in range(t)])
        elif name == "lm_head":
            ref = torch.stack([gemv_reference(w, x[r], norm=b.norm) for r in range(t)])
        else:
            ref = torch.stack([gemv_reference(w, x[r], residual=res[r])
                               for r in range(t)])
        return res, ref

    def error(self, name, t, cfg) -> float:
        """The largest relative error of `cfg`'s outputs (all tokens; q, k, v)."""
        if (name, t) not in self.refs:
            self.refs[name, t] = self.reference(name, t)
        res, ref = self.refs[name, t]
        b = self.b
        n, k = b.mats[name]
        w, x = b.w[name][0], b.x(t, k)
        if name == "qkv":
            q = torch.zeros(t, b.heads * b.d, device=x.device, dtype=x.dtype)
            kc, vc = torch.zeros_like(b.k_cache), torch.zeros_like(b.v_cache)
            qkv_rope_pass(w, x, q, kc, vc, b.cos, b.sin, b.pos, n_heads=b.heads,
                          norm=b.norm, config=cfg, workspace=b.ws)
            pos = int(b.pos)
            return max(max(pm.rel(q[r], rq), pm.rel(kc[:, pos - t + 1 + r], rk),
                           pm.rel(vc[:, pos - t + 1 + r], rv))
                       for r, (rq, rk, rv) in enumerate(ref))
        out = torch.zeros(t, n // 2 if name == "gate_up" else n, device=x.device,
                          dtype=x.dtype)
        if name == "lm_head":
            lm_head_argmax_pass(w, x, out, torch.zeros_like(b.tokens),
                                torch.tensor([t], device=x.device), norm=b.norm,
                                config=cfg, workspace=b.aws[t])
        elif name == "gate_up":
            gemv_silu_pass(w, x, out, norm=b.norm, config=cfg, workspace=b.ws)
        else:
            gemv_pass(w, x, out, residual=res.clone(), config=cfg, workspace=b.ws)
        return pm.rel(out, ref)


def aot(tokens: int, shapes=("target",), products=("gate_up", "down", "lm_head")):
    """Compile the candidates for sm_90 (CPU tensors) and print regs and stack: the
    unsplit ones and their stages x warps (a split changes the tile's registers
    little), unpruned."""
    from gpuinfer.kernels.aot import compile_only, resource_usage
    from gpuinfer.kernels.common import Workspace
    from gpuinfer.kernels.embed_head import ArgmaxWorkspace
    from gpuinfer.model.configs import model_config
    import types
    target = model_config("tiny", vocab_size=8192, tie_word_embeddings=True,
                          max_position_embeddings=2048, **pm.TARGET)
    for label, cfg in (("target", target), ("1b", model_config("1b"))):
        if label not in shapes:
            continue
        mats, heads, kv, d = pm.shapes(cfg)
        t = torch.empty
        b = types.SimpleNamespace(
            mats=mats, heads=heads, kv=kv, d=d, w={n: [t(*s, dtype=pm.BF16)]
                                                   for n, s in mats.items()},
            norm=t(cfg.hidden_size, dtype=pm.BF16),
            k_cache=t(kv, 256, d, dtype=pm.BF16), v_cache=t(kv, 256, d, dtype=pm.BF16),
            cos=t(256, d, dtype=pm.BF16), sin=t(256, d, dtype=pm.BF16),
            pos=t(1, dtype=torch.long), head_pos=t(1, dtype=torch.long),
            tokens=t(256, dtype=torch.long), ws=Workspace("cpu", 1 << 24, 1 << 16),
            aws={tokens: ArgmaxWorkspace("cpu", cfg.vocab_size // 8 + 1, rows=tokens)},
            x=lambda r, k: t(r, k, dtype=pm.BF16),
            out=lambda r, n, tag: t(r, n, dtype=pm.BF16))
        for name, (_, k) in mats.items():
            if name not in products:
                continue
            cands = [c for c in first_stage(name, k, prune=False) if c.split_k == 1]
            cands += second_stage(cands, name, prune=False)
            with compile_only(90) as compiled:
                for c in cands:
                    launch(b, name, tokens, c, pdl=True)
            kernels = [kern for fn, _, kern in compiled if "argmax_reduce" not in fn]
            for c, kern in zip(cands, kernels):
                u = resource_usage(kern)
                flag = "  SPILLS" if u["stack"] else ""
                print(f"{label} {name:8s} T={tokens} {c.block_n:3d} {c.block_k:5d} "
                      f"{c.split_k} w{c.num_warps} s{c.num_stages}: regs {u['regs']:3d}"
                      f" stack {u['stack']:4d} smem {kern.metadata.shared:6d}{flag}",
                      flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--shapes", nargs="*", default=["target"])
    ap.add_argument("--products", nargs="*", default=["gate_up", "down", "lm_head"])
    a = ap.parse_args()
    aot(a.tokens, a.shapes, a.products)
