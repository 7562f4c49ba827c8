"""Probe (issue 58, item 2b): weight tiles in shared memory before the PDL wait
(`kernels.prefetch_gemv`) against today's GEMV (`gemv.gemv`, one tile in registers
before the wait), in a chain of the 1B step's matrices: 16 layers of q/k/v (3072 x
2048), o (2048 x 2048), gate/up (16384 x 2048), down (2048 x 8192), each product
reading the one before's output, 64 launches with PDL in one CUDA graph (1.95 GB of
weights: nothing stays in L2). BF16, plain products (no RMSNorm, SiLU or residual):
both kernels do the same work, and only how the weights reach the threads differs.

1. Checked: each variant's four products on layer 0's matrices against
   W.float() @ x.float() (rel. err <= 1e-2), and its whole chain against the same
   chain in PyTorch (<= 2e-2). Failures are printed first, one line each (a kernel
   that does not compile included); such variants are left out.
2. Timed in interleaved rounds (CUDA events, each call REPLAYS graph replays):
   median and min-max µs a chain, GB/s of weights, and today/this (the median ratio
   against today's chain, with its per-round low-high, and whether the two spreads
   separate).

Usage on an H100/H200 (~1-2 min; under a timeout: a wrong barrier count would hang):
    PYTHONPATH=code timeout 300 python scripts/probes/prefetch_chain.py [ROUNDS]
On a CPU, the registers and shared memory of every variant's kernels, compiled for
sm_90 (no GPU needed; run without TRITON_INTERPRET):
    PYTHONPATH=code python scripts/probes/prefetch_chain.py --aot
"""

import sys
import time

import torch
import triton

from gpuinfer.kernels.common import Workspace, pdl_supported
from gpuinfer.kernels.gemv import GemvConfig, gemv
from gpuinfer.kernels.prefetch_gemv import prefetch_gemv, shared_bytes
from gpuinfer.measure.rounds import interleaved_rounds
from gpuinfer.measure.timing import capture_graph

HID, HEADS, KV, D, INTER, LAYERS = 2048, 32, 8, 64, 8192, 16
SHAPES = {"qkv": ((HEADS + 2 * KV) * D, HID), "o": (HID, HEADS * D),
          "gate_up": (2 * INTER, HID), "down": (HID, INTER)}
REPLAYS, STAGES = 10, (1, 2, 4)
DT = torch.bfloat16
# Today's step tiling (`tiling.default_configs`), in rows (q/k/v and gate/up are
# tiled in pairs there: 4 pairs = 8 rows), and the chain's (`tiling.alone_configs`)
TODAY = {"qkv": GemvConfig(8, 1024, 1, 4), "o": GemvConfig(8, 2048, 1, 4),
         "gate_up": GemvConfig(8, 512, 1, 4), "down": GemvConfig(8, 2048, 1, 4)}
ALONE = {"qkv": GemvConfig(8, 2048, 1, 8), "o": GemvConfig(8, 2048, 1, 8),
         "gate_up": GemvConfig(4, 2048, 1, 4), "down": GemvConfig(8, 2048, 1, 8)}
# prefetch_gemv's tilings, (block_n, block_k, num_warps) a matrix: today's tiles;
# 8 KB tiles, 8 rows; 8 KB tiles, 16 rows of 256 columns
TILINGS = {"step tiles": {m: (c.block_n, c.block_k, c.num_warps)
                          for m, c in TODAY.items()},
           "8x512 w4": {m: (8, 512, 4) for m in SHAPES},
           "16x256 w4": {m: (16, 256, 4) for m in SHAPES}}


def prefetch_variants() -> dict:
    """name -> {matrix: keyword arguments of prefetch_gemv}."""
    return {f"tma {tiling} s{s}": {m: dict(block_n=bn, block_k=bk, num_warps=w,
                                           stages=s)
                                   for m, (bn, bk, w) in tiles.items()}
            for tiling, tiles in TILINGS.items() for s in STAGES}


def aot_table() -> int:
    """Every variant's kernels compiled for sm_90 on this machine: registers, spills
    (stack), shared memory, the blocks an SM holds (64 K registers, 228 KB of shared
    memory with 1 KB reserved a block, 64 warps; at most 32 blocks) and the weights
    they hold before the PDL wait (today: one tile a block, in registers). Exit
    status 1 if a kernel spills or fails to compile."""
    from gpuinfer.kernels import aot

    def empty(*shape):
        return torch.empty(shape, dtype=DT)

    rows = [(f"today {tag}", m, c.block_n, c.block_k, c.num_warps, 1,
             lambda w, x, out, c=c: gemv(w, x, out, config=c, pdl=True))
            for tag, configs in (("step", TODAY), ("chain", ALONE))
            for m, c in configs.items()]
    rows += [(name, m, kw["block_n"], kw["block_k"], kw["num_warps"], kw["stages"],
              lambda w, x, out, kw=kw: prefetch_gemv(w, x, out, pdl=True, **kw))
             for name, per in prefetch_variants().items() for m, kw in per.items()]
    bad = 0
    print(f"{'variant':22s} {'matrix':8s} {'stages':>6s} {'regs':>4s} {'stack':>5s} "
          f"{'shared B':>9s} {'blocks/SM':>9s} {'KB before wait/SM':>17s}")
    for name, m, bn, bk, warps, stages, launch in rows:
        n, k = SHAPES[m]
        try:
            with aot.compile_only(90) as done:
                launch(empty(n, k), empty(k), empty(n))
        except Exception as e:  # noqa: BLE001 - one row per failure
            print(f"{name:22s} {m:8s} FAILED {type(e).__name__}: {str(e)[:200]}")
            bad += 1
            continue
        kernel = done[-1][2]
        use, shared = aot.resource_usage(kernel), kernel.metadata.shared
        bk = min(bk, triton.next_power_of_2(k))
        stages = min(stages, triton.cdiv(k, bk))
        regs = -(-use["regs"] * 32 // 256) * 256  # allocated a warp, 256 at a time
        fit = min(65536 // (regs * warps), 233472 // (shared + 1024), 64 // warps, 32)
        print(f"{name:22s} {m:8s} {stages:6d} {use['regs']:4d} {use['stack']:5d} "
              f"{shared:9,d} {fit:9d} {fit * stages * bn * bk * 2 / 1024:17.0f}")
        bad += use["stack"] > 0
        if name.startswith("tma") and shared != shared_bytes(stages, bn, bk, k):
            print(f"  ! shared_bytes says {shared_bytes(stages, bn, bk, k):,}")
            bad += 1
    return 1 if bad else 0


if "--aot" in sys.argv:
    sys.exit(aot_table())

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 21
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    print("needs a Hopper GPU (TMA, PDL); --aot compiles the kernels without one")
    sys.exit(1)
PDL = pdl_supported("cuda")
t0 = time.perf_counter()
torch.manual_seed(0)


def log(*a):
    print(f"[{time.perf_counter() - t0:5.0f} s]", *a, flush=True)


# Weights scaled by 1/sqrt(K): every product keeps its input's magnitude, 64 deep.
WEIGHTS = [{m: (torch.randn(n, k, device="cuda") * k ** -0.5).to(DT)
            for m, (n, k) in SHAPES.items()} for _ in range(LAYERS)]
BYTES = sum(w.numel() * w.element_size() for layer in WEIGHTS for w in layer.values())
X0 = torch.randn(HID, device="cuda").to(DT)
WS = Workspace("cuda", 1, 8192)  # gemv's split-K counters (none used: split_k 1)


class Chain:
    """One variant's buffers and a call that launches its 64 products: x -> qkv; the
    first 2048 of qkv (attention's output stands in) -> o; o -> gate/up; the first
    8192 of gate/up -> down -> y, the next layer's x. x itself is never written, so
    every replay computes the same y."""

    def __init__(self, launch):
        self.launch = launch  # launch(matrix, w, x, out)
        self.x = X0.clone()
        self.qkv = torch.empty(SHAPES["qkv"][0], device="cuda", dtype=DT)
        self.o = torch.empty(HID, device="cuda", dtype=DT)
        self.h = torch.empty(2 * INTER, device="cuda", dtype=DT)
        self.y = torch.empty(HID, device="cuda", dtype=DT)

    def __call__(self):
        x = self.x
        for w in WEIGHTS:
            self.launch("qkv", w["qkv"], x, self.qkv)
            self.launch("o", w["o"], self.qkv[:HID], self.o)
            self.launch("gate_up", w["gate_up"], self.o, self.h)
            self.launch("down", w["down"], self.h[:INTER], self.y)
            x = self.y


def torch_launch(m, w, x, out):
    out.copy_((w.float() @ x.float()).to(DT))


def today(configs):
    return lambda m, w, x, out: gemv(w, x, out, config=configs[m], pdl=PDL,
                                     workspace=WS)


def tma(per):
    return lambda m, w, x, out: prefetch_gemv(w, x, out, pdl=PDL, **per[m])


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


VARIANTS = {"today (step tiling)": today(TODAY), "today (chain tiling)": today(ALONE),
            **{name: tma(per) for name, per in prefetch_variants().items()}}
BASE = "today (step tiling)"
print(f"{torch.cuda.get_device_name()}, PDL {'on' if PDL else 'off'}, "
      f"{len(VARIANTS)} variants, {BYTES / 1e9:.2f} GB of weights a chain", flush=True)

# 1. checked
reference = Chain(torch_launch)
reference()
bad, chains, graphs = [], {}, {}
for name, launch in VARIANTS.items():
    try:
        errs = {}
        for m, (n, k) in SHAPES.items():  # each product alone, layer 0's matrix
            x, out = torch.randn(k, device="cuda").to(DT), torch.empty(n, device="cuda",
                                                                       dtype=DT)
            out.fill_(float("nan"))
            launch(m, WEIGHTS[0][m], x, out)
            errs[m] = rel_err(out, WEIGHTS[0][m].float() @ x.float())
        chain = Chain(launch)
        chain()
        errs["chain"] = rel_err(chain.y, reference.y)
        wrong = {m: e for m, e in errs.items() if not e <= (2e-2 if m == "chain"
                                                             else 1e-2)}
        if wrong:
            bad.append(f"{name}: WRONG, rel err " + ", ".join(
                f"{m} {e:.2g}" for m, e in wrong.items()))
            continue
        graphs[name], _ = capture_graph(chain)
        chains[name] = chain  # a graph replays into its chain's buffers: keep them
    except Exception as e:  # noqa: BLE001 - one line per failed variant
        bad.append(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}")
torch.cuda.synchronize()
log(f"{len(graphs)} variants checked and captured; failed or wrong: {len(bad)}")
for line in bad:
    print("  !", line)
if BASE not in graphs:
    sys.exit(1)


def replays(graph):
    def call():
        for _ in range(REPLAYS):
            graph.replay()
    return call


# 2. timed
rounds = interleaved_rounds({name: replays(g) for name, g in graphs.items()},
                            rounds=ROUNDS, warmup=2, per_call=REPLAYS)
log(f"{ROUNDS} rounds of {REPLAYS} replays a variant")
print(f"\n{4 * LAYERS} products, {LAYERS} layers: µs a chain, median (min-max, "
      "spread %); GB/s of weights; today/this (per-round low-high)")
for name in sorted(graphs, key=lambda n: rounds[n].median):
    t, c = rounds[name], rounds.compare(name, BASE)
    spread = 100 * (t.max - t.min) / t.median
    print(f"  {name:24s} {1e3 * t.median:7.1f} ({1e3 * t.min:.1f}-{1e3 * t.max:.1f}, "
          f"{spread:4.1f} %)  {BYTES / (1e6 * t.median):5.0f} GB/s  {c.ratio:.3f} "
          f"({c.low:.3f}-{c.high:.3f}){' separated' if c.separated else ''}")
log("done")
