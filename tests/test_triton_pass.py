"""`MmaPassDecoder` (decode.triton_pass, issue 57): Chapter 5's step unchanged, its
passes on the tensor-core products. A pass's logits against its steps' (FP32 within
1e-4 relative, BF16 the same top-1 and within BF16's rounding, int8 weights in FP32),
with the rule's tiling and with split-K in every product; speculative decoding with
the MMA-pass target giving the target alone's tokens in FP32; misuse refused, and the
state left as it was after a refusal.

The MMA sums in its own order: within tolerance of the steps, not to the bit. Without
a GPU the kernels run under Triton's interpreter (a pass here takes about a second).
"""

import importlib

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.decode import speculative as sp  # noqa: E402
from gpuinfer.decode import triton_pass as tp  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.kernels import common  # noqa: E402
from gpuinfer.kernels import pass_mma as pm  # noqa: E402
from gpuinfer.kernels import pass_mma_heads as ph  # noqa: E402
from gpuinfer.kernels.gemv import GemvConfig  # noqa: E402
from gpuinfer.model.configs import (build_model, model_config,  # noqa: E402
                                    random_prompt)
from gpuinfer.model.llama import INT8  # noqa: E402

if common.INTERPRETED:  # not in interpret.MODULES: decorated again, in import order
    pm = importlib.reload(pm)
    ph = importlib.reload(ph)
    tp = importlib.reload(tp)

from kernel_checks import DEVICE, quiet_numpy  # noqa: E402,F401
C = pm.MmaConfig
NEW = 12  # interpreted kernels are slow: short generations
# Split-K in every product (down: three splits, the last short), and the lm_head in
# blocks of 16 rows, so that a pass's partials and block maxima outgrow the step's.
SPLIT = {"qkv": C(8, 32, split_k=2), "o": C(16, 32, split_k=2),
         "gate_up": C(8, 32, split_k=2), "down": C(16, 64, split_k=3),
         "lm_head": C(16, 64)}


def config():
    # grouped-query heads (4 / 2), K = 172 not a multiple of any block
    return model_config("toy", vocab_size=128, initializer_range=0.2,
                        intermediate_size=172, num_attention_heads=4,
                        num_key_value_heads=2)


@pytest.fixture(scope="module")
def model():
    return build_model(config(), seed=0, device=DEVICE)


@pytest.fixture(scope="module")
def prompt():
    return random_prompt(config(), 8, device=DEVICE)


def ids_of(length, seed=3):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, config().vocab_size, (1, length), generator=gen).to(DEVICE)


def steps_and_pass(decoder, prompt, ids):
    """The logits after each of `ids` from one-token steps and from one pass, (T, V)."""
    with torch.no_grad():
        decoder.prefill(prompt)
        steps = torch.cat([decoder.step_logits(ids[:, i: i + 1])
                           for i in range(ids.shape[1])])
        decoder.prefill(prompt)
        return steps.float(), decoder.pass_logits(ids)[0].float()


def state(decoder):
    return (int(decoder.pos), decoder.host_pos, decoder.tokens.clone(),
            decoder.k_cache.clone(), decoder.v_cache.clone())


def same_state(a, b) -> bool:
    return a[:2] == b[:2] and all(torch.equal(x, y) for x, y in zip(a[2:], b[2:]))


@pytest.mark.parametrize("tiling", [None, SPLIT], ids=["rule", "split-k"])
def test_fp32_pass_logits_are_the_steps_within_1e4(model, prompt, tiling):
    decoder = tp.MmaPassDecoder(model, capacity=64, max_query=5, pass_tiling=tiling)
    for t in (2, 3, 5):
        steps, passed = steps_and_pass(decoder, prompt, ids_of(t, seed=t))
        assert (steps - passed).abs().max() <= 1e-4 * steps.abs().max(), t
        assert torch.equal(steps.argmax(-1), passed.argmax(-1))
    # the pass moved pos T slots on and wrote the last token's choice after it
    assert decoder.host_pos == int(decoder.pos) == prompt.shape[1] + 5
    assert int(decoder.tokens[0, prompt.shape[1] + 5]) == int(passed[-1].argmax())


def test_bf16_pass_logits_have_the_steps_top1_within_bf16_rounding(prompt):
    model = build_model(config(), seed=0, dtype=torch.bfloat16, device=DEVICE)
    decoder = tp.MmaPassDecoder(model, capacity=64, max_query=5)
    agree = total = 0
    for t in (2, 3, 5):
        steps, passed = steps_and_pass(decoder, prompt, ids_of(t, seed=t))
        # a few BF16 ulps of the largest logit: the sums' order differs, and each op
        # rounds to BF16 as PyTorch does
        assert (steps - passed).abs().max() <= 2**-6 * steps.abs().max(), t
        agree += int((steps.argmax(-1) == passed.argmax(-1)).sum())
        total += t
    assert agree == total


def test_a_cache_of_one_tile_is_read_for_many_tokens_at_once(model, prompt):
    """A cache that the step's attention reads in one tile: a pass's tokens share the
    programs that read it (16 query rows each); in chunks: each token's programs, as a
    step's. Both give the steps' logits."""
    shared = tp.MmaPassDecoder(model, capacity=64, max_query=4)
    apart = tp.MmaPassDecoder(model, capacity=64, max_query=4,
                              attention={"n_split": 4, "block_s": 16})
    assert shared.shared_attention and not apart.shared_attention
    for decoder in (shared, apart):
        steps, passed = steps_and_pass(decoder, prompt, ids_of(4))
        assert (steps - passed).abs().max() <= 1e-4 * steps.abs().max()


def test_int8_weights_pass_logits_are_the_steps(model, prompt):
    decoder = tp.MmaPassDecoder(model, capacity=64, max_query=3, weights=INT8)
    steps, passed = steps_and_pass(decoder, prompt, ids_of(3))
    assert (steps - passed).abs().max() <= 1e-4 * steps.abs().max()


def test_the_step_is_the_parents_kernels_and_tiling(model, prompt):
    mma = tp.MmaPassDecoder(model, capacity=64, max_query=4)
    rows = TritonDecoder(model, capacity=64, max_query=4)
    assert mma.configs == rows.configs  # the step's tiling, not the passes'
    assert all(isinstance(c, pm.MmaConfig) for c in mma.pass_tiling.values())
    with torch.no_grad():
        logits = [d.prefill(prompt) is not None and d.step_logits(ids_of(1))
                  for d in (mma, rows)]
    assert torch.equal(*logits)  # the same kernels: the same bits
    # without the last program's reductions, no split-K in the passes either
    apart = tp.MmaPassDecoder(model, capacity=64, max_query=4, pass_tiling=SPLIT,
                              inline_reduce=False)
    assert {c.split_k for c in apart.pass_tiling.values()} == {1}


@pytest.fixture(scope="module")
def near_draft(model):
    """The target with a little noise on every weight: a draft that agrees with it
    often, not always, so that passes both accept and reject proposals."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen).to(p.device))
    return draft


@pytest.fixture(scope="module")
def alone(model, prompt):
    """The target's tokens alone, from its own one-token steps."""
    tokens = TritonDecoder(model, capacity=64).generate(prompt, NEW)
    assert len(set(tokens[0].tolist())) > 3  # a test of something
    return tokens


@pytest.mark.parametrize("k", [1, 2, 4])
def test_speculative_on_mma_passes_gives_the_targets_tokens_fp32(model, near_draft,
                                                                 prompt, alone, k):
    target = tp.MmaPassDecoder(model, capacity=64, max_query=k + 1)
    draft = TritonDecoder(near_draft, capacity=64, max_query=2)
    spec = sp.Speculative(target, draft, k=k)
    assert spec.kernels and isinstance(spec.verifier, sp.KernelVerifier)
    tokens = spec.generate(prompt, NEW)
    assert tokens.shape == (1, NEW) and torch.equal(tokens, alone)
    assert -(-(NEW - 1) // (k + 1)) <= spec.passes <= NEW - 1
    if DEVICE == "cpu":  # these seeded models (a GPU draws others): some proposals
        # accepted, some not
        assert -(-(NEW - 1) // (k + 1)) < spec.passes < NEW - 1
    assert spec.host_pos == int(spec.pos) >= prompt.shape[1] + NEW - 1


def test_a_self_draft_commits_k_plus_one_tokens_a_pass(model, prompt, alone):
    """The target as its own draft: FP32 passes agree with its steps on every choice
    here, so every pass commits k + 1 (inline argmax: the last lm_head program)."""
    k = 3
    target = tp.MmaPassDecoder(model, capacity=64, max_query=k + 1, inline_argmax=True,
                               pass_tiling=SPLIT)
    spec = sp.Speculative(target, TritonDecoder(model, capacity=64, max_query=2), k=k)
    assert torch.equal(spec.generate(prompt, NEW), alone)
    assert spec.passes == -(-(NEW - 1) // (k + 1))


def test_more_than_16_tokens_a_pass_is_refused_naming_the_fix(model):
    with pytest.raises(ValueError, match=r"max_query=17: a tensor-core pass takes at "
                                         r"most 16 tokens .*max_query=16\) or fewer"):
        tp.MmaPassDecoder(model, capacity=64, max_query=17)
    with pytest.raises(ValueError, match=r"max_query=0: the most tokens a pass takes"):
        tp.MmaPassDecoder(model, capacity=64, max_query=0)  # the parent's check
    tp.MmaPassDecoder(model, capacity=64, max_query=16)  # the most


@pytest.mark.parametrize("tiling,message", [
    ({"gate": C()}, r"pass_tiling=\.\.\.\) has 'gate': not a key it reads"),
    ({"o": GemvConfig()}, r"pass_tiling\['o'\] = GemvConfig.*an MmaConfig"),
    ({"lm_head": C(16, 64, split_k=2)}, "the lm_head pass has no split-K"),
])
def test_a_bad_pass_tiling_is_refused(model, tiling, message):
    with pytest.raises(ValueError, match=message):
        tp.MmaPassDecoder(model, capacity=64, max_query=4, pass_tiling=tiling)


def test_refused_passes_leave_the_state_as_it_was(model, near_draft, prompt):
    target = tp.MmaPassDecoder(model, capacity=64, max_query=3)
    spec = sp.Speculative(target, TritonDecoder(near_draft, capacity=64, max_query=2),
                          k=2)
    with torch.no_grad():
        spec.prefill(prompt)
        target.decode_step()
    before = state(target)
    fit = r"a pass of {} tokens: this decoder takes 1 \.\.\. 3"
    for query in (4, 0):
        with pytest.raises(ValueError, match=fit.format(query)):
            target.device_pass(query)
    with pytest.raises(ValueError, match=r"ids of shape \(1, 4\): \(1, T\) with T in "
                                         r"1 \.\.\. 3"):
        target.pass_logits(ids_of(4))
    verify = r"a verify pass of 4 tokens: the target takes 2 \.\.\. 3"
    with pytest.raises(ValueError, match=verify):
        spec.verifier.fn(4)
    with pytest.raises(ValueError, match=verify):
        spec.one_pass(3)
    assert 3 not in spec._passes
    assert same_state(state(target), before)
    with torch.no_grad():  # and the sequence goes on from there
        spec.decode_step()
    assert int(spec.pos) > before[0]
