"""Hidden checks of lab 03 (the machine): the paper GPU's sector counter and the tilings."""
from __future__ import annotations

import torch

from source_kernels.chips import lab03 as chips

from .common import forbid_references, fresh_generator


def _random_instruction(gen, access_bytes, aligned=True, idle=0):
    addresses = torch.randint(0, 4096, (32,), generator=gen, dtype=torch.int64)
    if aligned:
        addresses = addresses // access_bytes * access_bytes
    if idle:
        addresses[torch.randperm(32, generator=gen)[:idle]] = -1
    return addresses


def check_sectors_and_lines(sectors_and_lines):
    gen = fresh_generator()
    seed = gen.initial_seed()
    cases = [(torch.arange(32) * 4, 4), (torch.arange(32) * 128, 4), (torch.full((32,), 64), 4),
             (torch.full((32,), -1), 4), (torch.arange(32) * 2 + 30, 2)]
    for access in (1, 2, 4, 8, 16):
        for aligned in (True, False):
            for idle in (0, 5):
                cases.append((_random_instruction(gen, access, aligned, idle), access))
    for addresses, access in cases:
        expected = chips.sectors_and_lines(addresses, access)
        with forbid_references(sectors_and_lines):
            got = sectors_and_lines(addresses.clone(), access)
        got = tuple(int(v) for v in got)
        if got != expected:
            shown = addresses.tolist()
            raise AssertionError(
                f"lanes reading {access} bytes at {shown[:8]}... (all 32: {shown}): expected "
                f"(sectors, lines) = {expected}, got {got} (hidden check, seed {seed}). "
                "Idle lanes (-1) touch nothing; an access may straddle two sectors.")


def check_warp_instructions(warp_instructions):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for tiling in ("wide", "narrow"):
        for n_rows, channels, elem, stride in ((40, 8, 4, None), (33, 32, 2, None),
                                               (16, 12, 4, 64), (70, 48, 2, 4 * 96)):
            rows = torch.randint(0, 500, (n_rows,), generator=gen, dtype=torch.int64)
            expected = chips.warp_instructions(tiling, rows, channels, elem, stride)
            with forbid_references(warp_instructions):
                got = warp_instructions(tiling, rows.clone(), channels, elem, stride)
            got = torch.as_tensor(got)
            what = (f"{tiling} tiling of {n_rows} rows x {channels} channels of {elem} bytes, "
                    f"row stride {stride if stride else channels * elem} bytes")
            if tuple(got.shape) != tuple(expected.shape):
                raise AssertionError(f"{what}: expected {tuple(expected.shape)} "
                                     f"(instructions, 32), got {tuple(got.shape)} "
                                     f"(hidden check, seed {seed})")
            bad = (got.to(torch.int64) != expected).nonzero()
            if bad.numel():
                i, lane = (int(v) for v in bad[0])
                raise AssertionError(
                    f"{what}: instruction {i}, lane {lane}: expected byte address "
                    f"{int(expected[i, lane])}, got {int(got[i, lane])}; "
                    f"{bad.shape[0]} lanes differ (hidden check, seed {seed})")


def check_gather_traffic(gather_traffic):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for tiling in ("wide", "narrow"):
        for n_rows, channels, elem, stride in ((64, 16, 4, None), (50, 32, 2, None),
                                               (40, 6, 4, 8 * 6 * 4)):
            rows = torch.randint(0, 300, (n_rows,), generator=gen, dtype=torch.int64)
            expected = chips.gather_traffic(tiling, rows, channels, elem, stride)
            with forbid_references(gather_traffic):
                got = gather_traffic(tiling, rows.clone(), channels, elem, stride)
            for key, value in expected.items():
                if key not in got:
                    raise AssertionError(f"gather_traffic must return the key {key!r} "
                                         f"(hidden check, seed {seed})")
                if abs(float(got[key]) - float(value)) > 1e-9 * max(1.0, abs(float(value))):
                    raise AssertionError(
                        f"{tiling} gather of {n_rows} rows x {channels} channels of {elem} "
                        f"bytes: {key} expected {value}, got {got[key]} "
                        f"(hidden check, seed {seed})")


def check_predict_tiling(predict_tiling):
    gen = fresh_generator()
    seed = gen.initial_seed()
    rows = torch.randint(0, 1000, (64,), generator=gen, dtype=torch.int64)
    same = torch.full((64,), int(torch.randint(0, 1000, (1,), generator=gen)))
    for case_rows, channels, elem in ((rows, 32, 4), (rows, 8, 2), (same, 64, 4), (same, 1, 4)):
        expected = chips.predict_tiling(case_rows, channels, elem)
        with forbid_references(predict_tiling):
            got = predict_tiling(case_rows.clone(), channels, elem)
        if got != expected:
            kind = "one repeated row" if bool((case_rows == case_rows[0]).all()) else "random rows"
            raise AssertionError(f"{kind}, {channels} channels of {elem} bytes: expected "
                                 f"{expected!r}, got {got!r} (hidden check, seed {seed})")
