"""The isolation probes of the backward checks (``diagnose_grad.locate``) pass honest float32
arithmetic and name a factor only when there is one.

A probe with one sample and one channel can have a gradient of 1e-5 made of terms near 1:
float32 code is then off by about 1e-7 of the terms, many times a tolerance taken relative to
the result alone.  The honest float32 gradient here is the reference itself, run in float32
through autograd: a different order of the same sums, with float32's rounding.
"""
from __future__ import annotations

import pytest
import torch

import source_kernels  # noqa: F401  (the interpreter switch, before any kernel is defined)
from autograde.checks import diagnose_grad
from autograde.checks.common import fresh_generator
from source_kernels import reference

NAMES = tuple(diagnose_grad.GRADIENT_INDEX)
CORPUS = "tests/fixtures/similarity/lab08_concurrent_writes/lab08_backward_kernel"


def _float32_gradients(args, grad_output):
    """The reference's three gradients, computed in float32 (as a kernel computes them)."""
    inputs = {k: v.float() if v.is_floating_point() else v for k, v in args.items()}
    leaves = [inputs[k].requires_grad_() for k in ("value", "sampling_locations",
                                                   "attention_weights")]
    out = reference.msda_grid_sample(**inputs)
    return torch.autograd.grad(out, leaves, grad_output.float())


def _cancelling(args, grad_output):
    """The inputs with every value shifted by the probe's sampled value, so that the sample
    (one point, four corners on the map, weights adding up to 1) is 0 up to rounding: a
    gradient far smaller than its terms."""
    sampled = reference.msda_grid_sample(**args).reshape(-1)[0]
    return dict(args, value=args["value"] - sampled)


def _results(seed, name, change=None, cancel=False):
    """(label, term, inputs, grad_output, float32 gradient ``name``) for every probe of
    ``seed``, the inputs rounded to float32 as the checks hand them to a kernel;
    ``change(index, gradient)`` may alter a probe's result; ``cancel``: the four-corner
    probe's sample cancels."""
    results = []
    for index, (label, term, args, grad_output) in enumerate(
            diagnose_grad.probes(fresh_generator(seed))):
        if cancel and "all four corners" in label:
            args = _cancelling(args, grad_output)
        args = {k: v.float().double() if v.is_floating_point() else v for k, v in args.items()}
        got = _float32_gradients(args, grad_output)[diagnose_grad.GRADIENT_INDEX[name]]
        results.append((label, term, args, grad_output.float(),
                        change(index, got) if change else got))
    return results


@pytest.mark.parametrize("name", NAMES)
def test_float32_gradients_pass_every_probe(name):
    wrong = {seed: message for seed in range(40)
             if (message := diagnose_grad.locate(name, _results(seed, name), torch.float32))}
    assert not wrong, wrong


def test_tolerance_follows_the_terms_not_the_result():
    """The four-corner probe's attention gradient cancels to about 1e-8 of its terms, as the
    sample of an honest kernel in lab 08's corpus did: float32 is then right to its terms."""
    name = "grad_attention_weights"
    results = _results(0, name, cancel=True)
    label, _, args, grad_output, _ = results[3]
    assert "all four corners" in label
    expected = diagnose_grad._gradient(name, args, grad_output)
    assert diagnose_grad.term_scale(name, args, grad_output) > 1e4 * float(expected.abs().max())
    assert diagnose_grad.locate(name, results, torch.float32) is None


def test_a_wrong_probe_is_still_located():
    """A result off by 1% of its terms on the four-corner probe only is located there."""
    name = "grad_attention_weights"

    def nudge(index, got):
        if index != 3:
            return got
        label, _, args, grad_output = diagnose_grad.probes(fresh_generator(2))[3]
        return got + 0.01 * diagnose_grad.term_scale(name, args, grad_output)
    message = diagnose_grad.locate(name, _results(2, name, nudge), torch.float32)
    assert message and "first wrong with the location inside a cell" in message, message
    assert "times the right one" not in message, message


def test_a_constant_factor_is_named():
    name = "grad_value"
    message = diagnose_grad.locate(name, _results(0, name, lambda _, got: 2 * got),
                                   torch.float32)
    assert message and "exactly 2 times the right one" in message, message


def test_the_corpus_answer_that_failed_passes():
    """An honest kernel of lab 08's corpus, on the seed whose four-corner probe failed it
    before the tolerance followed the terms."""
    import triton
    import triton.language as tl

    from autograde.checks import lab08

    namespace = {"torch": torch, "triton": triton, "tl": tl}
    path = f"{CORPUS}/honest_helpers.py"
    with open(path) as source:
        exec(compile(source.read(), path, "exec"), namespace)  # noqa: S102  (the answer under test)
    lab08.check_backward_grad_attn(namespace["msda_backward_kernel"], seed=1162190940)
