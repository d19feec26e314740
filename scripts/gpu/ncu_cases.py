"""Launch each benchmark case of interest exactly once, for Nsight Compute to profile.

    ncu --clock-control none --metrics ... --csv python3 scripts/gpu/ncu_cases.py

Prints the cases in launch order (one forward kernel, then one backward kernel each), so
the counters in ncu's output can be matched to them.
"""
import torch

import source_kernels as sk
from source_kernels.inputs import preset_inputs

CASES = [("decoder", "uniform", torch.bfloat16),
         ("encoder", "uniform", torch.bfloat16), ("encoder", "local", torch.bfloat16),
         ("encoder", "uniform", torch.float32)]

for preset, distribution, dtype in CASES:
    args = preset_inputs(preset, distribution=distribution, dtype=dtype, device="cuda",
                         requires_grad=True)
    out = sk.multi_scale_deformable_attn(**args)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    print(f"case {preset} {distribution} {str(dtype).removeprefix('torch.')}: forward, backward",
          flush=True)
