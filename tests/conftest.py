import pytest
import torch

import source_kernels  # noqa: F401  (sets TRITON_INTERPRET before any kernel is defined)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none (the Triton "
                                   "interpreter covers correctness in the CPU tests)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
