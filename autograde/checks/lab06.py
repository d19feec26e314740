"""Hidden checks of lab 06 (make it fast): the narrow forward kernel's numbers, and the
autotuner's choices on made-up timings where the traps are known."""
from __future__ import annotations

import statistics

import torch

from . import _operator as op
from .common import count_kernel_launches, forbid_references, fresh_generator


def check_narrow(msda_forward_narrow):
    gen = fresh_generator()
    seed = gen.initial_seed()
    args = op.inputs(gen, 2, 6, 1, 3, [[3, 5], [1, 1]], 2, outside=0.2)
    expected = op.forward_fp64(args)
    with forbid_references(msda_forward_narrow), count_kernel_launches() as launches:
        got = msda_forward_narrow(*args.values(), block_q=4)
    if launches.count == 0:
        raise AssertionError("msda_forward_narrow launched no Triton kernel")
    op.assert_scaled(got, expected, torch.float32,
                     f"narrow forward, levels (3, 5) and (1, 1), D = 3, two blocks of queries "
                     f"(hidden check, seed {seed})", op.MSDA_OUTPUT_AXES,
                     hint=lambda: op.forward_hint(got, args, torch.float32))


class _Bench:
    """Made-up configurations: the j-th measurement of config c is times[c][j] (whatever the
    order in which configs are measured); run(c) returns the expected output, a wrong one, or
    raises."""

    def __init__(self, expected, times, wrong=(), failing=()):
        self.expected, self.times, self.wrong, self.failing = expected, times, wrong, failing
        self.calls = {c: 0 for c in times}

    def run(self, config):
        if config in self.failing:
            raise RuntimeError(f"out of resources: config {config} needs too much shared memory")
        if config in self.wrong:
            out = self.expected.clone()
            out[..., -1] += 0.5                      # drops or doubles a channel: wrong
            return out
        return self.expected.clone()

    def measure(self, config):
        j = self.calls[config]
        self.calls[config] += 1
        series = self.times[config]
        return series[j] if j < len(series) else series[-1]


def _scenarios(gen):
    """(description, bench, candidates, repeats, expected best or RuntimeError)."""
    expected = torch.randn(3, 5, generator=gen)
    configs = [(16, 2), (16, 4), (32, 4), (64, 4), (64, 8)]
    base = {c: 1e-3 * (1.0 + float(torch.rand((), generator=gen))) for c in configs}

    def series(t, spikes=()):
        values = [t * (1 + 0.01 * j) for j in range(7)]
        for j, factor in spikes:
            values[j] = t * factor
        return values

    # 1. the fastest configuration is wrong: it must not win
    times = {c: series(t) for c, t in base.items()}
    fastest = min(base, key=base.get)
    times[fastest] = series(base[fastest] * 0.2)
    yield ("the fastest configuration gives a wrong output", _Bench(expected, times,
                                                                    wrong={fastest}),
           configs, 5)
    # 2. an outlier: config a has the lowest median but one measurement 40x too slow, so the
    #    mean would pick config b
    times = {c: series(t) for c, t in base.items()}
    a, b = configs[1], configs[3]
    times[a] = series(0.5e-3, spikes=[(1, 40.0)])           # median 0.5 ms, mean inflated
    times[b] = series(0.6e-3)
    yield ("one measurement of the best configuration is an outlier", _Bench(expected, times),
           configs, 5)
    # 3. a configuration that fails to launch, and one that is wrong
    times = {c: series(t) for c, t in base.items()}
    yield ("one configuration raises, one is wrong", _Bench(expected, times,
                                                            wrong={configs[0]},
                                                            failing={configs[4]}),
           configs, 3)
    # 4. a tie: the earlier candidate wins
    times = {c: series(2e-3) for c in configs}
    times[configs[2]] = series(1e-3)
    times[configs[3]] = series(1e-3)
    yield ("two configurations tie", _Bench(expected, times), configs, 4)
    # 5. nothing is correct
    times = {c: series(t) for c, t in base.items()}
    yield ("no configuration is correct", _Bench(expected, times, wrong=set(configs[:3]),
                                                 failing=set(configs[3:])), configs, 3)


def _expected_result(bench, candidates, repeats):
    medians = {}
    for c in candidates:
        if c in bench.failing or c in bench.wrong:
            medians[c] = None
        else:
            medians[c] = statistics.median(bench.times[c][:repeats])
    timed = [(t, i, c) for i, (c, t) in enumerate(medians.items()) if t is not None]
    return (min(timed)[2] if timed else None), medians


def check_tune(tune):
    gen = fresh_generator()
    seed = gen.initial_seed()
    for description, bench, candidates, repeats in _scenarios(gen):
        best, medians = _expected_result(bench, candidates, repeats)
        what = f"tune: {description} (hidden check, seed {seed})"
        with forbid_references(tune):
            try:
                got = tune(list(candidates), bench.run, bench.measure, bench.expected.clone(),
                           repeats=repeats)
            except RuntimeError as exc:
                if best is None:
                    continue
                raise AssertionError(f"{what}: raised RuntimeError ({exc}) although "
                                     f"{best} is correct") from None
        if best is None:
            raise AssertionError(f"{what}: expected RuntimeError, got {got!r}")
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict)):
            raise AssertionError(f"{what}: expected a tuple (best, medians dict), got {got!r}")
        got_best, got_medians = got
        got_best = tuple(got_best) if isinstance(got_best, list) else got_best
        for config in candidates:
            want = medians[config]
            have = got_medians.get(config, "missing")
            if want is None and have is not None:
                raise AssertionError(f"{what}: config {config} should be rejected (median "
                                     f"None: its run raised or its output is wrong), got {have!r}")
            if want is not None and (not isinstance(have, (int, float))
                                     or abs(have - want) > 1e-12 * max(1.0, abs(want))):
                raise AssertionError(f"{what}: median of config {config}: expected {want!r} "
                                     f"(the median of {repeats} measurements after one warm-up "
                                     f"run), got {have!r}")
        if got_best != best:
            raise AssertionError(f"{what}: expected best {best}, got {got_best}")
