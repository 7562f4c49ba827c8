"""Probe (issue 57), CPU: a gate/up pass program in Gluon whose weight tile is loaded
from global memory straight into the MMA's B-operand layout (DotOperandLayout,
k_width KW), so no shared-memory staging of the weights exists at all: the registers
loaded before griddepcontrol.wait go to the HMMAs as they are. x (after the wait) is
RMSNorm'ed and converted to the A-operand layout (through shared memory), 16 chains of
64 columns (a batched mma_v2, as `mma_dot.chained_dot`), summed. Epilogue simplified
(the FP32 sums stored, no SiLU): a demonstration of the compiled order, not a kernel.
Compiles for sm_90 (`aot.compile_only`) and dumps TTGIR/PTX/SASS into DIR.

    PYTHONPATH=code python scripts/probes/pass_sass_gluon.py [DIR=/tmp/pass_sass]
"""
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from gpuinfer.kernels.aot import compile_only

sys.path.insert(0, os.path.dirname(__file__))
from pass_sass_dump import dump_and_say  # noqa: E402


@gluon.jit
def gl_gate_up_pass(w_ptr, x_ptr, out_ptr, norm_ptr, N, K, stride_w, eps,
                    BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, CHAINS: gl.constexpr,
                    ROWS: gl.constexpr, R: gl.constexpr, KW: gl.constexpr,
                    PDL: gl.constexpr):
    KC: gl.constexpr = BLOCK_K // CHAINS
    BN2: gl.constexpr = 2 * BLOCK_N
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1],
                                                  instr_shape=[1, 16, 8])
    WL: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    XL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    XB: gl.constexpr = gl.BlockedLayout([1, 1, 8], [4, 1, 8], [4, 1, 1], [2, 1, 0])
    block = gl.program_id(0)
    # the weight tile as (CHAINS, KC, 2 BLOCK_N): [c, k, n] = W[row n, c KC + k]
    c = gl.arange(0, CHAINS, layout=gl.SliceLayout(1, gl.SliceLayout(2, WL)))
    k = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(2, WL)))
    n = gl.arange(0, BN2, layout=gl.SliceLayout(0, gl.SliceLayout(1, WL)))
    rows = block * BLOCK_N + n // 2 + (n % 2) * N
    col = gl.expand_dims(gl.expand_dims(c, 1), 2) * KC + \
        gl.expand_dims(gl.expand_dims(k, 0), 2)
    w = gl.load(w_ptr + gl.expand_dims(gl.expand_dims(rows, 0), 1).to(gl.int64)
                * stride_w + col)
    # x and the norm's weights as (CHAINS, R, KC)
    xc = gl.arange(0, CHAINS, layout=gl.SliceLayout(1, gl.SliceLayout(2, XB)))
    xt = gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, XB)))
    xk = gl.arange(0, KC, layout=gl.SliceLayout(0, gl.SliceLayout(1, XB)))
    xcol = gl.expand_dims(gl.expand_dims(xc, 1), 2) * KC + \
        gl.expand_dims(gl.expand_dims(xk, 0), 1)
    g = gl.load(norm_ptr + xcol).to(gl.float32)
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r",
                                  [], dtype=gl.int32, is_pure=False, pack=1)
    tt = gl.expand_dims(gl.expand_dims(xt, 0), 2)
    x = gl.load(x_ptr + tt * K + xcol, mask=(tt < ROWS) & (xcol < K), other=0.0)
    xf = x.to(gl.float32)
    ss = gl.sum(gl.sum(xf * xf, axis=2), axis=0)
    rstd = gl.div_rn(gl.full_like(ss, 1.0), gl.sqrt_rn(ss / K + eps))
    r3 = gl.expand_dims(gl.expand_dims(rstd, 0), 2)
    xn = (g * (xf * r3).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16)
    acc = gl.zeros((CHAINS, R, BN2), gl.float32, layout=mma)
    acc = mma_v2(gl.convert_layout(xn, XL), w, acc)
    y = gl.sum(acc, axis=0)
    yt = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(0, mma)))
    yn = gl.arange(0, BN2, layout=gl.SliceLayout(0, gl.SliceLayout(0, mma)))
    o = gl.expand_dims(yt, 1) * (2 * N) + block * BN2 + gl.expand_dims(yn, 0)
    gl.store(out_ptr + o, y, mask=gl.expand_dims(yt, 1) < ROWS)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/tmp/pass_sass"
    os.makedirs(d, exist_ok=True)
    H, I = 1024, 2816
    t = lambda *s, dt=torch.bfloat16: torch.empty(s, dtype=dt)  # noqa: E731
    for T in (2, 5):
        for kw in (2, 8):
            R = 1 << (T - 1).bit_length()
            with compile_only(90) as compiled:
                gl_gate_up_pass[(I // 8,)](
                    t(2 * I, H), t(T, H), t(T, 2 * I, dt=torch.float32), t(H), I, H, H,
                    1e-5, BLOCK_N=8, BLOCK_K=H, CHAINS=16, ROWS=T, R=R, KW=kw, PDL=True,
                    num_warps=4, launch_pdl=True)
            k = compiled[-1][2]
            label = f"gluon_gate_up_T{T}_kw{kw}"
            dump_and_say(d, label, k)


if __name__ == "__main__":
    main()
