"""Probe (issue 58, item 2a): the fused q/k/v + rotary + attention kernel
(`kernels.attention_block`) against the chain it replaces (`qkv_rope` then
`decode_attention`, one program per key/value head), at the 1B shape (hidden 2048, 32/8
heads of 64, intermediate 8192, 16 layers) with a cache of 256 slots, BF16, PDL on as
the step uses it (Hopper).

1. Checked: one layer, eager, at slots 0, 131 and 255: each fused variant against the
   chain (q, the cache slot, the attention output).
2. Timed in interleaved rounds (CUDA events, each call 20 graph replays): graphs of
   (a) one layer's attention block (its 12.6 MB of weights stay in L2: a floor),
   (b) 16 layers' attention blocks (qkv, attention; weights of their own per layer),
   (c) 16 whole layers (+ o, gate/up, down: the step without embedding and lm_head),
   for the chain and each fused variant; median and min-max a replay, and per layer
   ((c) copies x before each replay, 4 KB, in every variant alike).
3. Raced: each fused variant's 16-layer graphs (b) and (c) replayed many times, x
   cycling through 5 inputs (so a stale q or cache slot from the replay before would
   differ) at slots 0, 131, 255, every replay's outputs (every layer's attention
   output, the residual) compared bit for bit with that input's own result.

Usage on the GPU: PYTHONPATH=code python scripts/probes/attention_block.py [ROUNDS]
(under 3 minutes on an H200)."""

import sys
import time

import torch

from gpuinfer.kernels.attention import AttentionWorkspace, decode_attention
from gpuinfer.kernels.attention_block import qkv_rope_attention
from gpuinfer.kernels.common import Workspace, pdl_supported
from gpuinfer.kernels.gemv import GemvConfig as C
from gpuinfer.kernels.gemv import gemv, gemv_silu
from gpuinfer.kernels.qkv_rope import qkv_rope
from gpuinfer.kernels.tiling import default_attention, default_configs
from gpuinfer.measure.rounds import interleaved_rounds
from gpuinfer.measure.timing import capture_graph

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 21
H, KV, D, HID, INTER, LAYERS, CAP = 32, 8, 64, 2048, 8192, 16, 256
REPLAYS, STRESS, INPUTS, SLOTS, TIMED_SLOT = 20, 600, 5, (0, 131, 255), 192
DT = torch.bfloat16
PDL = pdl_supported("cuda")
CFG = default_configs(gpu=True)  # the step's tiling
ATTN = default_attention(gpu=True, capacity=CAP)  # one program a head, 8 warps
FUSED = {  # the producers' tiling and warps (one count for both kinds), the slot tile
    "fused 4x1024 w4 s256": dict(config=C(4, 1024, 1, 4), block_s=256),
    "fused 4x1024 w4 s128": dict(config=C(4, 1024, 1, 4), block_s=128),
    "fused 4x1024 w4 s64": dict(config=C(4, 1024, 1, 4), block_s=64),
    "fused 8x1024 w8 s256": dict(config=C(8, 1024, 1, 8), block_s=256),
    "fused 4x1024 w4 s64 interleaved": dict(config=C(4, 1024, 1, 4), block_s=64,
                                            interleave=True),
}
t0 = time.perf_counter()
torch.manual_seed(0)


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(DT)


inv = 1.0 / 500000.0 ** (torch.arange(0, D, 2, device="cuda") / D)
emb = torch.arange(CAP, device="cuda")[:, None] * inv[None]
emb = torch.cat([emb, emb], -1)
COS, SIN = emb.cos().to(DT), emb.sin().to(DT)
WEIGHTS = [dict(qkv=rnd((H + 2 * KV) * D, HID, scale=0.02), o=rnd(HID, H * D, scale=0.02),
                gate_up=rnd(2 * INTER, HID, scale=0.02), down=rnd(HID, INTER, scale=0.02),
                norm=rnd(HID, scale=0.1) + 1, ffn_norm=rnd(HID, scale=0.1) + 1)
           for _ in range(LAYERS)]
CACHE = [(rnd(KV, CAP, D), rnd(KV, CAP, D)) for _ in range(LAYERS)]
XS = [rnd(HID) for _ in range(INPUTS)]
pos = torch.tensor([TIMED_SLOT], device="cuda")


class Run:
    """One variant's buffers (its own caches, a copy of the filled ones) and a function
    that launches `layers` layers, `full` with o, gate/up and down."""

    def __init__(self, fused: dict | None, layers: int, full: bool):
        self.fused, self.layers, self.full = fused, layers, full
        self.caches = [(k.clone(), v.clone()) for k, v in CACHE[:layers]]
        self.x = XS[0].clone()
        self.q = torch.empty(H * D, device="cuda", dtype=DT)
        self.outs = torch.zeros(layers, H * D, device="cuda", dtype=DT)
        self.h = torch.empty(INTER, device="cuda", dtype=DT)
        self.ws = Workspace("cuda", 1 << 16, 4096)
        self.counters = Workspace("cuda", 1, KV)
        self.aws = AttentionWorkspace("cuda", KV, H // KV, D, ATTN["n_split"])

    def __call__(self):
        for i in range(self.layers):
            w, (k, v), out = WEIGHTS[i], self.caches[i], self.outs[i]
            if self.fused is None:
                qkv_rope(w["qkv"], self.x, self.q, k, v, COS, SIN, pos, n_heads=H,
                         norm=w["norm"], config=CFG["qkv"], pdl=PDL, workspace=self.ws)
                decode_attention(self.q, k, v, pos, out, pdl=PDL, workspace=self.aws,
                                 **ATTN)
            else:
                qkv_rope_attention(w["qkv"], self.x, self.q, k, v, COS, SIN, pos, out,
                                   n_heads=H, norm=w["norm"], pdl=PDL,
                                   workspace=self.counters, **self.fused)
            if self.full:
                gemv(w["o"], out, self.x, residual=self.x, config=CFG["o"], pdl=PDL,
                     workspace=self.ws)
                gemv_silu(w["gate_up"], self.x, self.h, norm=w["ffn_norm"],
                          config=CFG["gate_up"], pdl=PDL, workspace=self.ws)
                gemv(w["down"], self.h, self.x, residual=self.x, config=CFG["down"],
                     pdl=PDL, workspace=self.ws)

    def results(self):
        return torch.cat([self.outs.flatten(), self.x])


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


print(f"{torch.cuda.get_device_name()}, PDL {'on' if PDL else 'off'}; chain: qkv "
      f"{CFG['qkv']}, attention {ATTN}", flush=True)

# 1. checked, one layer, eager, each slot
for slot in SLOTS:
    pos.fill_(slot)
    chain1 = Run(None, 1, False)  # fresh caches, as each fused run's
    chain1()
    ref_q, ref_out = chain1.q.clone(), chain1.outs[0].clone()
    ref_k = chain1.caches[0][0][:, slot].clone()
    for name, kw in FUSED.items():
        f = Run(kw, 1, False)
        f()
        torch.cuda.synchronize()
        k_same = torch.equal(f.caches[0][0][:, slot], ref_k)
        print(f"slot {slot:3d} {name:34s} q {rel_err(f.q, ref_q):.1e} "
              f"out {rel_err(f.outs[0], ref_out):.1e} k slot equal {k_same} "
              f"counters {f.counters.counters.tolist()}", flush=True)
print(f"checked ({time.perf_counter() - t0:.0f} s)", flush=True)

# 2. timed
pos.fill_(TIMED_SLOT)
KINDS = {"1 layer": (1, False), "16 attention blocks": (LAYERS, False),
         "16 layers": (LAYERS, True)}
runs, graphs = {}, {}
for kind, (layers, full) in KINDS.items():
    for name, kw in {"chain": None, **FUSED}.items():
        run = Run(kw, layers, full)
        graphs[kind, name], _ = capture_graph(run)
        runs[kind, name] = run
print(f"captured {len(graphs)} graphs ({time.perf_counter() - t0:.0f} s)", flush=True)


def replays(graph, run):
    def call():  # whole layers change x in place: each replay starts from the same x
        for _ in range(REPLAYS):
            if run.full:
                run.x.copy_(XS[0])
            graph.replay()
    return call


rounds = interleaved_rounds({key: replays(g, runs[key]) for key, g in graphs.items()},
                            rounds=ROUNDS, warmup=2, per_call=REPLAYS)
for kind, (layers, _) in KINDS.items():
    print(f"{kind} (slot {TIMED_SLOT}, {ROUNDS} rounds; us a replay, per layer):")
    for name in ["chain", *FUSED]:
        t = rounds[kind, name]
        c = rounds.compare((kind, name), (kind, "chain"))
        print(f"  {name:34s} {1e3 * t.median:8.1f} ({1e3 * t.min:.1f}-{1e3 * t.max:.1f})"
              f"  {1e3 * t.median / layers:6.2f} a layer  chain/this {c.ratio:.3f} "
              f"({c.low:.3f}-{c.high:.3f}){' separated' if c.separated else ''}")
print(f"timed ({time.perf_counter() - t0:.0f} s)", flush=True)

# 3. raced: every replay's outputs against the input's own result
for kind in ("16 attention blocks", "16 layers"):
    chain_run, chain_graph = runs[kind, "chain"], graphs[kind, "chain"]
    for name in FUSED:
        run, graph = runs[kind, name], graphs[kind, name]
        bad = torch.zeros((), device="cuda", dtype=torch.int64)
        worst = 0.0
        for slot in SLOTS:
            pos.fill_(slot)
            own = []
            for x in XS:  # twice: the second finds q and the slot as it writes them
                for _ in range(2):
                    run.x.copy_(x)
                    graph.replay()
                own.append(run.results().clone())
                chain_run.x.copy_(x)
                chain_graph.replay()
                worst = max(worst, rel_err(own[-1], chain_run.results()))
            for r in range(STRESS):
                i = r % INPUTS
                run.x.copy_(XS[i])
                graph.replay()
                bad += (run.results() != own[i]).any()
        torch.cuda.synchronize()
        print(f"{kind}, {name}: {int(bad)} of {STRESS * len(SLOTS)} replays differ "
              f"from their input's result; against the chain at most {worst:.1e}",
              flush=True)
print(f"done ({time.perf_counter() - t0:.0f} s)")
