"""No kernel call, however it is made, reads or writes outside its buffers.

The decoder refuses a step past its capacity and token ids outside the vocabulary on
the host, but a CUDA graph's replay is unchecked: the kernels themselves keep every
access inside. Each kernel here gets its cache, tokens, rotary tables and embedding as
views in the middle of a larger buffer whose margins hold a guard value, and is called
at pos = capacity - 1, capacity, capacity + 5 and a negative pos, and with token ids
vocab and -1:

- a write outside a view changes its margins (the buffer is compared bit for bit);
- a read outside one reads the guard, NaN for floating-point buffers and, for the
  tokens, the id `vocab`, whose embedding row is NaN too: the kernel's output is then
  NaN, where it must be finite.

Then the whole Triton step of a reduced Llama on such buffers at pos = capacity - 1 and
past it, interpreted on a CPU, compiled and replayed from a CUDA graph on a GPU.
"""


import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.kernels import attention as at  # noqa: E402
from gpuinfer.kernels import embed_head as eh  # noqa: E402
from gpuinfer.kernels import qkv_rope as rotary  # noqa: E402
from gpuinfer.kernels.gemv import GemvConfig  # noqa: E402
from gpuinfer.model.configs import build_model, model_config  # noqa: E402

from kernel_checks import DEVICE, quiet_numpy, randn, rel_err  # noqa: E402,F401
CAPACITY = 12
PAST = (CAPACITY, CAPACITY + 5, -3)  # positions outside the cache (and the tokens)


class Guarded:
    """A tensor of `shape` holding `values`, a view `margin` elements in from both ends of
    a buffer whose other elements hold `guard`."""

    def __init__(self, values: torch.Tensor, guard, margin: int):
        self.margin, self.n = margin, values.numel()
        self.buffer = torch.full((self.n + 2 * margin,), guard, dtype=values.dtype,
                                 device=DEVICE)
        self.view = self.buffer[margin: margin + self.n].view(values.shape)
        self.view.copy_(values)
        self.snapshot()

    def snapshot(self) -> None:
        self.before = self.buffer.clone()

    def expected(self) -> torch.Tensor:
        """The buffer as it was at the snapshot, as a view shaped like `view`, to edit."""
        return self.before[self.margin: self.margin + self.n].view(self.view.shape)

    def assert_unchanged(self, what: str) -> None:
        """Every element, margins included, as at the snapshot (or as `expected()`
        was edited since), bit for bit (NaN equals NaN)."""
        torch.testing.assert_close(self.buffer, self.before, rtol=0, atol=0,
                                   equal_nan=True, msg=lambda m: f"{what}: {m}")


def one(pos: int) -> torch.Tensor:
    return torch.tensor([pos], device=DEVICE)


# --- q/k/v with rotary: the cache write at slot pos, the rotary tables' row pos ---------

HEADS, KV, D, K = 4, 2, 16, 64


def rotary_tables(capacity):
    inv = 1.0 / 500000.0 ** (torch.arange(0, D, 2, device=DEVICE) / D)
    angles = torch.arange(capacity, device=DEVICE)[:, None] * inv[None]
    emb = torch.cat([angles, angles], -1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("config", [GemvConfig(8, 32), GemvConfig(8, 32, split_k=2)],
                         ids=["one-split", "split-k"])
@pytest.mark.parametrize("pos", [CAPACITY - 1, *PAST])
def test_qkv_rope_writes_only_slot_pos_of_the_cache(pos, config):
    torch.manual_seed(pos + 10)
    w, x, norm = randn((HEADS + 2 * KV) * D, K), randn(K), randn(K, scale=0.1) + 1
    margin = 8 * D  # 8 slots: a write at capacity + 5 lands in it
    k_cache = Guarded(randn(KV, CAPACITY, D), float("nan"), margin)
    v_cache = Guarded(randn(KV, CAPACITY, D), float("nan"), margin)
    cos, sin = (Guarded(t, float("nan"), margin) for t in rotary_tables(CAPACITY))
    q = torch.full((HEADS * D,), float("nan"), device=DEVICE)
    rotary.qkv_rope(w, x, q, k_cache.view, v_cache.view, cos.view, sin.view, one(pos),
                    n_heads=HEADS, norm=norm, config=config)
    assert q.isfinite().all(), "q read outside the rotary tables"
    if 0 <= pos < CAPACITY:  # the last slot: written, and right
        ref_q, ref_k, ref_v = rotary.qkv_rope_reference(w, x, cos.view, sin.view, pos,
                                                        n_heads=HEADS, n_kv=KV, norm=norm)
        assert rel_err(q, ref_q) <= 1e-5
        assert rel_err(k_cache.view[:, pos], ref_k) <= 1e-5
        assert rel_err(v_cache.view[:, pos], ref_v) <= 1e-5
        k_cache.expected()[:, pos] = k_cache.view[:, pos]
        v_cache.expected()[:, pos] = v_cache.view[:, pos]
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("cos", cos),
                    ("sin", sin)):
        t.assert_unchanged(f"{name} at pos {pos}")


def test_qkv_rope_refuses_rotary_tables_shorter_than_the_cache():
    cos, sin = rotary_tables(CAPACITY - 1)
    cache = torch.zeros(KV, CAPACITY, D, device=DEVICE)
    with pytest.raises(ValueError, match=f"rotary tables of {CAPACITY - 1} rows for a "
                                         f"cache of {CAPACITY} slots"):
        rotary.qkv_rope(randn((HEADS + 2 * KV) * D, K), randn(K),
                        torch.zeros(HEADS * D, device=DEVICE), cache, cache, cos, sin,
                        one(0), n_heads=HEADS)


# --- attention: slots 0..pos of the cache -----------------------------------------------

ATTENTION_CAPACITY = 40  # three 16-slot tiles, the last one short


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "combine-kernel"])
@pytest.mark.parametrize("pos", [ATTENTION_CAPACITY - 1, ATTENTION_CAPACITY,
                                 ATTENTION_CAPACITY + 5, -3])
def test_attention_reads_no_slot_past_the_cache(pos, inline):
    """Past the cache, the attention sees all of it (pos clamped to the last slot); at a
    negative pos, slot 0."""
    torch.manual_seed(pos + 20)
    cap = ATTENTION_CAPACITY
    q = randn(HEADS * D)
    margin = 8 * D
    k_cache = Guarded(randn(KV, cap, D), float("nan"), margin)
    v_cache = Guarded(randn(KV, cap, D), float("nan"), margin)
    ws = at.AttentionWorkspace(DEVICE, KV, HEADS // KV, D, 4)
    out = torch.full((HEADS * D,), float("nan"), device=DEVICE)
    at.decode_attention(q, k_cache.view, v_cache.view, one(pos), out, n_split=4,
                        block_s=16, inline_combine=inline, workspace=ws)
    assert out.isfinite().all(), "a slot outside the cache was read (or none written)"
    seen = min(max(pos, 0), cap - 1)
    ref = at.decode_attention_reference(q, k_cache.view, v_cache.view, seen)
    assert rel_err(out, ref) <= 1e-5
    assert torch.all(ws.counters == 0)  # every head's programs arrived, and reset
    k_cache.assert_unchanged("k_cache")
    v_cache.assert_unchanged("v_cache")


# --- the step's two ends: embed reads tokens[pos], lm_head writes tokens[pos + 1] ---

VOCAB, HIDDEN = 50, 64


def embedding_and_tokens():
    """The embedding (its margins: a NaN row before and two after) and the tokens (their
    margins: the id VOCAB, one past the embedding, whose row is NaN)."""
    table = Guarded(randn(VOCAB, HIDDEN), float("nan"), 2 * HIDDEN)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (CAPACITY,), generator=gen).to(DEVICE)
    return table, Guarded(ids, VOCAB, 8)


@pytest.mark.parametrize("pos", [CAPACITY - 1, *PAST])
def test_embed_reads_no_token_past_the_tokens(pos):
    table, tokens = embedding_and_tokens()
    x = torch.full((HIDDEN,), float("nan"), device=DEVICE)
    eh.embed(table.view, tokens.view, one(pos), x, block=32)
    assert x.isfinite().all(), f"pos {pos}: read outside the tokens or the embedding"
    if pos == CAPACITY - 1:
        assert torch.equal(x, table.view[tokens.view[pos]])
    table.assert_unchanged("embedding")
    tokens.assert_unchanged("tokens")


@pytest.mark.parametrize("token", [VOCAB, -1])
def test_embed_reads_no_row_outside_the_embedding(token):
    """An id outside the vocabulary reads some row of the embedding (which one does not
    matter: the decoder refuses such ids before a step)."""
    table, tokens = embedding_and_tokens()
    tokens.view[4] = token
    tokens.snapshot()
    x = torch.full((HIDDEN,), float("nan"), device=DEVICE)
    eh.embed(table.view, tokens.view, one(4), x, block=32)
    assert x.isfinite().all(), f"id {token}: read outside the embedding"
    table.assert_unchanged("embedding")


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "reduce-kernel"])
@pytest.mark.parametrize("pos", [CAPACITY - 2, CAPACITY - 1, *PAST])
def test_lm_head_argmax_writes_no_token_past_the_tokens(pos, inline):
    """tokens[pos + 1] only while it is a slot of the tokens; pos advances regardless."""
    torch.manual_seed(pos + 30)
    w, x = randn(VOCAB, HIDDEN), randn(HIDDEN)
    tokens = Guarded(torch.zeros(CAPACITY, dtype=torch.long, device=DEVICE), -7, 8)
    p = one(pos)
    logits = torch.full((VOCAB,), float("nan"), device=DEVICE)
    eh.lm_head_argmax(w, x, logits, tokens.view, p, config=GemvConfig(16, 32),
                      inline=inline)
    assert int(p) == pos + 1
    if 0 <= pos + 1 < CAPACITY:
        tokens.expected()[pos + 1] = int((w @ x).argmax())
    tokens.assert_unchanged(f"tokens after a step at pos {pos}")


# --- the whole step -------------------------------------------------------------------


def guarded_decoder(capacity: int):
    """A TritonDecoder of the reduced Llama (FP32), prefilled with capacity - 1 tokens
    (pos = capacity - 1, the last slot), its cache, tokens, embedding and rotary tables
    then moved into guarded buffers (the step reads them from the decoder's attributes);
    the model, the decoder, its unchecked step, the guarded buffers by name."""
    model = build_model(model_config("reduced"), seed=0, device=DEVICE)
    decoder = TritonDecoder(model, capacity=capacity)
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, model.config.vocab_size, (1, capacity - 1), generator=gen)
    decoder.prefill(prompt.to(DEVICE))
    slot = decoder.head_dim * decoder.n_kv
    guards = {"k_cache": Guarded(decoder.k_cache, float("nan"), 8 * slot),
              "v_cache": Guarded(decoder.v_cache, float("nan"), 8 * slot),
              "tokens": Guarded(decoder.tokens, model.config.vocab_size, 8),
              "embed": Guarded(decoder.embed, float("nan"), 2 * decoder.embed.shape[1]),
              "cos": Guarded(decoder.cos, float("nan"), 8 * decoder.head_dim),
              "sin": Guarded(decoder.sin, float("nan"), 8 * decoder.head_dim)}
    for name, guarded in guards.items():
        setattr(decoder, name, guarded.view)
    # the unchecked step a graph replays (decode_step, where the decoder has no other)
    step = getattr(decoder, "device_step", decoder.decode_step)
    return model, decoder, step, guards


def step_past_the_cache(model, decoder, step, guards):
    """At pos = capacity - 1: slot capacity - 1 of the cache written, the model's logits,
    no token written. Then at capacity, capacity + 1 and capacity + 5: nothing written
    anywhere, the logits finite (nothing read outside). Synchronizes on a GPU."""
    capacity = decoder.capacity
    with torch.no_grad():
        ref = model(input_ids=decoder.tokens[:, :capacity]).logits[0, -1]
    step()
    assert int(decoder.pos) == capacity
    assert rel_err(decoder.logits, ref) <= 1e-4
    for name in ("k_cache", "v_cache"):
        guards[name].expected()[:, :, capacity - 1] = getattr(decoder, name)[:, :,
                                                                             capacity - 1]
    for name, guarded in guards.items():
        guarded.assert_unchanged(f"{name} after the step at the last slot")
        guarded.snapshot()
    for pos in (capacity, capacity + 5):
        decoder.pos.fill_(pos)
        for _ in range(2 if pos == capacity else 1):
            decoder.logits.fill_(float("nan"))
            step()
            assert decoder.logits.isfinite().all(), "a read outside a buffer"
        assert int(decoder.pos) == pos + (2 if pos == capacity else 1)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    for name, guarded in guards.items():
        guarded.assert_unchanged(f"{name} after steps past the cache")


def test_a_step_past_the_cache_writes_nothing_outside():
    step_past_the_cache(*guarded_decoder(capacity=8))


@pytest.mark.gpu
def test_compiled_steps_and_replays_past_the_cache_write_nothing_outside():
    """The same with the compiled kernels, then replayed from a CUDA graph whose every
    run is past the cache; then a fresh decoder still decodes (the CUDA context is
    intact: no illegal address)."""
    from gpuinfer.decode.loops import decode_naive
    from gpuinfer.measure.timing import capture_graph

    model, decoder, step, guards = guarded_decoder(capacity=16)
    step_past_the_cache(model, decoder, step, guards)
    decoder.pos.fill_(decoder.capacity)
    graph, _ = capture_graph(step, warmup=2)  # the warm-up runs past the cache too
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert int(decoder.pos) == decoder.capacity + 5
    for name, guarded in guards.items():
        guarded.assert_unchanged(f"{name} after replays past the cache")
    prompt = torch.arange(5, device=DEVICE)[None] * 7
    fresh = TritonDecoder(model, capacity=32)
    assert torch.equal(fresh.generate(prompt, 8), decode_naive(model, prompt, 8))
