"""Run the operator test suite (tests/test_operator.py) against another implementation.

tests/test_operator.py reaches the operator only through two names of the package,
``sk.multi_scale_deformable_attn`` and ``sk.MultiScaleDeformableAttnFunction`` (``sk`` is its
``import source_kernels as sk``).  This pytest plugin gives each test module that imports the
package as ``sk`` a stand-in for it, where those two names are yours and every other name is
the package's.  Nothing in the test file changes.

Two ways to use it:

- in a notebook or script (lab 10)::

      import operator_suite                  # tests/ on sys.path
      operator_suite.run(my_operator, MyFunction)

- on the command line, with your operator in an importable module::

      python -m pytest tests/test_operator.py -p tests.operator_suite \\
          --msda-operator mypackage.module:my_operator \\
          --msda-function mypackage.module:MyFunction

Tests about the package itself rather than the operator (its registered custom op, its
default for ``fp32_grad_accum``, ``torch.compile`` of its custom op, its internal kernel
variants, its memory of checked arguments, and what it accepts beyond mmcv's contract:
``value_level_start_index=None``, a dtype mismatch that is also a ValueError, the
``mixed_precision`` option for a 16-bit value beside fp32 locations and weights, and CUDA
graph capture, which needs validation that copies nothing to the host once the shapes are
known) are deselected by name.  Any other test that never calls the swapped operator is
reported as skipped ("tests the package, not the operator under test") rather than passed:
its pass would be a pass of the package's code.

A safety net: when a call's arguments are ones the package's own validation rejects, the
course's forward and backward kernels refuse to launch for the length of that call.  An
operator that forgets a check then fails the test with a message saying so, instead of
letting the kernel read outside the tensors (which can crash the process on a CPU, or leave a
GPU context unusable).
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import types
from pathlib import Path

import pytest

TEST_FILE = Path(__file__).resolve().parent / "test_operator.py"
# tests of the package rather than of the operator: they stay with the package
PACKAGE_ONLY = ("test_default_fp32_grad_accum", "test_custom_op_passes_opcheck",
                "test_torch_compile_fullgraph", "test_loop_and_tiled_kernels_match_fp64",
                "test_row_kernels_match_fp64", "test_level_start_index_may_be_none",
                "test_dtype_mismatch_is_a_value_error_naming_the_dtypes",
                "test_bad_shape_tensors_after_a_valid_call_are_still_refused",
                "test_int32_shapes_and_repeated_calls_agree",
                "test_mixed_precision_is_asked_for_and_nothing_else_mixes",
                "test_mixed_precision_takes_fp32_locations_and_weights",
                # the package's option and its compiled path, on the GPU (as the two above)
                "test_gpu_mixed_precision_decoder_preset",
                # capture needs validation that copies nothing to the host once the shapes are
                # known (the package remembers checked tensors): lab 10's wrap-up leaves it to
                # source_kernels/op.py
                "test_gpu_cuda_graph_capture")
NOT_THE_OPERATOR = "tests the package, not the operator under test"

__all__ = ["SwapOperator", "run", "TEST_FILE", "PACKAGE_ONLY"]


class SwapOperator:
    """A pytest plugin: within test modules that use ``sk``, ``sk.multi_scale_deformable_attn``
    is ``function`` and ``sk.MultiScaleDeformableAttnFunction`` is ``autograd_function``."""

    def __init__(self, function, autograd_function, label="your operator"):
        self.function = function
        self.autograd_function = autograd_function
        self.label = label
        self.calls = 0
        self.outcomes = {}
        self.package_only = []          # ran, never called the operator under test
        self._calls_at_setup = {}

    def _standin(self, package):
        plugin = self
        module = types.ModuleType(f"{package.__name__} with {self.label}")

        def multi_scale_deformable_attn(*args, **kwargs):
            plugin.calls += 1
            with kernels_refuse_invalid(args, kwargs):
                return plugin.function(*args, **kwargs)

        class MultiScaleDeformableAttnFunction:
            @staticmethod
            def apply(*args, **kwargs):
                plugin.calls += 1
                with kernels_refuse_invalid(args, kwargs):
                    return plugin.autograd_function.apply(*args, **kwargs)

        module.multi_scale_deformable_attn = multi_scale_deformable_attn
        module.MultiScaleDeformableAttnFunction = MultiScaleDeformableAttnFunction
        module.__getattr__ = lambda name: getattr(package, name)     # everything else
        return module

    def pytest_collection_modifyitems(self, config, items):
        keep, drop = [], []
        for item in items:
            name = getattr(item, "originalname", None) or item.name.split("[")[0]
            (drop if name in PACKAGE_ONLY else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    @pytest.fixture(autouse=True)
    def _msda_swap_operator(self, request, monkeypatch):
        import source_kernels

        module = getattr(request, "module", None)
        if module is None or getattr(module, "sk", None) is not source_kernels:
            yield
            return
        monkeypatch.setattr(module, "sk", self._standin(source_kernels))
        self._calls_at_setup[request.node.nodeid] = self.calls
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        before = self._calls_at_setup.get(item.nodeid)
        if report.when == "call" and report.passed and before is not None \
                and self.calls == before:
            # a pass that never reached the operator under test is no pass of it
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0,
                               f"Skipped: {NOT_THE_OPERATOR}")
            self.package_only.append(item.nodeid)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.outcomes.setdefault(report.nodeid, report.outcome)
            if report.outcome != "passed":
                self.outcomes[report.nodeid] = report.outcome


_SIGNATURE = inspect.Signature([
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
    for name, default in (("value", inspect.Parameter.empty),
                          ("value_spatial_shapes", inspect.Parameter.empty),
                          ("value_level_start_index", inspect.Parameter.empty),
                          ("sampling_locations", inspect.Parameter.empty),
                          ("attention_weights", inspect.Parameter.empty),
                          ("im2col_step", 64), ("fp32_grad_accum", None))])


def course_kernels():
    """Every Triton kernel defined in a loaded module of the course's package."""
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "source_kernels" or name.startswith("source_kernels.")):
            continue
        for obj in list(vars(module).values()):
            if hasattr(obj, "run") and callable(getattr(obj, "fn", None)):
                found[id(obj)] = obj
    return list(found.values())


@contextlib.contextmanager
def kernels_refuse_invalid(args, kwargs):
    """While the block runs, make the course's kernels raise if these operator arguments are
    ones ``source_kernels.validate_inputs`` rejects."""
    from source_kernels.validate import validate_inputs

    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        values = bound.arguments
        validate_inputs(values["value"], values["value_spatial_shapes"],
                        values["value_level_start_index"], values["sampling_locations"],
                        values["attention_weights"], values["im2col_step"])
        problem = None
    except (TypeError, ValueError) as exc:
        problem = str(exc)
    if problem is None:
        yield
        return

    def refuse(*_args, **_kwargs):
        raise AssertionError("the operator launched a kernel on arguments that validation must "
                             f"reject ({problem}): check them before any launch")

    kernels = course_kernels()
    for kernel in kernels:
        kernel.run = refuse                      # kernel[grid](...) calls kernel.run
    try:
        yield
    finally:
        for kernel in kernels:
            kernel.__dict__.pop("run", None)


def run(function, autograd_function, *pytest_args, label="your operator", quiet=True):
    """Run tests/test_operator.py in this process with the operator swapped; returns the
    plugin, whose ``outcomes`` maps each test id to 'passed', 'failed' or 'skipped' and whose
    ``package_only`` lists the tests that ran without reaching the operator."""
    plugin = SwapOperator(function, autograd_function, label=label)
    args = [str(TEST_FILE), "-p", "no:cacheprovider", "-m", "not slow", "-rfE", "--tb=line",
            "--color=no", *(["-q", "--no-header"] if quiet else []), *pytest_args]
    plugin.exit_code = pytest.main(args, plugins=[plugin])
    return plugin


# ------------------------------------------------------------------- command-line use (-p)
def _load(spec: str):
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise pytest.UsageError(f"expected MODULE:NAME, got {spec!r}")
    return getattr(importlib.import_module(module_name), attr)


def pytest_addoption(parser):
    group = parser.getgroup("msda operator under test")
    group.addoption("--msda-operator", default=None, metavar="MODULE:NAME",
                    help="function that replaces source_kernels.multi_scale_deformable_attn")
    group.addoption("--msda-function", default=None, metavar="MODULE:NAME",
                    help="autograd Function that replaces "
                         "source_kernels.MultiScaleDeformableAttnFunction")


def pytest_configure(config):
    spec = config.getoption("--msda-operator", default=None)
    if spec is None:
        return
    function_spec = config.getoption("--msda-function") or spec
    sys.path.insert(0, str(Path.cwd()))
    function = _load(spec)
    autograd_function = _load(function_spec)
    config.pluginmanager.register(SwapOperator(function, autograd_function, label=spec),
                                  "msda-swap-operator")
