"""Comparing teacher-forced logits, and the table the chapters show of the comparisons."""

import torch

from gpuinfer.measure.quality import LogitAgreement, agreement_markdown, compare_logits


def test_compare_logits_measures_the_largest_difference_and_top1():
    ref = torch.tensor([[[1.0, 4.0, 2.0], [3.0, 0.0, 1.0]]])  # (batch 1, 2 steps, vocab 3)
    other = ref.clone()
    other[0, 1] = torch.tensor([3.0, 3.5, 1.0])  # step 2: a different argmax
    a = compare_logits(ref, other)
    assert a.steps == 2 and a.max_abs == 3.5
    assert a.rel == 3.5 / 3.0 and a.top1 == 0.5


def test_agreement_markdown_has_a_row_per_comparison():
    table = agreement_markdown({"BF16": LogitAgreement(4, 0.0123, 0.001, 1.0),
                                "int8": LogitAgreement(4, 0.5, 0.02, 0.75)},
                               "fed the reference's tokens")
    lines = table.splitlines()
    assert lines[0].startswith("| fed the reference's tokens | max abs. difference")
    assert lines[2] == "| BF16 | 0.0123 | 0.1 % | 100.0 % |"
    assert lines[3] == "| int8 | 0.5 | 2 % | 75.0 % |"
    assert len(lines) == 4
