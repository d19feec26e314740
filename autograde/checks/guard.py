"""Out-of-bounds detection for the Triton kernels a check runs: a read or write outside a
tensor is reported, with the line of the kernel that made it, instead of killing the notebook.

In Triton's CPU interpreter a ``tl.load`` or ``tl.store`` dereferences raw addresses: a lane
past the end of a tensor reads whatever lies there (garbage, a huge number, NaN) or, for a
store, overwrites the allocator's own data and the process dies later (in Jupyter:
``DeadKernelError``; in a script: a segfault or ``free(): invalid pointer``).  The guard runs
the student's kernels so that this cannot happen and says what went wrong.

Two entry points, one report:

``watch()`` -- a context manager; every kernel launched inside it, however deep in the
student's Python wrapper, runs with every memory access checked (interpreter only; compiled
kernels run unchecked)::

    with guard.watch() as report:
        got = vector_add(x, y)                 # the student's wrapper
    report.check("vector_add of 1000 elements (seed 0)", hint="mask = offs < n ...")

``launch(kernel, grid, *args, **kwargs)`` -- one launch of a kernel whose signature the lab
fixes, with every tensor argument copied into the middle of a larger allocation whose
padding holds NaN (floating point) or a sentinel (integers); returns the report, whose
``args`` are the padded copies (read the outputs there).  Under the interpreter the accesses
are checked as in ``watch()``; compiled (on a GPU) a changed sentinel is a write outside and
NaN in an output is a read outside.

What the checked interpreter does (``watch()``, and ``launch()`` under the interpreter):

* a lane whose address lies outside every tensor argument of its launch is not executed (a
  load gives NaN there, a store or atomic is dropped), and the access is recorded as a
  ``Violation``: read/write, the tensor (the kernel's parameter name), the element offset
  relative to the tensor's first element, the program id, the kernel line;
* the masked-off lanes of a ``tl.load`` without ``other=`` are filled with NaN (integers: the
  type's smallest value), because on a GPU their value is undefined; the loads are recorded
  (``report.loads_without_other``) so that a check can name them when NaN reaches an output;
* a float-to-integer cast (``.to(tl.int32)``) of a value that does not fit the integer type
  (inf, huge, NaN) is recorded (``report.casts``): NumPy turns it into -2**31 and warns, a GPU
  gives an undefined value;
* with ``watch(int32=True)``, an int32 ``+ - *`` whose exact result does not fit in 32 bits
  is recorded (``report.overflows``).

Nothing here knows any answer: the guard only watches the student's kernels, so it runs in
the grading kernel as well.  A check calls it the same way there and in the grader's replay
(where the kernel is a stand-in and nothing is launched, so the report is empty).
"""
from __future__ import annotations

import contextlib
import dataclasses
import linecache
import os
import sys
import warnings

import torch

__all__ = ["watch", "launch", "guarded", "Report", "Violation", "Event", "interpreting"]

# Elements of padding on each side of a tensor in ``launch``: more than the typical
# off-by-one (one element, one row, one block of a few hundred lanes) reaches.
PADDING = 4096
INT_SENTINEL = -0x5A5A5A5A           # a value no index or count in the labs holds

_stack = []                          # the open watches, innermost last


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclasses.dataclass
class Violation:
    """One access outside every tensor of a launch (the first lane of it, and how many)."""
    kind: str                # "read", "write" or "atomic"
    tensor: str              # the kernel parameter the address is nearest to
    offset: int              # element offset from that tensor's first element
    numel: int               # elements of that tensor
    lanes: int               # lanes of this access outside every tensor
    program: tuple | None    # (pid 0, pid 1, pid 2), None when compiled
    lane: tuple | None       # index of the first bad lane in the access's block
    line: str | None         # "line 7 of add_kernel: x = tl.load(x_ptr + offs)"
    kernel: str = "?"

    def where(self) -> str:
        beyond = -self.offset if self.offset < 0 else self.offset - self.numel + 1
        if beyond > 16 * max(self.numel, 4096):
            return (f"far outside every tensor argument (element {self.offset} relative to the "
                    f"nearest, {self.tensor}, which has {self.numel} elements)")
        if self.offset < 0:
            return (f"{-self.offset} element(s) before the start of {self.tensor} (element "
                    f"{self.offset})")
        return (f"past the end of {self.tensor} (element {self.offset} of a "
                f"{self.numel}-element tensor)")

    def verb(self) -> str:
        return {"read": "read", "write": "wrote", "atomic": "updated"}[self.kind]

    def describe(self) -> str:
        """'kernel k read past the end of x_ptr (...), 24 lanes, in program (7,), at line 9
        of k: x = tl.load(x_ptr + offs)'."""
        text = f"kernel {self.kernel} {self.verb()} {self.where()}"
        if self.lanes > 1:
            text += f", {self.lanes} lanes"
        if self.program is not None:
            text += f", in program {tuple(int(p) for p in self.program[:_grid_rank(self)])}"
        if self.line:
            text += f", at {self.line}"
        return text

    def short(self) -> str:
        text = f"{self.verb()} {self.where()}"
        if self.line:
            text += f" at {self.line.split(':')[0]}"
        return text


def _grid_rank(v: Violation) -> int:
    rank = 3
    while rank > 1 and v.program[rank - 1] == 0:
        rank -= 1
    return rank


@dataclasses.dataclass
class Event:
    """Something a kernel line did that is worth naming: a cast, an overflow, a load."""
    line: str | None
    count: int
    example: str
    nan_only: bool = False


class Report:
    """What the guard saw.  ``violations``: accesses outside the tensors; ``casts``: out of
    range float-to-int conversions; ``overflows``: int32 wrap-arounds (``watch(int32=True)``);
    ``loads_without_other``: masked loads with no ``other=`` that had lanes masked off;
    ``args``: for ``launch``, the (padded) arguments the kernel ran on."""

    def __init__(self):
        self.violations: list[Violation] = []
        self.casts: dict[str, Event] = {}
        self.overflows: dict[str, Event] = {}
        self.loads_without_other: dict[str, Event] = {}
        self.args = ()
        self.kwargs = {}
        self.launches = 0
        self.poison = frozenset()
        self.poisoned = set()
        self._seen = set()

    def __bool__(self):
        return bool(self.violations)

    @property
    def first(self) -> Violation | None:
        return self.violations[0] if self.violations else None

    def message(self, what: str, hint: str | None = None) -> str | None:
        """``<what>: <first violation>; also <the others>`` and the hint, or None."""
        if not self.violations:
            return None
        text = f"{what}: {self.violations[0].describe()}"
        others = [v.short() for v in self.violations[1:4]]
        if others:
            text += "; also " + "; ".join(others)
        if len(self.violations) > 4:
            text += f"; and {len(self.violations) - 4} more"
        text += (". A read outside a tensor returns garbage and a write outside overwrites "
                 "memory that is not the kernel's (in the interpreter either can crash the "
                 "notebook's kernel): the check ran your kernel with those accesses switched off")
        return text + (f"\nHint: {hint}" if hint else "")

    def check(self, what: str, hint: str | None = None) -> None:
        """Raise AssertionError with :meth:`message` when anything went outside."""
        message = self.message(what, hint)
        if message is not None:
            raise AssertionError(message)

    def unclamped_casts(self) -> list[Event]:
        """Casts of values that are out of range and not merely NaN (inf, huge)."""
        return [e for e in self.casts.values() if not e.nan_only]

    # ------------------------------------------------------------------ recording
    def _violation(self, v: Violation):
        key = (v.kind, v.tensor, v.line)
        if key in self._seen:
            return
        self._seen.add(key)
        self.violations.append(v)

    @staticmethod
    def _event(table, line, count, example, nan_only=False):
        key = line or "?"
        if key in table:
            table[key].count += count
            table[key].nan_only = table[key].nan_only and nan_only
        else:
            table[key] = Event(line, count, example, nan_only)


# ====================================================================== the interpreter hooks
class _Launch:
    """The tensors of one interpreted launch: [(name, lo, hi, itemsize, numel)]."""

    def __init__(self, name, spans):
        self.name = name
        self.spans = spans


def _spans(names, args, kwargs):
    spans = []
    for name, arg in list(zip(names, args)) + list(kwargs.items()):
        tensor = getattr(arg, "base", arg) if not isinstance(arg, torch.Tensor) else arg
        if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0:
            continue
        size = tensor.element_size()
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
        lo = tensor.data_ptr()
        spans.append((str(name), lo, lo + extent * size, size, extent))
    return spans


def _kernel_line():
    """'line N of fn: source' for the innermost frame outside Triton and this module."""
    import triton
    triton_dir = os.path.dirname(triton.__file__)
    here = os.path.abspath(__file__)
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(triton_dir) and os.path.abspath(filename) != here \
                and "numpy" not in filename:
            text = linecache.getline(filename, frame.f_lineno).strip()
            return f"line {frame.f_lineno} of {frame.f_code.co_name}: {text}" if text else \
                f"line {frame.f_lineno} of {frame.f_code.co_name}"
        frame = frame.f_back
    return None


def _outside(ptrs, active, spans):
    """Boolean array: lanes of ``ptrs`` that are active and inside no span."""
    import numpy as np
    ptrs = np.asarray(ptrs, dtype=np.uint64)
    bad = np.asarray(active, dtype=bool).copy() if active is not None else \
        np.ones(ptrs.shape, dtype=bool)
    bad = np.broadcast_to(bad, ptrs.shape).copy()
    for _, lo, hi, size, _ in spans:
        inside = (ptrs >= np.uint64(lo)) & (ptrs + np.uint64(size) <= np.uint64(hi))
        bad &= ~inside
    return bad


def _nearest(addr, spans):
    """(name, element offset, numel) of the span ``addr`` is nearest to."""
    best = None
    for name, lo, hi, size, numel in spans:
        if addr < lo:
            distance = lo - addr
        elif addr >= hi:
            distance = addr - hi + size
        else:
            distance = 0
        if best is None or distance < best[0]:
            best = (distance, name, (addr - lo) // size, numel)
    if best is None:
        return "no tensor", int(addr), 0
    return best[1], int(best[2]), int(best[3])


class _Hooks:
    """Instance attributes on Triton's interpreter builder, removed on exit."""

    def __init__(self):
        from source_kernels.triton_compat import grid_executor_arguments, interpreter, np_dtype
        interp = interpreter()
        self.interp = interp
        self.np_dtype = np_dtype
        self.executor_arguments = grid_executor_arguments
        self.builder = interp.interpreter_builder
        self.current: _Launch | None = None
        self.undo = []

    # -------------------------------------------------------------- install / remove
    def install(self):
        builder = self.builder
        executor, init_name = self.executor_arguments()
        original_init = executor.__dict__[init_name]
        hooks = self

        def init_args(executor_self, args_dev, kwargs):
            args_hst, kwargs_hst = original_init(executor_self, args_dev, kwargs)
            names = list(executor_self.arg_names)
            hooks.current = _Launch(getattr(executor_self.fn, "__name__", "?"),
                                    _spans(names, args_hst, kwargs_hst))
            for report in _stack:
                report.launches += 1
                if report.poison:
                    _fill_outputs(report, list(zip(names, args_hst)) + list(kwargs_hst.items()))
            return args_hst, kwargs_hst
        setattr(executor, init_name, init_args)
        self.undo.append(lambda: setattr(executor, init_name, original_init))

        for name, make in (("create_masked_load", self._load), ("create_masked_store", self._store),
                           ("create_atomic_rmw", self._atomic_rmw),
                           ("create_atomic_cas", self._atomic_cas),
                           ("create_fp_to_si", self._cast), ("create_fp_to_ui", self._cast)):
            original = getattr(builder, name, None)
            if original is None:
                continue
            setattr(builder, name, make(original))
            self.undo.append(lambda name=name: builder.__dict__.pop(name, None))
        import numpy as np
        for name, op in (("create_add", np.add), ("create_sub", np.subtract),
                         ("create_mul", np.multiply)):
            original = getattr(builder, name, None)
            if original is None:
                continue
            setattr(builder, name, self._int_op(original, op, name[7:]))
            self.undo.append(lambda name=name: builder.__dict__.pop(name, None))

    def remove(self):
        for restore in reversed(self.undo):
            restore()
        self.undo = []

    # -------------------------------------------------------------- helpers
    def _program(self):
        idx = getattr(self.builder, "grid_idx", None)
        return tuple(int(i) for i in idx) if idx is not None else None

    def _check(self, kind, ptrs, mask):
        """The mask with the lanes outside every tensor switched off (recorded)."""
        import numpy as np
        launch = self.current
        if launch is None or not launch.spans:
            return mask
        data = np.asarray(ptrs.data)
        active = np.ones(data.shape, dtype=bool) if mask is None else \
            np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
        bad = _outside(data, active, launch.spans)
        if not bad.any():
            return mask
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        tensor, offset, numel = _nearest(int(data[first]), launch.spans)
        violation = Violation(kind, tensor, offset, numel, int(bad.sum()), self._program(),
                              first, _kernel_line(), launch.name)
        for report in _stack:
            report._violation(violation)
        return type(mask)(active & ~bad, mask.dtype) if mask is not None else None

    # -------------------------------------------------------------- memory
    def _load(self, original):
        hooks = self

        def load(ptrs, mask, other, *rest):
            import numpy as np
            interp = hooks.interp
            checked = hooks._check("read", ptrs, mask)
            dtype_np = hooks.np_dtype(ptrs.get_element_ty())
            if other is None and mask is not None and not np.all(mask.data):
                fill = _poison(ptrs.get_element_ty(), dtype_np)
                other = interp.TensorHandle(np.full(np.shape(ptrs.data), fill, dtype=dtype_np),
                                            ptrs.get_element_ty())
                masked = int(np.size(mask.data) - np.count_nonzero(mask.data))
                for report in _stack:
                    Report._event(report.loads_without_other, _kernel_line(), masked,
                                  "masked lanes without other=")
            if checked is not mask:
                nan = _poison(ptrs.get_element_ty(), dtype_np)
                if other is None:
                    other = interp.TensorHandle(np.full(np.shape(ptrs.data), nan, dtype=dtype_np),
                                                ptrs.get_element_ty())
                else:                       # the lanes outside read as NaN (garbage)
                    filled = np.array(np.broadcast_to(other.data, np.shape(ptrs.data)),
                                      dtype=dtype_np)
                    outside = np.asarray(mask.data, dtype=bool) & ~np.asarray(checked.data)
                    filled[outside] = nan
                    other = interp.TensorHandle(filled, other.dtype)
            return original(ptrs, checked, other, *rest)
        return load

    def _store(self, original):
        hooks = self

        def store(ptrs, value, mask, *rest):
            return original(ptrs, value, hooks._check("write", ptrs, mask), *rest)
        return store

    def _atomic_rmw(self, original):
        hooks = self

        def atomic_rmw(op, ptr, val, mask, *rest):
            return original(op, ptr, val, hooks._check("atomic", ptr, mask), *rest)
        return atomic_rmw

    def _atomic_cas(self, original):
        hooks = self

        def atomic_cas(ptr, cmp, val, *rest):
            import numpy as np
            launch = hooks.current
            if launch is not None and launch.spans:
                data = np.asarray(ptr.data)
                bad = _outside(data, None, launch.spans)
                if bad.any():
                    hooks._check("atomic", ptr, None)
                    # send the lanes outside to a scratch buffer of their own
                    dtype = np.asarray(cmp.data).dtype
                    scratch = np.zeros(data.shape, dtype=dtype)
                    hooks.scratch = scratch             # kept alive for the call
                    redirected = np.where(bad, scratch.ctypes.data + dtype.itemsize
                                          * np.arange(data.size, dtype=np.uint64).reshape(
                                              data.shape), data).astype(np.uint64)
                    ptr = hooks.interp.TensorHandle(redirected, ptr.dtype)
            return original(ptr, cmp, val, *rest)
        return atomic_cas

    # -------------------------------------------------------------- arithmetic
    def _cast(self, original):
        hooks = self

        def cast(src, dst_type):
            import numpy as np
            data = np.asarray(src.data)
            try:
                info = np.iinfo(hooks.np_dtype(dst_type))
            except (ValueError, KeyError, TypeError):
                info = None
            if info is not None and data.dtype.kind == "f":
                with np.errstate(invalid="ignore"):
                    wide = data.astype(np.float64)
                    bad = ~np.isfinite(wide) | (wide < info.min) | (wide >= float(info.max) + 1)
                if bad.any():
                    values = wide[bad]
                    example = ", ".join(f"{v:g}" for v in np.unique(values)[:3])
                    nan_only = bool(np.isnan(values).all())
                    line = _kernel_line()
                    for report in _stack:
                        Report._event(report.casts, line, int(bad.sum()), example, nan_only)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                with np.errstate(invalid="ignore", over="ignore"):
                    return original(src, dst_type)
        return cast

    def _int_op(self, original, op, name):
        def int_op(lhs, rhs):
            import numpy as np
            out = original(lhs, rhs)
            if not any(getattr(report, "int32", False) for report in _stack):
                return out
            a, b = np.asarray(lhs.data), np.asarray(rhs.data)
            if a.dtype == np.int32 and b.dtype == np.int32:
                exact = op(a.astype(np.int64), b.astype(np.int64))
                wrapped = exact != np.asarray(out.data).astype(np.int64)
                if np.any(wrapped):
                    i = tuple(np.argwhere(np.broadcast_to(wrapped, exact.shape))[0])
                    ai = np.broadcast_to(a, exact.shape)[i]
                    bi = np.broadcast_to(b, exact.shape)[i]
                    symbol = {"add": "+", "sub": "-", "mul": "*"}[name]
                    example = (f"{int(ai)} {symbol} {int(bi)} = {int(exact[i])} does not fit in "
                               f"int32 (got {int(np.asarray(out.data).astype(np.int64)[i] if np.ndim(out.data) else out.data)})")
                    line = _kernel_line()
                    for report in _stack:
                        if getattr(report, "int32", False):
                            Report._event(report.overflows, line,
                                          int(np.count_nonzero(wrapped)), example)
            return out
        return int_op


def _fill_outputs(report, named):
    """Fill the tensors passed as the parameters ``report.poison`` with NaN, the first time
    each is launched on inside the watch: an element that still holds NaN afterwards was
    never written (a later launch on the same tensor keeps what the earlier one wrote)."""
    for name, arg in named:
        if str(name) not in report.poison or not isinstance(arg, torch.Tensor):
            continue
        if not arg.is_floating_point() or arg.numel() == 0:
            continue
        key = arg.untyped_storage().data_ptr()
        if key in report.poisoned:
            continue
        report.poisoned.add(key)
        with torch.no_grad():
            arg.fill_(float("nan"))


def _poison(tl_dtype, dtype_np):
    """What masked-off or outside lanes read: NaN (floats, bf16 as its bits), else the
    integer type's smallest value."""
    import numpy as np
    name = str(tl_dtype)
    if name == "bf16":
        return np.uint16(0x7FC0)                    # bf16 NaN, stored as its bits
    if np.dtype(dtype_np).kind == "f":
        return np.nan
    if np.dtype(dtype_np).kind in "iu":
        return np.iinfo(dtype_np).min
    return 0


_hooks: _Hooks | None = None


@contextlib.contextmanager
def watch(int32: bool = False, poison=()):
    """Check every memory access of every kernel launched inside the block (interpreter
    only); yields a :class:`Report`.  ``int32``: also record int32 arithmetic that wraps.
    ``poison``: names of kernel parameters (``"out_ptr"``) whose floating-point tensors are
    filled with NaN before the first launch that gets them, so that an element nobody wrote
    reads NaN deterministically (not whatever ``torch.empty`` left there)."""
    global _hooks
    report = Report()
    report.int32 = int32
    report.poison = frozenset(poison)
    if not interpreting():
        yield report
        return
    installed = None
    if _hooks is None:
        try:
            installed = _Hooks()
            installed.install()
        except (ImportError, AttributeError):     # an interpreter this guard does not know
            if installed is not None:
                installed.remove()
            yield report
            return
        _hooks = installed
    _stack.append(report)
    import numpy as np
    try:
        # the interpreter's NumPy warnings (inf - inf, casts of NaN) would only repeat, on
        # stderr, what the report records
        with warnings.catch_warnings(), np.errstate(invalid="ignore", over="ignore",
                                                    divide="ignore"):
            warnings.filterwarnings("ignore", category=RuntimeWarning)
            yield report
    finally:
        _stack.remove(report)
        if installed is not None:
            installed.remove()
            _hooks = None


# ====================================================================== demo cells
def _innermost(exc) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def guarded(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run as the checks run a student's code, for the cells that show
    it at work (beside the spec, in a figure, timed): every kernel access is watched (under
    the interpreter an access outside a tensor is switched off and reported instead of
    crashing the notebook), the outputs ``out_ptr`` / ``dst_ptr`` start as NaN, and an
    exception is reported in one line.  Returns the result, or None when ``fn`` raised."""
    name = getattr(fn, "__name__", "your function")
    try:
        with watch(poison=("out_ptr", "dst_ptr")) as report:
            result = fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except Exception as exc:                                         # noqa: BLE001
        print(f"{name} raised {type(exc).__name__}: {_innermost(exc)}\n(the check cell of "
              "this step says what that means; this cell shows nothing until it passes)")
        return None
    message = report.message(name)
    if message is not None:
        print(message + "\n(the numbers below come from that run; the check cell of this "
              "step names the corner and the mask)")
    return result


# ====================================================================== padded launches
def _padded(tensor):
    """(view inside a padded allocation, the allocation, sentinel)."""
    numel = tensor.numel()
    if tensor.is_floating_point():
        sentinel = float("nan")
    else:
        sentinel = INT_SENTINEL if tensor.dtype not in (torch.bool, torch.uint8, torch.int8,
                                                        torch.int16) else 0
    base = torch.full((numel + 2 * PADDING,), sentinel, dtype=tensor.dtype, device=tensor.device)
    view = base[PADDING:PADDING + numel].view(tensor.shape)
    view.copy_(tensor)
    return view, base, sentinel


def _changed(region, sentinel):
    if isinstance(sentinel, float):
        return ~torch.isnan(region)
    return region != sentinel


def launch(kernel, grid, *args, int32: bool = False, **kwargs) -> Report:
    """Launch ``kernel[grid](*args, **kwargs)`` with each contiguous tensor argument copied
    into the middle of a padded allocation; returns the :class:`Report` (its ``args`` and
    ``kwargs`` hold the padded copies, which the kernel read and wrote).  Interpreted, every
    access is checked; compiled, a padding element that changed is reported as a write
    outside."""
    padded_args, allocations = [], []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_contiguous() and a.numel():
            view, base, sentinel = _padded(a)
            allocations.append((len(padded_args), None, base, sentinel, a.numel()))
            padded_args.append(view)
        else:
            padded_args.append(a)
    padded_kwargs = {}
    for k, a in kwargs.items():
        if isinstance(a, torch.Tensor) and a.is_contiguous() and a.numel():
            view, base, sentinel = _padded(a)
            allocations.append((None, k, base, sentinel, a.numel()))
            padded_kwargs[k] = view
        else:
            padded_kwargs[k] = a
    with watch(int32=int32) as report:
        kernel[grid](*padded_args, **padded_kwargs)
    report.args, report.kwargs = tuple(padded_args), padded_kwargs
    names = _parameter_names(kernel)
    for position, key, base, sentinel, numel in allocations:
        name = key if key is not None else (names[position] if position < len(names)
                                            else f"argument {position}")
        for side, region, start in (("before", base[:PADDING], -PADDING),
                                    ("after", base[PADDING + numel:], numel)):
            changed = _changed(region, sentinel)
            if bool(changed.any()):
                index = int(changed.nonzero()[0 if side == "after" else -1])
                report._violation(Violation("write", name, start + index, numel,
                                            int(changed.sum()), None, None, None,
                                            names and _kernel_name(kernel) or "?"))
    return report


def _kernel_name(kernel):
    fn = getattr(kernel, "fn", None)
    import inspect
    return fn.__name__ if inspect.isfunction(fn) else "?"


def _parameter_names(kernel):
    """The kernel's parameter names ([] for anything that is not a Triton kernel, such as
    the grader's stand-in while it replays a check)."""
    import inspect
    names = getattr(kernel, "arg_names", None)
    if isinstance(names, (list, tuple)):
        return list(names)
    fn = getattr(kernel, "fn", None)
    if inspect.isfunction(fn):
        return list(inspect.signature(fn).parameters)
    return []
