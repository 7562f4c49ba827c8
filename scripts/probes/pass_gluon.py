"""Probe (issue 57): a verify pass's gate/up product as a Gluon kernel whose weight tile
is loaded from global memory straight into the MMA's B-operand registers (no
shared-memory staging of W: no STS/BAR/LDSM for it), against the Triton pass kernel
(`pass_mma.gemv_silu_pass`, `tl.dot`, W staged through shared memory) at Chapter 6's
target gate/up (W 2 x 2816 x 1024 BF16, hidden 1024), T = 2, 5, 8 tokens.

The kernel (`gluon_silu_pass_kernel`): out[t, j] = SiLU(xn[t].gate_j) * (xn[t].up_j),
gate_j = W[j], up_j = W[N + j] (W = [gate; up], as `gemv.gemv_silu_reference` takes
it apart), xn = RMSNorm(x) rounded as `tile.normed` / `llama.rms_norm` round it, the
epilogue rounded as `gemv.store_silu`. A program: 8 outputs j (16 rows of W, paired as
`gemv.gate_up_rows` pairs them), the whole K = 1024 in one tile, 16 chains of 64
columns (a batched mma_v2, as `mma_dot.chained_dot`), split_k 1: the Triton pass's
tiling (`mma_configs(..., gpu=True)["gate_up"]`). PDL: launch_dependents first, the
W tile and the norm's weights loaded, then griddepcontrol.wait, then x.

On a GPU (sm_90, H200 or H100), about 60 s (compiles included):
    PYTHONPATH=code timeout 120 python scripts/probes/pass_gluon.py [--rounds 7]
  a. correctness at T = 1, 2, 5, 7, 8 against `gemv_silu_reference` per token (as
     tests/test_pass_mma.py checks `gemv_silu_pass`: rel. error (L2) <= 1e-2, NaN
     fails), max |diff|, and the Triton pass's error beside it; a variant that
     fails at a T is never timed there; after capture each graph's output is
     checked again;
  b. µs a launch, median (min-max) over interleaved rounds (default 7), each a
     CUDA graph of 4 x 23 PDL launches cycling over 23 copies of W (265 MiB, from
     HBM; `pass_mma.py`'s Bench) at T = 2, 5, 8: "gluon" (launch_dependents
     first), "gluon-late" (the repository's order: wait, then launch_dependents,
     `common.pdl_wait`), "gluon-xsmem" (x to the MMA through a shared buffer of its
     own), the Triton pass; the ratios Gluon / Triton pass (and per-round range);
     the step's own `gemv_silu` at T = 1 (`default_configs(True)` fitted) as a
     reference line, every time also as a multiple of it.
On a CPU (no GPU needed; a few seconds a kernel):
    PYTHONPATH=code python scripts/probes/pass_gluon.py --compile-only
  compiles the Gluon kernel (T = 1, 2, 5, 7, 8) and the Triton pass (T = 2, 5, 8)
  for sm_90 (`aot.compile_only`): registers, spills, SASS order (first LDG, PREEXIT,
  ACQBULK, first STS/LDSM, first HMMA), counts before/after the wait; then checks the
  kernel's index mapping and rounding with a PyTorch emulation of its logical program
  (`emulate`) against the reference. Gluon has no interpreter: the layouts and the
  MMA lowering are checked only by part a. on the GPU.

Decision it feeds: if the Gluon kernel is correct and clearly faster than the Triton
pass kernel at T = 5 (rounds' spreads apart), port the pass's products to Gluon (W in
the dot-operand layout); if not, keep `tl.dot`.
"""

import argparse
import os
import sys
import time
from types import SimpleNamespace

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
# PDL: Gluon (triton 3.6) has no griddepcontrol of its own; tl.extra.cuda's
# gdc_wait / gdc_launch_dependents (an inline asm without operands) work as they are
# inside a Gluon kernel: the same PTX, SASS ACQBULK and PREEXIT.
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

T0 = time.time()
HIDDEN, INTER = 1024, 2816  # Chapter 6's target
BLOCK_N, CHAINS, KW, WARPS = 8, 16, 8, 4  # the Triton pass's gate/up tiling
MAX_TOKENS = 16  # the MMA's M
TOL = 1e-2  # tests/test_pass_mma.py's BF16 tolerance (rel. error, L2)
BF16 = torch.bfloat16
# the Gluon kernels timed: launch_dependents first (the brief's order), after the
# wait (the repository's `pdl_wait` order), and x through a shared buffer of its own
# and the norm applied after the product (`norm_after.py`: rstd scales the sums)
VARIANTS = {"gluon": dict(early=True), "gluon-late": dict(early=False),
            "gluon-xsmem": dict(early=True, xsmem=True),
            "gluon-after": dict(early=True, after=True)}


def say(*args):
    print(f"[{time.time() - T0:5.1f} s]", *args, flush=True)


@gluon.jit
def gluon_silu_pass_kernel(w_ptr, x_ptr, out_ptr, norm_ptr, N, eps,
                           K: gl.constexpr, ROWS: gl.constexpr, R: gl.constexpr,
                           BLOCK_N: gl.constexpr, CHAINS: gl.constexpr,
                           KW: gl.constexpr, PDL: gl.constexpr,
                           EARLY: gl.constexpr, XSMEM: gl.constexpr,
                           AFTER: gl.constexpr):
    """out[t, j] = SiLU(xn[t] . W[j]) * (xn[t] . W[N + j]) for t < ROWS, xn =
    RMSNorm(x) (weights norm, eps), j in this program's BLOCK_N outputs. W (2N, K)
    row-major, x (ROWS, K), out (ROWS, N), all BF16; K the whole row, one tile.
    R = next_pow2(ROWS). EARLY: launch_dependents first, else right after the wait
    (the repository's `pdl_wait` order). XSMEM: x goes to the MMA's A layout through
    a shared buffer of its own (one store, one barrier), else by convert_layout.
    AFTER: the MMA takes g * x (rounded once), rstd scales the sums at the end."""
    KC: gl.constexpr = K // CHAINS  # columns a chain
    BN2: gl.constexpr = 2 * BLOCK_N  # rows of W a program: BLOCK_N (gate, up) pairs
    # The MMA (mma.sync m16n8k16, BF16 in, FP32 accumulators), batched over the chains:
    # acc (CHAINS, R, BN2), each warp holding every 4th chain. R < 16 token rows are
    # replicated over the MMA's 16 rows by the layout (the padding costs no loads).
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[2, 0], warps_per_cta=[gl.num_warps(), 1, 1], instr_shape=[1, 16, 8])
    # The operands' register layouts. k_width 8: a thread holds 8 consecutive k of a
    # row (one 16-byte load of W); the MMA then sees K in a permuted order, the same
    # for x and W: the same products, summed in another FP32 order.
    WL: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    XL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    # x as (CHAINS, R, KC), compact for the norm's arithmetic (each element in one
    # thread, 8 consecutive columns a thread); converted to XL for the MMA.
    XB: gl.constexpr = gl.BlockedLayout([1, 1, 8], [4, 1, 8], [gl.num_warps(), 1, 1],
                                        [2, 1, 0])

    if PDL and EARLY:  # nothing before here reads what the kernel before writes
        gdc_launch_dependents()
    block = gl.program_id(0)

    # The weight tile as (CHAINS, KC, BN2): [c, k, n] = W[rows[n], c KC + k], loaded
    # in XL's partner layout WL: these registers go to the MMA as they are. Tile row
    # n = 2i + p is output j = block BLOCK_N + i's gate row (p = 0: W[j]) or up row
    # (p = 1: W[N + j]), as `gemv.gate_up_rows` pairs them: the accumulator holds a
    # pair's two sums in one thread (adjacent MMA columns), split apart at the end.
    c = gl.arange(0, CHAINS, layout=gl.SliceLayout(1, gl.SliceLayout(2, WL)))
    k = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(2, WL)))
    n = gl.arange(0, BN2, layout=gl.SliceLayout(0, gl.SliceLayout(1, WL)))
    rows = block * BLOCK_N + n // 2 + (n % 2) * N
    w_col = gl.expand_dims(gl.expand_dims(c * KC, 1), 2) + \
        gl.expand_dims(gl.expand_dims(k, 0), 2)  # (CHAINS, KC, 1)
    w_row = gl.expand_dims(gl.expand_dims(rows, 0), 1).to(gl.int64) * K  # (1, 1, BN2)
    w = gl.load(w_ptr + w_row + w_col)  # no mask: the wrapper checks N % BLOCK_N == 0

    # x's columns in XB, and the norm's weights there (weights: before the wait too)
    xc = gl.arange(0, CHAINS, layout=gl.SliceLayout(1, gl.SliceLayout(2, XB)))
    xt = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, XB)))
    xk = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(1, XB)))
    x_col = gl.expand_dims(gl.expand_dims(xc * KC, 1), 2) + \
        gl.expand_dims(gl.expand_dims(xk, 0), 1)  # (CHAINS, 1, KC)
    g = gl.load(norm_ptr + x_col).to(gl.float32)

    if PDL:  # x is the kernel before's output
        gdc_wait()
        if not EARLY:
            gdc_launch_dependents()

    # x (R, K) as (CHAINS, R, KC); rows past ROWS zero (their sums are never stored)
    tt = gl.expand_dims(gl.expand_dims(xt, 0), 2)  # (1, R, 1)
    xf = gl.load(x_ptr + tt * K + x_col, mask=tt < ROWS, other=0.0).to(gl.float32)
    # RMSNorm as LlamaRMSNorm (`tile.normed`, `llama.rms_norm`): rstd in FP32 with
    # IEEE sqrt and division, x * rstd rounded to BF16, times g rounded to BF16.
    # .to(bfloat16) rounds to nearest even, as the repository's `round_to` does (it
    # uses integer arithmetic only for the interpreter, which truncates).
    ss = gl.sum(gl.sum(xf * xf, axis=2), axis=0)  # (R,) each token's sum of squares
    rstd = gl.div_rn(gl.full_like(ss, 1.0), gl.sqrt_rn(ss / K + eps))
    if AFTER:  # nothing before the MMA waits for the sum of squares
        xn = (g * xf).to(gl.bfloat16)
    else:
        xn = g * (xf * gl.expand_dims(gl.expand_dims(rstd, 0), 2)).to(gl.bfloat16) \
            .to(gl.float32)
        xn = xn.to(gl.bfloat16)

    # The product: CHAINS independent accumulators (an MMA waits only for its own
    # chain's last), summed over the chains (across the warps: through shared memory).
    acc = gl.zeros((CHAINS, R, BN2), gl.float32, layout=mma)
    if XSMEM:  # all of x stored at once: 7 barriers after the wait, not 13 (T > 2)
        SL: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0])
        xa = gl.allocate_shared_memory(gl.bfloat16, [CHAINS, R, KC], SL, xn).load(XL)
    else:  # Triton's conversion, in pieces of a 4 KB scratch (BAR each)
        xa = gl.convert_layout(xn, XL)
    acc = mma_v2(xa, w, acc)
    y = gl.sum(acc, axis=0)  # (R, BN2)
    if AFTER:
        r = gl.convert_layout(rstd, gl.SliceLayout(1, y.type.layout))
        y = y * gl.expand_dims(r, 1)

    # The epilogue, `gemv.store_silu`'s: tile column 2i gate, 2i + 1 up of output i;
    # every operation rounded to BF16 as the Llama MLP (F.silu(gate) * up) rounds it.
    gate, up = gl.split(gl.reshape(y, (R, BLOCK_N, 2)))
    gate = gate.to(gl.bfloat16).to(gl.float32)
    silu = (gate / (1.0 + gl.exp(-gate))).to(gl.bfloat16).to(gl.float32)
    out = (silu * up.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16)
    OL: gl.constexpr = gate.type.layout  # the split's layout, whatever it inferred
    ot = gl.expand_dims(gl.arange(0, R, layout=gl.SliceLayout(1, OL)), 1)
    oj = gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, OL)), 0)
    gl.store(out_ptr + ot * N + block * BLOCK_N + oj, out, mask=ot < ROWS)


def gluon_silu_pass(w, x, out, norm, eps=1e-5, pdl=False, early=True,
                    xsmem=False, after=False):
    """out (T, N) = SiLU(xn W[:N]ᵀ) * (xn W[N:]ᵀ), xn = RMSNorm(x) (weights `norm`),
    for the stacked gate/up W (2N, K) and x (T, K), 1 <= T <= 16, all BF16 and
    contiguous; K = 64 CHAINS = 1024 (the whole row one tile in registers, 64
    columns a chain as the x layout spans them), N a multiple of BLOCK_N. Refused
    before any launch otherwise.
    early: launch_dependents before the weights' loads (else after the wait);
    xsmem: x to the MMA through a shared buffer of its own (else convert_layout);
    after: the norm applied after the product (rstd on the sums)."""
    for name, t, dim in (("w", w, 2), ("x", x, 2), ("out", out, 2), ("norm", norm, 1)):
        if t.dim() != dim or t.dtype != BF16 or not t.is_contiguous():
            raise ValueError(f"{name} {tuple(t.shape)} {t.dtype}: {dim}-D BF16, "
                             "contiguous")
        if t.device != w.device:
            raise ValueError(f"{name} on {t.device}, w on {w.device}")
    n2, k = w.shape
    n, tokens = n2 // 2, x.shape[0]
    if n2 % (2 * BLOCK_N) or k != 64 * CHAINS:
        raise ValueError(f"w {tuple(w.shape)}: 2N x K, N a multiple of {BLOCK_N}, "
                         f"K = {64 * CHAINS}")
    if x.shape[1] != k or not 1 <= tokens <= MAX_TOKENS:
        raise ValueError(f"x {tuple(x.shape)}: (T, {k}), 1 <= T <= {MAX_TOKENS}")
    if tuple(out.shape) != (tokens, n) or tuple(norm.shape) != (k,):
        raise ValueError(f"out {tuple(out.shape)}, norm {tuple(norm.shape)}: "
                         f"({tokens}, {n}) and ({k},)")
    return gluon_silu_pass_kernel[(n // BLOCK_N,)](
        w, x, out, norm, n, eps, K=k, ROWS=tokens,
        R=1 << (tokens - 1).bit_length(), BLOCK_N=BLOCK_N, CHAINS=CHAINS, KW=KW,
        PDL=pdl, EARLY=early, XSMEM=xsmem, AFTER=after,
        num_warps=WARPS, launch_pdl=pdl)


def emulate(w, x, norm, eps=1e-5, after=False):
    """The kernel's logical program in PyTorch (CPU, FP32): each program's rows of W
    and columns of x and W as the kernel indexes them, the chains' partial sums, the
    split of the accumulator and the roundings. Checks the index mapping and the
    arithmetic; not the layouts nor the MMA's lowering (no Gluon interpreter)."""
    n2, k = w.shape
    n, T = n2 // 2, x.shape[0]
    R, kc = 1 << (T - 1).bit_length(), k // CHAINS
    blocks = torch.arange(n // BLOCK_N)
    nn = torch.arange(2 * BLOCK_N)
    rows = blocks[:, None] * BLOCK_N + nn // 2 + (nn % 2) * n  # (blocks, BN2)
    cols = torch.arange(CHAINS)[:, None] * kc + torch.arange(kc)  # (CHAINS, KC)
    xp = torch.zeros(R, k)
    xp[:T] = x.float()
    xf = xp[:, cols]  # (R, CHAINS, KC)
    rstd = 1.0 / torch.sqrt((xf * xf).sum((1, 2)) / k + eps)
    if after:
        xn = (norm.float()[cols] * xf).to(BF16)
    else:
        xn = (norm.float()[cols] * (xf * rstd[:, None, None]).to(BF16).float()) \
            .to(BF16)
    wt = w.float()[rows][:, :, cols]  # (blocks, BN2, CHAINS, KC)
    part = torch.einsum("rck,bnck->bcrn", xn.float(), wt)  # each chain's sums
    y = part.sum(1)  # (blocks, R, BN2)
    if after:
        y = y * rstd[None, :, None]
    gate, up = y.reshape(len(blocks), R, BLOCK_N, 2).unbind(-1)
    gate = gate.to(BF16).float()
    silu = (gate / (1.0 + torch.exp(-gate))).to(BF16).float()
    out = (silu * up.to(BF16).float()).to(BF16)  # (blocks, R, BLOCK_N)
    return out.permute(1, 0, 2).reshape(R, n)[:T]


def rel(a, b):
    """||a - b|| / ||b|| in FP64 (tests' kernel_checks.rel_err), and max |a - b|."""
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm()), float((a - b).abs().max())


def reference(w, x, norm, eps=1e-5):
    from gpuinfer.kernels.gemv import gemv_silu_reference
    return torch.stack([gemv_silu_reference(w, x[t], norm=norm, eps=eps)
                        for t in range(x.shape[0])])


# -- compile-only (CPU) ---------------------------------------------------------------

def sass_order(text):
    """A kernel's SASS: (order: each marker's address and how many instructions, no
    NOPs, come before it; instructions after the wait up to the last EXIT; kinds
    before and after the wait)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pass_sass_order import SASS_KINDS, kind_of, main_end, sass_instructions
    ins = sass_instructions(text)
    end = main_end(text)
    first = {}
    for i, (addr, op, _) in enumerate(ins):
        for mark in ("LDG", "PREEXIT", "ACQBULK", "STS", "LDSM", "HMMA"):
            if op.startswith(mark) and mark not in first and \
                    not (mark == "LDG" and op.startswith("LDGSTS")):
                first[mark] = (addr, i)
    order = sorted(first.items(), key=lambda m: m[1][0])
    line = " -> ".join(f"{m} {a:04x} (#{i})" for m, (a, i) in order)
    wait = first.get("ACQBULK", (0, 0))[0]
    before, after, main = {}, {}, 0
    for addr, op, _ in ins:
        kind = kind_of(op, SASS_KINDS)
        side = after if addr > wait else before
        if kind and kind not in ("BRA", "EXIT", "WAIT", "LAUNCH_DEP"):
            side[kind] = side.get(kind, 0) + 1
        main += wait < addr < end
    return line, main, before, after


def compile_only_main():
    from gpuinfer.kernels.aot import compile_only, resource_usage
    from gpuinfer.kernels.pass_mma import gemv_silu_pass, mma_configs
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pass_sass_dump import sass_of

    def t(*shape, dt=BF16):  # never touched: only its dtype and address matter
        return torch.empty(shape, dtype=dt)

    cfg = SimpleNamespace(hidden_size=HIDDEN, intermediate_size=INTER,
                          num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                          vocab_size=8192)
    triton_cfg = mma_configs(cfg, gpu=True)["gate_up"]
    say(f"sm_90, PDL on, W {2 * INTER} x {HIDDEN} BF16; Triton pass tiling "
        f"{triton_cfg}")
    jobs = [(f"gluon T={T}", T, lambda T=T: gluon_silu_pass(
        t(2 * INTER, HIDDEN), t(T, HIDDEN), t(T, INTER), t(HIDDEN), pdl=True))
        for T in (1, 2, 5, 7, 8)]
    for name in ("gluon-late", "gluon-xsmem", "gluon-after"):
        jobs += [(f"{name} T={T}", T, lambda T=T, v=VARIANTS[name]: gluon_silu_pass(
            t(2 * INTER, HIDDEN), t(T, HIDDEN), t(T, INTER), t(HIDDEN), pdl=True, **v))
            for T in (2, 5, 8)]
    jobs += [(f"triton pass T={T}", T, lambda T=T: gemv_silu_pass(
        t(2 * INTER, HIDDEN), t(T, HIDDEN), t(T, INTER), norm=t(HIDDEN),
        config=triton_cfg, pdl=True)) for T in (2, 5, 8)]
    spilled = 0
    for label, T, launch in jobs:
        with compile_only(90) as compiled:
            launch()
        kernel = compiled[-1][2]
        u = resource_usage(kernel)
        spilled += u["stack"] > 0
        line, main, before, after = sass_order(sass_of(kernel))
        say(f"{label}: regs {u['regs']} stack {u['stack']} smem "
            f"{kernel.metadata.shared}")
        print(f"    order: {line}")
        print("    before the wait: " + " ".join(
            f"{k}{v}" for k, v in sorted(before.items())) +
            f"; after: {main} instructions (main body) " + " ".join(
            f"{k}{v}" for k, v in sorted(after.items())), flush=True)
    say("no spills" if not spilled else f"{spilled} kernels SPILLED")

    # The logical program, emulated, against the reference (CPU, target shape)
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(2 * INTER, HIDDEN, generator=g) / HIDDEN ** 0.5).to(BF16)
    norm = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).to(BF16)
    ok = True
    for T in (1, 2, 5, 7, 8):
        x = torch.randn(T, HIDDEN, generator=g).to(BF16)
        for after in (False, True):
            err, diff = rel(emulate(w, x, norm, after=after), reference(w, x, norm))
            ok &= err <= TOL
            say(f"emulated T={T}{' after' * after}: rel {err:.2e} max |diff| "
                f"{diff:.3g} {'ok' if err <= TOL else 'FAILED'} (tol {TOL:g})")
    # the emulation must see a swapped gate/up: a check that can fail
    x = torch.randn(5, HIDDEN, generator=g).to(BF16)
    swapped = torch.cat([w[INTER:], w[:INTER]])
    err, _ = rel(emulate(swapped, x, norm), reference(w, x, norm))
    say(f"emulated with gate/up swapped (must fail): rel {err:.2e}")
    return 0 if ok and not spilled and err > TOL else 1


# -- on the GPU ------------------------------------------------------------------------

def gpu_main(rounds):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import pass_mma as pm  # the probe: Bench (weights' copies, buffers, launches)
    from pass_breakdown import graphed  # a CUDA graph of many launches
    from gpuinfer.kernels.common import pdl_supported
    from gpuinfer.measure.rounds import interleaved_rounds
    from gpuinfer.model.configs import model_config

    torch.backends.cuda.matmul.allow_tf32 = False  # the reference's FP32 products
    dev = torch.cuda.get_device_name()
    pdl = pdl_supported("cuda")
    say(f"{dev}, PDL {'on' if pdl else 'OFF (not sm_90+)'}")
    target = model_config("tiny", vocab_size=8192, tie_word_embeddings=True,
                          max_position_embeddings=2048, **pm.TARGET)
    b = pm.Bench(target)
    n2, k = b.mats["gate_up"]
    n = n2 // 2
    copies = b.w["gate_up"]
    say(f"gate_up W {n2} x {k}, {len(copies)} copies ({len(copies) * n2 * k * 2 >> 20}"
        f" MiB); Triton pass {b.new['gate_up']}; step {b.step_cfg['gate_up']}")

    # a. correctness, per T and variant, before any timing
    good = set()  # (variant, T) within TOL: only those are timed
    for T in (1, 2, 5, 7, 8):
        x, w = b.x(T, k), copies[0]
        ref = reference(w, x, b.norm)
        line = []
        for name, v in VARIANTS.items():
            out = torch.full((T, n), float("nan"), device="cuda", dtype=BF16)
            gluon_silu_pass(w, x, out, b.norm, pdl=pdl, **v)
            torch.cuda.synchronize()
            err, diff = rel(out, ref)
            if err <= TOL:  # NaN (an output never written) fails too
                good.add((name, T))
            line.append(f"{name} rel {err:.2e} max|diff| {diff:.3g} "
                        f"{'ok' if err <= TOL else 'FAILED'}")
        out = torch.full((T, n), float("nan"), device="cuda", dtype=BF16)
        pm.gemv_silu_pass(w, x, out, norm=b.norm, config=b.new["gate_up"], pdl=pdl)
        torch.cuda.synchronize()
        err, diff = rel(out, ref)
        say(f"check T={T} (tol {TOL:g}): " + "  ".join(line) +
            f"  (triton pass rel {err:.2e} max|diff| {diff:.3g})")
    queries = [T for T in (2, 5, 8) if any((name, T) in good for name in VARIANTS)]
    failed = [f"{name} T={T}" for T in (2, 5, 8) for name in VARIANTS
              if (name, T) not in good]
    if failed:
        say(f"not timed (FAILED their check): {', '.join(failed)}")
    if not queries:
        say("no Gluon kernel passed: nothing timed")
        return 1

    # b. timing: graphs of 4 cycles over the copies, from HBM
    count = 4 * len(copies)
    outs = {T: torch.zeros(T, n, device="cuda", dtype=BF16) for T in queries}

    def gluon_fn(T, v):
        return lambda i: gluon_silu_pass(copies[i % len(copies)], b.x(T, k), outs[T],
                                         b.norm, pdl=pdl, **v)

    fns = {("step", 1): graphed(lambda i: b.launch("step", "gate_up", 1, i), count)}
    for T in queries:
        for name, v in VARIANTS.items():
            if (name, T) in good:
                fns[name, T] = graphed(gluon_fn(T, v), count)
        fns["triton", T] = graphed(lambda i, T=T: b.launch("mma", "gate_up", T, i),
                                   count)
    say(f"{len(fns)} graphs of {count} launches captured")
    # each graph's own output: the last launch's copy of W, checked once more
    for T in queries:
        ref = reference(copies[(count - 1) % len(copies)], b.x(T, k), b.norm)
        for name in VARIANTS:
            if (name, T) in fns:
                outs[T].fill_(float("nan"))
                fns[name, T][0]()
                torch.cuda.synchronize()
                err, _ = rel(outs[T], ref)
                say(f"graph replay T={T}: {name} rel {err:.2e} "
                    f"{'ok' if err <= TOL else 'FAILED'}")
    timed = interleaved_rounds({key: f for key, (f, _) in fns.items()},
                               rounds=rounds, warmup=1)
    us = {key: sorted(1e3 * v / c for v in timed.times_ms[key])
          for key, (_, c) in fns.items()}

    def med(key):
        return us[key][len(us[key]) // 2]

    def fmt(key):
        return f"{med(key):6.2f} ({us[key][0]:.2f}-{us[key][-1]:.2f})"

    say(f"{dev}: µs a launch, median (min-max) over {rounds} interleaved rounds, "
        f"graphs of {count} launches, PDL {'on' if pdl else 'off'}")
    step = med(("step", 1))
    say(f"step gemv_silu T=1 (reference): {fmt(('step', 1))}")
    for T in queries:
        tr = ("triton", T)
        say(f"T={T}: triton pass {fmt(tr)} = {med(tr) / step:.2f} x step")
        for name in VARIANTS:
            g = (name, T)
            if g not in us:
                continue
            per = sorted(a / c for a, c in zip(timed.times_ms[g], timed.times_ms[tr]))
            apart = us[g][-1] < us[tr][0] or us[tr][-1] < us[g][0]
            say(f"T={T}: {name:11s} {fmt(g)} = {med(g) / step:.2f} x step;  "
                f"{name} / triton pass {med(g) / med(tr):.3f} (per round "
                f"{per[0]:.3f}-{per[-1]:.3f}, spreads "
                f"{'apart' if apart else 'overlap'})")
    say("done")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true",
                    help="compile for sm_90 on a CPU, emulate the arithmetic")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--norm-after", action="store_true",
                    help="the Triton pass with its norm after the MMA (norm_after.py)")
    a = ap.parse_args()
    if a.norm_after:  # before the Triton pass compiles
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import norm_after
        norm_after.patch()
    if a.compile_only:
        return compile_only_main()
    if not torch.cuda.is_available():
        say("no GPU: run with --compile-only")
        return 2
    return gpu_main(a.rounds)


if __name__ == "__main__":
    sys.exit(main())
