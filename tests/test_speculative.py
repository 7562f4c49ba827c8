"""Speculative greedy decoding: the target's own tokens, passes that commit 1 ... k + 1 of
them, verify passes that equal one-token steps, and clear errors; on two StaticDecoders
(Inductor's step) and on two TritonDecoders (Chapter 5's kernels, interpreted on a CPU)."""

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.decode import runners, speculative as sp  # noqa: E402
from gpuinfer.decode.static import StaticDecoder  # noqa: E402
from gpuinfer.decode.triton_step import TritonDecoder  # noqa: E402
from gpuinfer.model.configs import build_model, model_config, random_prompt  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEW = 30


def config(**sizes):
    # a larger initialisation than the toy's: random models whose greedy text varies
    return model_config("toy", vocab_size=64, initializer_range=0.2, **sizes)


@pytest.fixture(scope="module")
def models():
    target = build_model(config(), seed=0, device=DEVICE)
    draft = build_model(config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1),
                        seed=1, device=DEVICE)
    return target, draft


@pytest.fixture(scope="module")
def prompt():
    return random_prompt(config(), 8, device=DEVICE)


def pair(target_model, draft_model, capacity=64, **kwargs):
    target = StaticDecoder(target_model, 1, capacity)
    return target, sp.Speculative(target, StaticDecoder(draft_model, 1, capacity), **kwargs)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_output_is_the_targets_own_greedy_output(models, prompt, k):
    _, spec = pair(*models)
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    tokens = spec.generate(prompt, NEW, k)
    assert tokens.shape == (1, NEW) and tokens.device.type == "cpu"
    assert torch.equal(tokens, reference)
    assert (NEW - 1) / (k + 1) <= spec.passes <= NEW - 1


def test_a_draft_that_always_agrees_commits_k_plus_one_tokens_a_pass(models, prompt):
    _, spec = pair(models[0], models[0])  # the target as its own draft
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    for k in (1, 4):
        tokens = spec.generate(prompt, NEW, k)
        assert torch.equal(tokens, reference)
        assert spec.passes == -(-(NEW - 1) // (k + 1))


def test_the_pair_shares_one_sequence(models):
    target, spec = pair(*models)
    assert spec.draft.tokens is target.tokens and spec.draft.pos is target.pos


def test_a_rejected_proposal_is_rolled_back_by_position(models, prompt):
    target, spec = pair(*models)
    with torch.no_grad():
        spec.draft.prefill(prompt)
        target.prefill(prompt)
        start = int(target.pos)
        spec.draft_fn(4)()
        accepted = int(spec.verifier.fn(5)())
    assert 0 <= accepted <= 4 and int(target.pos) == start + accepted + 1


def test_verify_pass_logits_equal_one_token_steps(models, prompt):
    target = StaticDecoder(models[0], 1, 64)
    tokens = runners.generate(target, prompt, 8)
    with torch.no_grad():
        target.prefill(prompt)
        steps = torch.stack([target.step_logits(tokens[:, i: i + 1].to(DEVICE))
                             for i in range(5)], 1)
        target.prefill(prompt)
        positions = torch.arange(prompt.shape[1], prompt.shape[1] + 5, device=DEVICE)
        passes = target.logits(tokens[:, :5].to(DEVICE), positions, every_position=True)
    torch.testing.assert_close(passes, steps, rtol=1e-4, atol=1e-5)


def test_a_generation_marks_its_decode_loop_once(models, prompt):
    """What `measure.spans.decode_span_rounds` times: the passes, not the prefill."""
    from gpuinfer.measure.spans import span_clock

    _, spec = pair(*models)
    with span_clock() as marked:
        spec.generate(prompt, 12)
    assert len(marked) == 1


def test_expected_tokens():
    assert sp.expected_tokens(0.0, 4) == 1
    assert sp.expected_tokens(1.0, 4) == 5
    assert sp.expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_repeatable_resets_the_position(models):
    target = StaticDecoder(models[0], 1, 64)
    with torch.no_grad():
        step = sp.repeatable(target.pos, 10, target.device_step)
        for _ in range(3):
            step()
            assert int(target.pos) == 11


def test_bad_input_is_refused_with_the_fix(models, prompt):
    _, spec = pair(*models, capacity=64)
    with pytest.raises(ValueError, match="capacity"):
        spec.generate(prompt, 60, 4)
    with pytest.raises(ValueError, match="between 1 and"):
        spec.one_pass(0)
    with pytest.raises(ValueError, match="2 ... 17"):
        spec.verifier.fn(1)
    with pytest.raises(ValueError, match="same capacity"):
        sp.Speculative(StaticDecoder(models[0], 1, 64), StaticDecoder(models[1], 1, 128))
    with pytest.raises(ValueError, match="batch 1"):
        sp.Speculative(StaticDecoder(models[0], 2, 64), StaticDecoder(models[1], 2, 64))


@pytest.mark.gpu
def test_compiled_and_graphed_passes_give_the_targets_tokens(models, prompt):
    _, spec = pair(*models, mode=runners.COMPILED_GRAPH_PDL)
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    for k in (1, 3, 6):
        assert torch.equal(spec.generate(prompt, NEW, k), reference)


def test_a_speculative_decoder_has_the_decoders_interface(models, prompt):
    _, spec = pair(*models, k=3)
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    assert torch.equal(spec.generate(prompt, NEW), reference)  # k = 3
    with torch.no_grad():
        spec.prefill(prompt)
        start = int(spec.pos)
        spec.decode_step()  # one pass: 1 ... 4 tokens
    assert 1 <= int(spec.pos) - start <= 4
    assert torch.equal(spec.tokens[:, prompt.shape[1]: int(spec.pos) + 1].cpu(),
                       reference[:, : int(spec.pos) + 1 - prompt.shape[1]])


def test_cudagraph_trees_are_refused_for_a_pass(models):
    with pytest.raises(ValueError, match="by hand"):
        pair(*models, mode=runners.COMPILED_TREES)


# --- on Chapter 5's kernels: two TritonDecoders ---------------------------------------

KERNEL_NEW = 12  # interpreted kernels are slow: a short generation


def kernel_pair(target_model, draft_model, k, capacity=64):
    """A Speculative pair of TritonDecoders: the target takes passes of k + 1 tokens, the
    draft of 2 (its first step of a pass recomputes slot pos - 1)."""
    target = TritonDecoder(target_model, capacity=capacity, max_query=k + 1)
    draft = TritonDecoder(draft_model, capacity=capacity, max_query=2)
    return target, sp.Speculative(target, draft, k=k)


@pytest.fixture(scope="module")
def near_draft(models):
    """The target with a little noise on every weight: a draft that agrees with it
    often, not always, so that passes both accept and reject proposals."""
    import copy

    draft = copy.deepcopy(models[0])
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p.device))
    return draft


@pytest.fixture(scope="module")
def kernel_alone(models, prompt):
    """The target's tokens alone, from its own one-token steps."""
    tokens = TritonDecoder(models[0], capacity=64).generate(prompt, KERNEL_NEW)
    assert len(set(tokens[0].tolist())) > 3  # a test of something
    return tokens


@pytest.mark.parametrize("k", [1, 3])
def test_on_kernels_the_output_is_the_targets_alone(models, near_draft, prompt,
                                                    kernel_alone, k):
    _, spec = kernel_pair(models[0], near_draft, k)
    assert spec.kernels
    tokens = spec.generate(prompt, KERNEL_NEW)
    assert tokens.shape == (1, KERNEL_NEW) and tokens.device.type == "cpu"
    assert torch.equal(tokens, kernel_alone)
    assert (KERNEL_NEW - 1) / (k + 1) <= spec.passes <= KERNEL_NEW - 1
    if DEVICE == "cpu":  # these seeded models (a GPU draws others): some proposals
        # accepted, some not (8 passes at k = 1, 7 at k = 3)
        assert -(-(KERNEL_NEW - 1) // (k + 1)) < spec.passes < KERNEL_NEW - 1
    assert spec.host_pos == int(spec.pos) >= prompt.shape[1] + KERNEL_NEW - 1


def test_on_kernels_a_self_draft_commits_k_plus_one_tokens_a_pass(models, prompt,
                                                                  kernel_alone):
    """The target as its own draft: every proposal is the target's choice (each
    token's arithmetic is the step's in a pass too), so every pass commits k + 1."""
    k = 3
    _, spec = kernel_pair(models[0], models[0], k)
    assert torch.equal(spec.generate(prompt, KERNEL_NEW), kernel_alone)
    assert spec.passes == -(-(KERNEL_NEW - 1) // (k + 1))
    with torch.no_grad():
        spec.prefill(prompt)
        start = int(spec.pos)
        spec.decode_step()  # one pass from Python: k + 1 tokens, the position read
    assert int(spec.pos) == spec.host_pos == start + k + 1
    assert torch.equal(spec.tokens[0, start: start + k + 2].cpu(), kernel_alone[0, : k + 2])


def test_a_mixed_pair_is_refused_and_left_apart(models):
    kernels = TritonDecoder(models[0], capacity=64, max_query=4)
    static = StaticDecoder(models[1], 1, 64)
    for target, draft in ((kernels, static),
                          (StaticDecoder(models[0], 1, 64),
                           TritonDecoder(models[1], capacity=64, max_query=2))):
        tokens, pos = draft.tokens, draft.pos
        with pytest.raises(ValueError, match="a .*Decoder target with a .*Decoder draft: "
                                             "build both as TritonDecoders or both"):
            sp.Speculative(target, draft)
        assert draft.tokens is tokens and draft.pos is pos  # not made to share


def test_a_draft_without_two_token_passes_is_refused(models):
    target = TritonDecoder(models[0], capacity=64, max_query=4)
    draft = TritonDecoder(models[1], capacity=64)  # max_query=1
    with pytest.raises(ValueError, match=r"TritonDecoder\(\.\.\., max_query=2\)"):
        sp.Speculative(target, draft)
    assert draft.tokens is not target.tokens


def test_a_pass_longer_than_the_targets_max_query_is_refused(models, prompt):
    _, spec = kernel_pair(*models, k=2)  # the target takes 2 ... 3 tokens
    message = (r"k = 4 proposals need a verify pass of 5 tokens: the target takes "
               r"2 \.\.\. 3; build it with TritonDecoder\(\.\.\., max_query=5\), or "
               r"pass k <= 2")
    with pytest.raises(ValueError, match=message):
        spec.one_pass(4)
    with pytest.raises(ValueError, match=message):
        spec.generate(prompt, 5, k=4)
    assert 4 not in spec._passes


@pytest.mark.parametrize("kind", ["kernels", "static"])
def test_a_refused_k_leaves_the_sequence_as_it_was(models, prompt, kind):
    """generate with a k the pair cannot run (a pass longer than the target's max_query;
    k = 0 proposals) is refused with the position, the tokens and host_pos as they were,
    so that the next pass continues the sequence."""
    if kind == "kernels":
        _, spec = kernel_pair(*models, k=2)
        bad = 4
    else:
        _, spec = pair(*models)
        bad = 0
    with torch.no_grad():
        spec.prefill(prompt)
    before = int(spec.pos), spec.host_pos, spec.tokens.clone()
    with pytest.raises(ValueError):
        spec.generate(prompt, 5, k=bad)
    assert (int(spec.pos), spec.host_pos) == before[:2]
    assert torch.equal(spec.tokens, before[2])


@pytest.mark.parametrize("bad", [2.5, "2", True, 0, -1])
def test_a_k_that_is_not_a_count_of_proposals_is_refused_with_the_state_unchanged(
        models, prompt, bad):
    """generate(k=2.5) (or "2", True, 0): a ValueError naming k, before the position
    moves (the static pair: check_k runs before anything is shared or changed)."""
    _, spec = pair(*models, k=3)
    with torch.no_grad():
        spec.prefill(prompt)
    before = int(spec.pos), spec.host_pos, spec.tokens.clone()
    with pytest.raises(ValueError, match=rf"k = {bad!r} proposals: an int between 1 and"):
        spec.generate(prompt, 5, k=bad)
    assert (int(spec.pos), spec.host_pos) == before[:2]
    assert torch.equal(spec.tokens, before[2]) and bad not in spec._passes


@pytest.mark.parametrize("k", [0, 2.5, 17])
def test_a_bad_k_is_refused_at_construction_before_anything_is_shared(models, k):
    target, draft = (StaticDecoder(m, 1, 64) for m in models)
    with pytest.raises(ValueError,
                       match=rf"k = {k!r} proposals: an int between 1 and 16"):
        sp.Speculative(target, draft, k=k)
    assert draft.tokens is not target.tokens and draft.pos is not target.pos


def test_a_k_the_targets_passes_cannot_take_is_refused_at_construction(models):
    target = TritonDecoder(models[0], capacity=64, max_query=3)
    draft = TritonDecoder(models[1], capacity=64, max_query=2)
    with pytest.raises(ValueError, match=r"k = 4 proposals need a verify pass of 5 "
                                         r"tokens: the target takes 2 \.\.\. 3"):
        sp.Speculative(target, draft)  # the default k = 4
    assert draft.tokens is not target.tokens and draft.pos is not target.pos


@pytest.mark.parametrize("kind", ["kernels", "static"])
def test_a_draft_of_another_vocabulary_is_refused_before_anything_is_shared(models, kind):
    """Refused before the pair shares the target's tokens and position: the draft used
    alone afterwards moves its own position, not the target's."""
    small = model_config("toy", vocab_size=48, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1)
    other = build_model(small, seed=2, device=DEVICE)
    if kind == "kernels":
        target = TritonDecoder(models[0], capacity=64, max_query=5)
        draft = TritonDecoder(other, capacity=64, max_query=2)
    else:
        target, draft = StaticDecoder(models[0], 1, 64), StaticDecoder(other, 1, 64)
    with pytest.raises(ValueError, match="a draft of vocabulary 48 for a target of 64: "
                                         "the two models must share one tokenizer"):
        sp.Speculative(target, draft)
    assert draft.tokens is not target.tokens and draft.pos is not target.pos
    target_pos = int(target.pos)
    with torch.no_grad():
        draft.prefill(random_prompt(small, 5, device=DEVICE))
    assert int(target.pos) == target_pos


def test_position_reads_on_a_cpu_come_back_oldest_first():
    pos = torch.tensor([5])
    reads = sp.PositionReads(pos)
    assert reads.in_flight == 0 and not reads.cuda
    reads.publish()  # inside the pass
    reads.queue()  # after it
    pos.fill_(9)  # the next pass moved it
    reads.publish()
    reads.queue()
    assert reads.in_flight == 2
    assert reads.oldest() == 5 and reads.in_flight == 1
    pos.fill_(12)
    reads.publish()
    reads.queue()  # the slot read back is free again
    assert [reads.oldest(), reads.oldest()] == [9, 12] and reads.in_flight == 0


def test_position_reads_refuse_more_in_flight_than_they_hold():
    reads = sp.PositionReads(torch.tensor([5]), most=2)
    for _ in range(2):
        reads.publish()
        reads.queue()
    with pytest.raises(ValueError, match="2 positions in flight: PositionReads holds at "
                                         "most 2; read the oldest first"):
        reads.queue()
    assert reads.in_flight == 2 and reads.oldest() == 5


def test_position_reads_refuse_to_read_with_none_in_flight():
    reads = sp.PositionReads(torch.tensor([5]))
    with pytest.raises(ValueError, match="in flight"):
        reads.oldest()


def test_passes_that_publish_unread_leave_the_next_generations_reads_right(models, prompt):
    """A pass stores its position into the reads' next slot whoever reads it: passes
    from `decode_step` move the counter, and the next generation starts again at slot 0."""
    _, spec = pair(*models, k=3)
    reference = runners.generate(StaticDecoder(models[0], 1, 64), prompt, NEW)
    assert torch.equal(spec.generate(prompt, NEW), reference)
    first = spec.passes
    steps = 1 if (first + 1) % sp.IN_FLIGHT else 2  # to leave the counter off slot 0
    with torch.no_grad():
        spec.prefill(prompt)
        for _ in range(steps):
            spec.decode_step()
    assert int(spec.reads.next_slot) == (first + steps) % sp.IN_FLIGHT != 0
    assert torch.equal(spec.generate(prompt, NEW), reference)
    assert spec.reads.queued == spec.passes and spec.reads.in_flight == 0
    assert int(spec.reads.ring[(spec.passes - 1) % sp.IN_FLIGHT]) == spec.host_pos
