"""Chips of lab 03 (the machine): a paper GPU that counts memory sectors.

The model: a warp of 32 threads issues one load instruction at a time; every active lane
reads ``access_bytes`` bytes from its own byte address.  The memory system serves the
instruction in 32-byte sectors, grouped in 128-byte cache lines; the cost of an instruction
is the number of distinct sectors (and lines) its lanes touch.  There is no cache: each
instruction pays for its sectors again.

The job: gather ``channels`` elements of every row in ``rows`` (the corner rows of MSDA) from
a table whose row r starts at byte ``r * row_stride_bytes``.  Two ways to hand the work to
lanes:

- ``"wide"`` (over channels): the (row, channel) pairs in row-major order, 32 at a time:
  neighbouring lanes read neighbouring channels of one row;
- ``"narrow"``: each lane owns one row of a group of 32 rows, and the warp walks the
  channels one instruction per channel.

Graded code may call these chips in lab 04 (``gather_traffic``), lab 06 (``gather_traffic``)
only; in lab 03 itself and in every other lab a graded function that calls one fails its check
(book/labs.md, the chips your graded code may call).
"""
from __future__ import annotations

import torch

__all__ = ["WARP_SIZE", "SECTOR_BYTES", "LINE_BYTES", "sectors_and_lines",
           "warp_instructions", "gather_traffic", "predict_tiling"]

WARP_SIZE = 32
SECTOR_BYTES = 32
LINE_BYTES = 128


def sectors_and_lines(addresses, access_bytes):
    """Sectors and lines one warp instruction touches.

    addresses     (32,) int64 byte addresses, one per lane; -1 marks an idle lane
    access_bytes  int, bytes each active lane reads starting at its address
    returns       (sectors, lines): numbers of distinct 32-byte sectors and 128-byte lines
    """
    addresses = torch.as_tensor(addresses, dtype=torch.int64)
    active = addresses[addresses >= 0]
    if active.numel() == 0:
        return 0, 0
    first = active // SECTOR_BYTES
    last = (active + access_bytes - 1) // SECTOR_BYTES
    span = int((last - first).max()) + 1
    sectors = (first[:, None] + torch.arange(span)[None, :]).clamp_max(last[:, None])
    sectors = torch.unique(sectors)
    lines = torch.unique(sectors // (LINE_BYTES // SECTOR_BYTES))
    return int(sectors.numel()), int(lines.numel())


def warp_instructions(tiling, rows, channels, elem_bytes, row_stride_bytes=None):
    """Byte addresses of every warp instruction of the gather.

    tiling            "wide" or "narrow" (see the module docstring)
    rows              (R,) int64 row indices
    channels          int, elements gathered from each row
    elem_bytes        int, bytes per element (4 for fp32, 2 for bf16)
    row_stride_bytes  int, bytes from one row to the next (default channels * elem_bytes)
    returns           (instructions, 32) int64 byte addresses, -1 for idle lanes
    """
    rows = torch.as_tensor(rows, dtype=torch.int64)
    stride = channels * elem_bytes if row_stride_bytes is None else row_stride_bytes
    row_base = rows * stride                                              # (R,)
    chan_off = torch.arange(channels, dtype=torch.int64) * elem_bytes     # (D,)
    if tiling == "wide":
        lanes = (row_base[:, None] + chan_off[None, :]).reshape(-1)       # row-major pairs
        pad = (-lanes.numel()) % WARP_SIZE
        lanes = torch.cat([lanes, lanes.new_full((pad,), -1)])
        return lanes.view(-1, WARP_SIZE)
    if tiling == "narrow":
        pad = (-rows.numel()) % WARP_SIZE
        groups = torch.cat([row_base, row_base.new_full((pad,), -1)]).view(-1, WARP_SIZE)
        # instruction (group g, channel c): lane i reads row g*32 + i at channel c
        addr = groups[:, None, :] + chan_off[None, :, None]                # (G, D, 32)
        addr = torch.where(groups[:, None, :] >= 0, addr, torch.full_like(addr, -1))
        return addr.reshape(-1, WARP_SIZE)
    raise ValueError(f"tiling must be 'wide' or 'narrow', got {tiling!r}")


def gather_traffic(tiling, rows, channels, elem_bytes, row_stride_bytes=None):
    """Run the gather on the paper GPU.  Returns a dict: ``instructions``, ``sectors``,
    ``lines`` (totals over all instructions), ``useful_bytes`` (rows * channels *
    elem_bytes), ``moved_bytes`` (sectors * 32) and ``efficiency`` (useful / moved)."""
    instructions = warp_instructions(tiling, rows, channels, elem_bytes, row_stride_bytes)
    sectors = lines = 0
    for addresses in instructions:
        s, l = sectors_and_lines(addresses, elem_bytes)
        sectors += s
        lines += l
    useful = int(torch.as_tensor(rows).numel()) * channels * elem_bytes
    return {"instructions": int(instructions.shape[0]), "sectors": sectors, "lines": lines,
            "useful_bytes": useful, "moved_bytes": sectors * SECTOR_BYTES,
            "efficiency": useful / max(sectors * SECTOR_BYTES, 1)}


def predict_tiling(rows, channels, elem_bytes, row_stride_bytes=None):
    """"wide" or "narrow": the tiling that moves fewer sectors for this gather (ties go to
    "wide", which also issues no more instructions)."""
    wide = gather_traffic("wide", rows, channels, elem_bytes, row_stride_bytes)
    narrow = gather_traffic("narrow", rows, channels, elem_bytes, row_stride_bytes)
    return "wide" if wide["sectors"] <= narrow["sectors"] else "narrow"
