"""Decode at scale: a Llama-3.2-1B-shaped model, what one decode step must move, and how
close a decode loop gets to moving it at the speed of memory.

- The workload: `llama_1b_config` (16 layers, hidden 2048, 32 query / 8 key-value heads, MLP
  8192, vocab 128256, tied embeddings: 1.24 B parameters, 2.47 GB in BF16), `reduced_config`
  (the same structure, small, for the CPU), and `build_on_device`.
- The cost of one decode step from first principles (`ModelShape`, `step_cost`,
  `decode_cost`): every weight read once, the KV cache read so far, the new keys and values
  written; and the model bandwidth utilisation, `mbu`.
- Ours: Chapter 3's `StaticDecoder`, with the attention kernel and compile options `OURS`
  (`scale_decoder`).
- Measured side by side (`measure_generation`): any generate function, stock `generate()` or
  ours, timed the same way, with its tokens, peak memory, and the error if it fails.
- The batch roofline: `batch_sweep`, `ridge_batch` (the batch at which a step's intensity
  reaches the ridge point), `turning_batch` (the batch at which measured throughput stops
  growing with the batch).
"""

from __future__ import annotations

import collections
import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gpuinfer import roofline as rl
from gpuinfer.llama import random_prompt
from gpuinfer.static_decode import StaticDecoder, capacity_for, step_timing
from gpuinfer.timing import Timing, benchmark

# ---------------------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------------------


def llama_1b_config(**overrides) -> LlamaConfig:
    """The shape of Llama-3.2-1B: 16 layers, hidden 2048, 32 query and 8 key-value heads of
    64, MLP 8192, vocab 128256, input and output embeddings tied. No weights are downloaded:
    only the shape matters for speed."""
    params = dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    )
    params.update(overrides)
    return LlamaConfig(**params)


def reduced_config(**overrides) -> LlamaConfig:
    """The same structure (grouped-query attention 4/2, tied embeddings), small enough for a
    CPU: 2 layers, hidden 64, MLP 256, vocab 512; 155,968 parameters.

    The weights are drawn with a larger standard deviation than the 1B model's 0.02 (0.113
    = 0.02 x sqrt(2048 / 64)), so that activations have the 1B model's magnitudes. With 0.02
    at this width the layers barely perturb the tied embedding of the input token, and greedy
    decoding repeats one token forever: no test of anything.
    """
    return llama_1b_config(**{
        "vocab_size": 512, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 1024, "initializer_range": 0.113, **overrides,
    })


def build_on_device(config: LlamaConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> LlamaForCausalLM:
    """A LlamaForCausalLM with seeded random weights, created directly on `device`.

    Creating the modules inside a `torch.device` context allocates and initialises every
    weight on the device: a second on a GPU, against a minute or more for 1.2 B parameters
    initialised by the CPU and then copied over.
    """
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype=dtype).eval()


# ---------------------------------------------------------------------------------------------
# What a decode step must move and compute
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama that set the cost of a decode step."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # the output projection (lm_head) is the input embedding matrix

    @classmethod
    def of(cls, config: LlamaConfig) -> ModelShape:
        head_dim = (getattr(config, "head_dim", None)
                    or config.hidden_size // config.num_attention_heads)
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, config.intermediate_size,
                   config.vocab_size, bool(config.tie_word_embeddings))

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's matrix products: q, k, v, o, and the MLP's gate, up, down."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return qkv + o + 3 * self.hidden * self.intermediate

    @property
    def matmul_params(self) -> int:
        """Weights that one token multiplies: every layer's, plus the output projection."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters, a tied embedding counted once (as `model.parameters()` counts)."""
        norms = self.layers * 2 * self.hidden + self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_matmul_params + norms + embeddings

    def weight_bytes(self, batch: int, itemsize: int) -> int:
        """Weight bytes one step reads. Untied, the input embedding is not read whole: only
        the batch's rows of it. Tied, the output projection reads the whole matrix anyway."""
        if self.tied:
            return self.params * itemsize
        return (self.params - self.vocab * self.hidden + batch * self.hidden) * itemsize

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """Bytes of keys and values that one token leaves in the cache, over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


def step_cost(shape: ModelShape, *, batch: int, context: float, itemsize: int) -> rl.Workload:
    """FLOPs and the fewest bytes of one decode step: `batch` sequences, each attending to
    `context` cached tokens (the new one included).

    FLOPs: a multiply and an add per weight per token (2 x matmul_params x batch), plus
    attention, q.k and p.v over the context: 4 x heads x head_dim x context per layer and
    token. The norms, rotary and activations (under 0.1%) are left out.
    Bytes: the weights once, the cached keys and values once, the new ones written once.
    Activations are left out: kilobytes per sequence, against megabytes of cache.
    """
    kv = shape.kv_bytes_per_token(itemsize)
    flops = batch * (2 * shape.matmul_params
                     + 4 * shape.layers * shape.heads * shape.head_dim * context)
    moved = shape.weight_bytes(batch, itemsize) + batch * context * kv + batch * kv
    return rl.Workload(f"decode step, batch {batch}", flops, moved)


def bytes_by_part(shape: ModelShape, *, batch: int, context: float,
                  itemsize: int) -> dict[str, float]:
    """The bytes of `step_cost`, part by part: they sum to its `bytes`."""
    # The output projection reads the whole matrix; untied, the input embedding adds its rows.
    embedding = shape.vocab * shape.hidden + (0 if shape.tied else batch * shape.hidden)
    kv = shape.kv_bytes_per_token(itemsize)
    mlp = 3 * shape.hidden * shape.intermediate
    return {
        "attention projections (q, k, v, o)":
            shape.layers * (shape.layer_matmul_params - mlp) * itemsize,
        "MLP (gate, up, down)": shape.layers * mlp * itemsize,
        "embedding / output projection": embedding * itemsize,
        "norms": (2 * shape.layers + 1) * shape.hidden * itemsize,
        "KV cache, read": batch * context * kv,
        "KV cache, written": batch * kv,
    }


def decode_cost(shape: ModelShape, *, batch: int, prompt_len: int, new_tokens: int,
                itemsize: int) -> rl.Workload:
    """The mean cost of the decode steps of a generation of `new_tokens` after `prompt_len`.

    The prefill produces the first new token; the next new_tokens - 1 come from decode steps,
    step k attending to prompt_len + k tokens. Cost is linear in the context, so the mean
    step is the step at the mean context, prompt_len + new_tokens / 2.
    """
    return step_cost(shape, batch=batch, context=prompt_len + new_tokens / 2, itemsize=itemsize)


def mbu(bytes_per_step: float, step_seconds: float, bandwidth: float) -> float:
    """Model bandwidth utilisation: the bytes a step must move, per second of step, as a
    fraction of the memory bandwidth. 1.0 is a step that runs at the speed of memory."""
    return bytes_per_step / step_seconds / bandwidth


# ---------------------------------------------------------------------------------------------
# Ours: Chapter 3's static decoder
# ---------------------------------------------------------------------------------------------

# At this size, in BF16, the fused attention kernel was faster on the H200 than transformers'
# eager attention (two matmuls and a softmax, Chapter 3's choice for its FP32 model), and
# Inductor's tuning made compilation several times longer for a few percent. Programmatic
# Dependent Launch is on, as in Chapter 3's fastest step: it costs no compile time.
OURS = {"attention": "sdpa", "tune": False, "pdl": True}


# Operators that allocate or relabel memory without launching a kernel.
_NO_KERNEL = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::lift_fresh",
              "aten::_unsafe_view"}


def count_ops(fn: Callable[[], object]) -> collections.Counter:
    """Run fn() once and count the ATen operators it dispatches, views excluded.

    Run eagerly, each counted operator is (about) one kernel launch: this is how many
    launches a step costs the host, and how many kernels a CUDA graph of it replays.
    Views (reshape, transpose, slicing) are metadata only and are not counted.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: collections.Counter = collections.Counter()

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.name()
            if not getattr(func, "is_view", False) and name.split(".")[0] not in _NO_KERNEL:
                counts[name] += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        fn()
    return counts


def scale_decoder(model: LlamaForCausalLM, batch: int, capacity: int) -> StaticDecoder:
    """Chapter 3's StaticDecoder with this chapter's options (`OURS`), its state ordinary
    tensors even under inference mode."""
    with torch.inference_mode(False), torch.no_grad():
        return StaticDecoder(model, batch, capacity, **OURS)


# ---------------------------------------------------------------------------------------------
# Generations measured side by side
# ---------------------------------------------------------------------------------------------

GenerateFn = Callable[[torch.Tensor, int], torch.Tensor]  # (prompt_ids, new_tokens) -> tokens


@torch.no_grad()
def generate_new_tokens(model: LlamaForCausalLM, prompt_ids: torch.Tensor, new_tokens: int,
                        **kwargs) -> torch.Tensor:
    """Stock `model.generate`, greedy, EOS ignored; the new tokens as an int64 CPU tensor."""
    out = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids),
                         max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                         pad_token_id=0, **kwargs)
    new = out[:, prompt_ids.shape[1]:]
    if new.shape[1] != new_tokens:
        raise RuntimeError(f"generate() stopped after {new.shape[1]} of {new_tokens} tokens")
    return new.cpu()


def forget_compiled(model: LlamaForCausalLM) -> None:
    """Drop what torch.compile and generate() cached for `model` (compiled code, CUDA-graph
    pools, generate's compiled forward), so the next variant starts clean."""
    for name in ("_compiled_call", "_last_compile_config"):
        if name in vars(model):
            delattr(model, name)
    torch._dynamo.reset()


@contextlib.contextmanager
def docs_compiled_forward(model: LlamaForCausalLM, *, recompile_limit: int = 4):
    """The recipe of the transformers docs ("Optimizing inference"), for the duration:
    `model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)`,
    used with `cache_implementation="static"`.

    One bound is added: a function that recompiles more than `recompile_limit` times raises
    (by default dynamo would silently fall back to running it uncompiled after 8), so that a
    recipe that keeps recompiling is reported as such, and cannot eat the chapter's budget.
    """
    forget_compiled(model)
    limits = {"recompile_limit": recompile_limit, "fail_on_recompile_limit_hit": True}
    limits = {k: v for k, v in limits.items() if hasattr(torch._dynamo.config, k)}
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    try:
        with torch._dynamo.config.patch(**limits):
            yield
    finally:
        del model.forward  # the instance attribute: the class's forward is back
        forget_compiled(model)


def describe_error(err: BaseException) -> str:
    """`Type: first line of the message`, short enough for a table cell."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    first = first.replace("`", "'").replace("|", "/")
    return f"{type(err).__name__}: {first[:240]}"


@dataclass
class Measured:
    """One way of generating, measured: its tokens and timings, or the error that stopped it."""

    name: str
    new_tokens: int
    tokens: torch.Tensor | None = None  # (batch, new_tokens), int64 on the CPU
    total: Timing | None = None  # one whole generation of new_tokens
    first: Timing | None = None  # a generation of one token: prefill + first token
    peak_bytes: int | None = None  # peak GPU memory allocated during a generation
    first_call_s: float | None = None  # the warm-up generation: compile, capture, allocation
    first_call_tokens: int | None = None  # how many tokens that warm-up generated
    error: str | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.total is not None

    @property
    def ms_per_token(self) -> float:
        """Decode time per token: the whole generation minus the first token, per step."""
        return (self.total.median - self.first.median) / (self.new_tokens - 1)

    @property
    def ttft_ms(self) -> float:
        """Time to first token: the prompt's prefill and the first token, host read included."""
        return self.first.median


def measure_generation(name: str, generate: GenerateFn, prompt_ids: torch.Tensor,
                       new_tokens: int, *, repeats: int = 3, first_repeats: int = 5,
                       warmup_tokens: int | None = None,
                       context: Callable[[], contextlib.AbstractContextManager]
                       = contextlib.nullcontext) -> Measured:
    """Time `generate(prompt_ids, n)` for n = new_tokens and n = 1, the same for every variant.

    A warm-up generation (`warmup_tokens`, default new_tokens; it compiles, captures or
    allocates what the variant needs) comes first; then `repeats` whole generations (their
    peak GPU memory is recorded: weights, caches and workspaces that are live at the time),
    then `first_repeats` one-token generations for the time to first token. The tokens are
    those of the last whole generation. Any exception, at any stage, is caught and kept as
    the variant's `error`: a variant that fails is reported, not hidden.
    """
    result = Measured(name, new_tokens)
    last: list[torch.Tensor] = []

    def whole():
        last[:] = [generate(prompt_ids, new_tokens)]

    try:
        with context():
            _sync()
            start = time.perf_counter()
            generate(prompt_ids, warmup_tokens or new_tokens)
            _sync()
            result.first_call_s = time.perf_counter() - start
            result.first_call_tokens = warmup_tokens or new_tokens
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            result.total = benchmark(whole, warmup=0, repeats=repeats)
            if torch.cuda.is_available():
                result.peak_bytes = torch.cuda.max_memory_allocated()
            result.tokens = last[0]
            result.first = benchmark(lambda: generate(prompt_ids, 1), warmup=1,
                                     repeats=first_repeats)
    except Exception as err:  # noqa: BLE001 - reported in the chapter, not swallowed
        result.error = describe_error(err)
    return result


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def agreement(tokens: torch.Tensor, reference: torch.Tensor) -> tuple[float, int]:
    """(fraction of positions equal, number of leading positions equal in every row), over
    the positions both have. Greedy sequences that differ once usually differ from then on,
    so the leading run is the telling number."""
    n = min(tokens.shape[1], reference.shape[1])
    same = tokens[:, :n] == reference[:, :n]
    leading = int(same.all(dim=0).long().cumprod(0).sum()) if n else 0
    return float(same.float().mean()) if n else 1.0, leading


# ---------------------------------------------------------------------------------------------
# The batch roofline
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchPoint:
    """One decode step at one batch size, timed, with its first-principles cost."""

    batch: int
    step: Timing
    cost: rl.Workload

    @property
    def step_ms(self) -> float:
        return self.step.median

    @property
    def tokens_per_s(self) -> float:
        return self.batch / (self.step.median / 1e3)

    @property
    def flops_per_s(self) -> float:
        return self.cost.flops / (self.step.median / 1e3)

    @property
    def bytes_per_s(self) -> float:
        return self.cost.bytes / (self.step.median / 1e3)


def batch_sweep(model: LlamaForCausalLM, batches: list[int], *, prompt_len: int, how: str,
                warmup: int = 3, repeats: int = 20, seed: int = 1) -> tuple[list[BatchPoint], str]:
    """Time one decode step of `model` at every batch size, run `how` (a StaticDecoder way).

    Each batch gets its own decoder with a cache of just the slots the timed steps need, a
    prefill of a seeded random prompt, `warmup` untimed steps and `repeats` timed ones (each
    step advances the position, so the context grows by one per step: the cost is taken at
    the mean context of the timed steps). Stops at the first batch that does not fit in
    memory; returns the points and a note saying where it stopped, if it did.
    """
    shape, itemsize = ModelShape.of(model.config), model.lm_head.weight.element_size()
    dev = model.lm_head.weight.device
    capacity = capacity_for(prompt_len, warmup + repeats + 1)
    context = timed_context(prompt_len, warmup, repeats)
    points, note = [], ""
    for batch in batches:
        decoder = None
        try:
            decoder = scale_decoder(model, batch, capacity)
            prompt = random_prompt(model.config, prompt_len, batch=batch, seed=seed, device=dev)
            timing = step_timing(decoder, prompt, how, warmup=warmup, repeats=repeats)
        except torch.cuda.OutOfMemoryError:
            note = f"batch {batch} does not fit in memory: the sweep stops there"
            break
        finally:
            del decoder
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        points.append(BatchPoint(batch, timing,
                                 step_cost(shape, batch=batch, context=context, itemsize=itemsize)))
    return points, note


def timed_context(prompt_len: int, warmup: int, repeats: int) -> float:
    """The mean context of the timed steps of `batch_sweep`: after the prefill, step i reads
    the token in slot prompt_len + i and attends to prompt_len + i + 1 slots."""
    return prompt_len + warmup + (repeats + 1) / 2


def ridge_batch(shape: ModelShape, *, context: float, itemsize: int, ridge: float,
                limit: int = 1 << 20) -> int | None:
    """The smallest batch whose decode step has intensity >= `ridge` (FLOP/byte), or None.

    A step's intensity grows with the batch (the weights are shared) but saturates, because
    every sequence brings its own KV cache: it tends to (FLOPs per sequence) / (cache bytes
    per sequence). If that limit is below the ridge, no batch makes the step compute-bound.
    """
    def intensity(batch: int) -> float:
        return step_cost(shape, batch=batch, context=context, itemsize=itemsize).intensity

    if intensity(limit) < ridge:
        return None
    lo, hi = 1, limit  # intensity rises with the batch: bisect for the first batch past ridge
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if intensity(mid) < ridge else (lo, mid)
    return lo


def turning_batch(batches: list[int], step_seconds: list[float], *,
                  free: float = 0.5) -> int | None:
    """The first batch at which most of the added sequences no longer come for free.

    Memory-bound, a step costs the same whatever the batch, so doubling the batch doubles
    the tokens per second; compute-bound, the step time grows with the batch and tokens per
    second stay flat. Between two batch sizes, the fraction of added sequences that came for
    free is (throughput gain - 1) / (batch ratio - 1): 1 while memory-bound, 0 once
    compute-bound. This returns the first batch where it falls below `free` (for a doubling,
    the default 0.5 means "doubling the batch bought less than 1.5x the tokens per second"),
    or None if it never does. Apply it to measured and to predicted step times alike.
    """
    for (b0, t0), (b1, t1) in zip(zip(batches, step_seconds), zip(batches[1:], step_seconds[1:])):
        gain = (b1 / t1) / (b0 / t0)
        if (gain - 1) / (b1 / b0 - 1) < free:
            return b1
    return None


def roofline_seconds(cost: rl.Workload, *, peak: float, bandwidth: float) -> float:
    """The roofline's floor for a step: the longer of moving its bytes and doing its FLOPs."""
    return max(cost.bytes / bandwidth, cost.flops / peak)
