"""model.quant: symmetric per-row int8, on the CPU (no kernel runs here)."""

import pytest
import torch

from gpuinfer.model.quant import INT8_MAX, Int8Matrix, matvec_fp32, quantize_int8
from gpuinfer.model.llama import linear


def test_each_row_is_within_half_a_step_of_its_scale():
    torch.manual_seed(0)
    w = (torch.randn(37, 100) * torch.rand(37, 1) * 3).to(torch.bfloat16)
    m = quantize_int8(w)
    assert m.q.dtype == torch.int8 and m.scale.dtype == torch.bfloat16
    assert m.shape == w.shape and m.scale.shape == (37,)
    assert m.q.abs().max() <= INT8_MAX
    assert (m.q.abs().amax(dim=1) >= INT8_MAX - 1).all()  # each row uses its range
    err = (m.q.float() * m.scale.float()[:, None] - w.float()).abs()
    assert (err <= m.scale.float()[:, None] * 0.5 * (1 + 1e-3)).all()


def test_a_zero_row_stays_zero_and_the_bytes_are_counted():
    w = torch.randn(4, 8, dtype=torch.bfloat16)
    w[2] = 0
    m = quantize_int8(w)
    assert m.q[2].eq(0).all() and m.scale[2].item() == 1.0
    assert m.nbytes == 4 * 8 + 4 * 2  # int8 weights, BF16 scales
    assert torch.equal(m.dequantized()[2], w[2])


def test_products_scale_each_row():
    torch.manual_seed(1)
    w, x = torch.randn(16, 32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16)
    m = quantize_int8(w)
    dense = m.dequantized().float() @ x.float()
    assert torch.allclose(matvec_fp32(m, x), dense, rtol=1e-2, atol=1e-2)
    assert torch.allclose(linear(x[None], m)[0].float(), dense, rtol=2e-2, atol=2e-2)
    assert torch.equal(matvec_fp32(w, x), w.float() @ x.float())  # a plain matrix


@pytest.mark.parametrize("bad", [torch.zeros(3, dtype=torch.bfloat16),
                                 torch.zeros(3, 3, dtype=torch.int32)])
def test_bad_input_is_named(bad):
    with pytest.raises(ValueError, match="2-D floating-point"):
        quantize_int8(bad)


def test_int8matrix_is_a_value():
    m = quantize_int8(torch.ones(2, 2))
    assert isinstance(m, Int8Matrix) and m.device.type == "cpu"
