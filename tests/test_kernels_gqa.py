"""Decode attention for any grouped-query group, not only powers of two: Llama-3.2-3B
puts 24 query heads on 8 key/value heads, a group of 3. The kernels pad the group axis
to a power of two (tl.arange's sizes must be); these tests check, against the PyTorch
reference on fresh random inputs, that the padded heads change no result and write
nothing: not past the output, not past the partials of the workspace.

Without a GPU the kernels run under Triton's interpreter (PDL off), as in
test_kernels.py; the shapes are small so that a 2-core CPU runs them in seconds.
"""

import warnings

import pytest
import torch

if not torch.cuda.is_available():
    from gpuinfer.kernels.interpret import use_interpreter

    use_interpreter()  # before the kernel modules are imported (decorated)

from gpuinfer.kernels import attention as at  # noqa: E402
from gpuinfer.kernels import common  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PDL = common.pdl_supported(DEVICE)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
GUARD = 4096.0  # exact in BF16 too, and far from any attention output
KV, HEAD_DIM, CAPACITY, N_SPLIT, BLOCK_S = 2, 16, 64, 4, 16
# One split's first slots; a short last split (37: 38 slots, not a multiple of
# BLOCK_S); every slot of every split.
POSITIONS = (5, 37, CAPACITY - 1)


@pytest.fixture(autouse=True)
def quiet_numpy():
    with warnings.catch_warnings():  # the interpreter's exp overflows to inf, as meant
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in FP64: NaN if any element of out is NaN."""
    out, ref = out.double().cpu(), ref.double().cpu()
    return float((out - ref).norm() / ref.norm())


def guarded(n: int, guard: int, dtype) -> torch.Tensor:
    """n elements of NaN (one the kernel fails to write fails the test), then `guard` of
    GUARD (one it writes past the end fails it too): the buffer; [:n] is the tensor
    handed to the kernel."""
    buffer = torch.full((n + guard,), float("nan"), device=DEVICE, dtype=dtype)
    buffer[n:] = GUARD
    return buffer


def untouched(buffer: torch.Tensor, n: int) -> bool:
    return bool((buffer[n:] == GUARD).all())


def run(group: int, inline: bool, dtype, seed: int, kv=KV, head_dim=HEAD_DIM,
        positions=POSITIONS):
    """Kernel against reference at each position: a fresh workspace whose partials end
    in a guard, an output that does too, each as long as 16 padded rows (GROUP_PAD's
    least) would reach past the last real one."""
    torch.manual_seed(seed)
    heads = kv * group
    q = torch.randn(heads * head_dim, device=DEVICE).to(dtype)
    k_cache = torch.randn(kv, CAPACITY, head_dim, device=DEVICE).to(dtype)
    v_cache = torch.randn(kv, CAPACITY, head_dim, device=DEVICE).to(dtype)
    ws = at.AttentionWorkspace(DEVICE, kv, group, head_dim, N_SPLIT)
    n_partials = ws.partials.numel()
    guard = 16 * (head_dim + 2)
    partials = guarded(n_partials, guard, torch.float32)
    ws.partials = partials[:n_partials]
    for slot in positions:
        out = guarded(heads * head_dim, guard, dtype)
        at.decode_attention(q, k_cache, v_cache, torch.tensor([slot], device=DEVICE),
                            out[: heads * head_dim], n_split=N_SPLIT, block_s=BLOCK_S,
                            inline_combine=inline, pdl=PDL, workspace=ws)
        ref = at.decode_attention_reference(q, k_cache, v_cache, slot)
        assert rel_err(out[: heads * head_dim], ref) <= TOL[dtype], (group, slot)
        assert untouched(out, heads * head_dim), (group, slot)
        assert untouched(partials, n_partials), (group, slot)
        assert torch.all(ws.counters == 0), (group, slot)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("inline", [True, False], ids=["inline", "combine-kernel"])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 6, 8])
def test_decode_attention_any_group(group, inline, dtype):
    run(group, inline, dtype, seed=10 * group + inline)


def test_llama_3b_heads():
    """Llama-3.2-3B's attention: 24 query heads on 8 key/value heads of 128."""
    run(3, True, torch.bfloat16, seed=3, kv=8, head_dim=128, positions=(37,))


@pytest.mark.parametrize("sizes", [dict(head_dim=24), dict(block_s=48),
                                   dict(n_split=3)])
def test_other_sizes_must_still_be_powers_of_two(sizes):
    """Only the group is padded: head_dim, block_s and n_split are tl.arange sizes."""
    head_dim, block_s, n_split = (sizes.get("head_dim", 16), sizes.get("block_s", 16),
                                  sizes.get("n_split", 4))
    q, cache = torch.zeros(3 * head_dim), torch.zeros(1, 64, head_dim)
    name, value = next(iter(sizes.items()))
    with pytest.raises(ValueError, match=f"{name}={value} is not a power of two"):
        at.decode_attention(q, cache, cache, torch.tensor([0]), n_split=n_split,
                            block_s=block_s)
