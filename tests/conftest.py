"""Shared test setup: GPU-only tests are marked `gpu` and skip cleanly without CUDA."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (runs on the recording GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
