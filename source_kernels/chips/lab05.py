"""Chips of lab 05 (forward, correct): the course's forward kernel and its launcher.

- ``msda_forward_kernel``: the ``@triton.jit`` forward kernel, one program per ``BLOCK_Q``
  queries of one (batch, head), wide over channels (``source_kernels.forward``);
- ``msda_forward(value, spatial_shapes, level_start_index, sampling_locations,
  attention_weights)``: its launcher on validated, contiguous inputs, (B, Q, M*D);
- ``forward_config(channels, dtype)``: the launch configuration (BLOCK_Q, num_warps) it uses.

Import ``source_kernels`` before this module on a machine without a GPU (it switches Triton to
its interpreter); importing this module does it for you.
"""
import source_kernels  # noqa: F401  (the interpreter switch, before any kernel is defined)
from source_kernels.forward import _msda_forward_kernel as msda_forward_kernel
from source_kernels.forward import forward_config, msda_forward

__all__ = ["msda_forward_kernel", "msda_forward", "forward_config"]
