"""Probe helper (issue 57): why the pass's q/k/v charges 4.92 µs a launch at T = 5 inside
a pass (2.89 at T = 2, 2.26 in the step: `pass_gaps.py`, H100) when alone, back to back,
it takes 2.69 (2.34 the step's: `pass_breakdown.py`). It becomes resident as early as the
step's, so its weights are loaded ahead; what grows is its work after down ends. Each
arm changes one thing the pass's q/k/v meets inside a pass and not alone:

- `no-norm`: q/k/v without x's RMSNorm (its prologue's sums of squares and scaling);
- `stale-x`: q/k/v reads x from a buffer nothing writes (alone, x is never written; in
  a pass down has just written it, its lines in one L2 partition);
- `attn-late`: the pass's attention lets the next kernel (o) launch only when it ends,
  not before its wait (then o's programs do not sit beside q/k/v's, loading o);
- `epi-cvt`: q/k/v's epilogue (rotary) rounds by conversion instructions, the same bits
  as `round_to`'s integer operations (`hw_round.check`), step and pass;
- `fast-rstd`: every pass product's norm factor by one rsqrt.approx (`mma_dot.tokens_rstd`)
  instead of IEEE sqrt and division, which compile for each of the R rows to a chain
  of MUFU, Newton steps and a branch to a slow path (about 200 serial instructions at
  R = 8, the same in each program after its wait). The pass differs from the step by a
  few ulps of the factor (it already differs by its summation order).

The first two give wrong logits (timing only: the checks will say DISAGREES);
`attn-late` and `epi-cvt` give the same bits, `fast-rstd` the same top-1 (it needs
`pending/next-recording/chapters-5-6.patch`, which makes it the package's own). Run by
`pass_order.py --qkv=ARM`, alternating processes:

    cd scripts/probes && for a in "" --qkv=no-norm --qkv=stale-x --qkv=attn-late \\
            --qkv=epi-cvt --qkv=fast-rstd; do
        PYTHONPATH=../../code timeout 120 python pass_order.py $a --shapes target
    done
"""
import torch
import triton
import triton.language as tl

ARMS = ("no-norm", "stale-x", "attn-late", "epi-cvt", "fast-rstd")


@triton.jit
def rstd_fast(ss, K, eps):
    """`mma_dot.tokens_rstd` by the approximate reciprocal square root (one MUFU)."""
    return tl.math.rsqrt(ss / K + eps)


@triton.jit
def no_launch(PDL: tl.constexpr):
    """`pdl_launch_next` that does nothing: the next kernel launches at this one's end."""
    pass


def _wrap_qkv(change):
    """The pass decoder's q/k/v launcher with its arguments changed by `change`."""
    from gpuinfer.decode import triton_pass
    launch = triton_pass.qkv_rope_pass

    def qkv_rope_pass(w, x, *args, **kw):
        x, kw = change(x, kw)
        return launch(w, x, *args, **kw)
    triton_pass.qkv_rope_pass = qkv_rope_pass


def patch(arm: str):
    """Before any kernel compiles and any decoder is built."""
    if arm not in ARMS:
        raise SystemExit(f"qkv_context: no arm {arm!r}; one of {ARMS}")
    if arm == "no-norm":
        _wrap_qkv(lambda x, kw: (x, {**kw, "norm": None}))
    elif arm == "stale-x":
        stale = {}

        def change(x, kw):
            key = (tuple(x.shape), x.device, x.dtype)
            if key not in stale:  # made once, before or during the first capture
                stale[key] = torch.ones_like(x)
            return stale[key], kw
        _wrap_qkv(change)
    elif arm == "attn-late":
        from gpuinfer.kernels import pass_attention
        pass_attention.pdl_launch_next = no_launch
    elif arm == "fast-rstd":
        from gpuinfer.kernels import mma_dot
        if not hasattr(mma_dot, "tokens_rstd"):  # else the swap would change nothing
            raise SystemExit("qkv_context fast-rstd: mma_dot has no tokens_rstd; apply "
                             "pending/next-recording/chapters-5-6.patch first")
        mma_dot.tokens_rstd = rstd_fast
    elif arm == "epi-cvt":
        import hw_round
        from gpuinfer.kernels import qkv_rope
        if torch.cuda.is_available():
            print(f"epi-cvt: the conversion gives round_to's bits on {hw_round.check()} "
                  "values", flush=True)
        qkv_rope.round_to = hw_round.round_hw
