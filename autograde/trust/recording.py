"""Record a hidden check in the grading kernel; replay it in the grader, out of the kernel's reach.

Student code runs in the same Python process as the hidden checks, so it can replace
``torch.allclose``, the comparison helpers, the reference, or the check itself.  No verdict
reached inside that process can be trusted.  This module moves the verdict out:

In the grading kernel (``install_in_kernel``, run by the sandbox before any cell):

- ``next_seed()`` hands every hidden check's ``fresh_generator()`` a seed derived from a
  per-run secret the grader chose (``AUTOGRADE_SEED``) and a counter, and notes the counter;
- ``session(functions)`` (entered by ``common.forbid_references``) records every call of the
  student's functions made inside it: the value returned or the exception raised, what the
  call wrote into the output buffers the check declared (``writes``: a Triton kernel's
  outputs), the inputs it wrote into (by name only: such a call fails), and the Triton
  kernels it launched.  A Python function runs on private copies of its tensor arguments, so
  nothing it does to them reaches the check's own;
- after each cell, the notes go out as one display output of type :data:`MIME`.

In the grader (``replay_check``): the grader imports the same check module from the course
(not from the submission), builds the inputs from *its own* copy of the seed, and runs the
check again, with the student's function replaced by a stand-in that returns what the kernel
recorded.  The check's own comparisons then run on the grader's expected values: a kernel that
cheated its in-kernel comparison is caught, a kernel that sent invented records needs the
right outputs for inputs it could not choose, and a kernel that sent nothing fails.  The
replay copies a recorded write only into an output the check declared; a recorded change of
any other argument fails the call (``InputChanged``), so the grader's expectation is always
computed from its own untouched inputs.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import types

from . import codec

__all__ = ["MIME", "install_in_kernel", "next_seed", "session", "recording", "replaying",
           "replay_launches", "watch_kernel_launches", "derive_seed", "replay_check", "ReplayContext", "ReplayError",
           "Proxy", "unused_calls", "InputChanged", "private_copy"]

MIME = "application/vnd.msda-autograde.record+json"
RECORD_VERSION = 1
MAX_RECORD_BYTES = 32 * 2 ** 20

_mode = None            # None | "record" | "replay"
_base_seed = ""         # the kernel's copy of the per-run secret
_counter = 0            # fresh_generator() calls so far in this kernel
_events = []            # notes of the current cell
_sessions = []          # open sessions (stack)
_session_ids = 0
_depth = 0              # >0 while inside a recorded call
_launches = [0, []]     # kernel launches seen inside recorded calls: count, names
_replay = None          # the ReplayContext while the grader replays


def recording() -> bool:
    return _mode == "record"


def replaying() -> bool:
    return _mode == "replay"


def note_verdict_here() -> None:
    """A check asks whether it judges (``checks.common.judging``): in the grading kernel it
    does not, so its comparisons run only here, in the grader's replay.  A failure of such a
    replay is the student's wrong answer, not a kernel whose pass the grader contradicts."""
    if _mode == "replay" and _replay is not None:
        _replay.judged_only_here = True


def derive_seed(base: str, k: int) -> int:
    """The k-th hidden-check seed of a grading run: 31 bits of sha256(base:k)."""
    digest = hashlib.sha256(f"{base}:{int(k)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2 ** 31 - 1)


_PLUMBING = ("contextlib", __name__, "autograde.checks.common")


def _caller_module() -> str:
    """The module of the first caller that is not this plumbing (the check module)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "?")
        if name not in _PLUMBING:
            return name
        frame = frame.f_back
    return "?"


# ------------------------------------------------------------------ in the grading kernel
def install_in_kernel(seed: str | None = None) -> None:
    """Switch recording on (the grader's sandbox runs this before the first cell)."""
    global _mode, _base_seed
    seed = seed if seed is not None else os.environ.get("AUTOGRADE_SEED", "")
    if not seed:
        return
    _mode, _base_seed = "record", seed
    try:
        ip = get_ipython()
    except NameError:
        ip = None
    if ip is not None:
        ip.events.register("post_run_cell", _flush)


def _flush(*_args):
    """Send this cell's notes to the grader as one display output, then forget them."""
    global _events
    events, _events = _events, []
    if not events:
        return
    record = {"v": RECORD_VERSION, "events": events}
    if codec.encoded_size(record) > MAX_RECORD_BYTES:
        record = {"v": RECORD_VERSION, "overflow": True}
    from IPython.display import display
    display({MIME: record}, raw=True)


def next_seed(module: str | None = None):
    """The seed for an unseeded ``fresh_generator()``: the grader's while grading, else None."""
    global _counter
    module = module or _caller_module()
    if _mode == "record":
        k = _counter
        _counter += 1
        _events.append({"e": "seed", "k": k, "m": module})
        return derive_seed(_base_seed, k)
    if _mode == "replay":
        return _replay.next_seed(module)
    return None


@contextlib.contextmanager
def session(functions, module: str | None = None, allow=(), writes=(), share_inputs=False):
    """Record (in the kernel) or bind (in the replay) the student's functions; yields True
    while replaying, so that the caller skips its in-kernel work.  ``allow``: modules the
    check lets these functions use (the grader's static scan then allows them too).

    ``writes``: the arguments (positions, keyword names) that are the functions' outputs, the
    buffers a Triton kernel stores into; every other tensor argument is an input, which a
    call must leave as it was.  A Python function gets private copies of its tensor
    arguments (``share_inputs``: the originals, for a check that changes an input between
    two calls on purpose, as lab 10 does between forward and backward).  A call that
    changed an input fails as that mistake, in the kernel and in the replay, and the replay
    never copies what the kernel left in an input into the grader's tensors."""
    module = module or _caller_module()
    writes = tuple(writes)
    if _mode == "record":
        with _record_session(functions, module, writes, share_inputs):
            yield False
    elif _mode == "replay":
        _replay.allowed.update(str(a) for a in allow)
        with _replay.session(functions, module, writes):
            yield True
    else:
        yield False


@contextlib.contextmanager
def replay_launches(counter):
    """While replaying, ``count_kernel_launches`` counts the launches the kernel recorded."""
    _replay.counters.append(counter)
    try:
        yield counter
    finally:
        _replay.counters.remove(counter)


_session_options = {}    # sid -> (writes, share_inputs)


def _record_session(functions, module, writes=(), share_inputs=False):
    global _session_ids
    sid = _session_ids
    _session_ids += 1
    _session_options[sid] = (frozenset(writes), bool(share_inputs))
    names = [str(getattr(f, "__name__", type(f).__name__))[:100] for f in functions]
    _events.append({"e": "open", "s": sid, "n": len(functions), "names": names, "m": module})
    undo = []
    for slot, fn in enumerate(functions):
        try:
            undo.append(_install(fn, sid, slot))
        except Exception:  # noqa: BLE001  (not recordable: the replay will say so)
            _events.append({"e": "unrecordable", "s": sid, "slot": slot})
    if not _sessions:
        undo.append(_count_launches())
    _sessions.append(sid)
    return _SessionGuard(sid, undo)


class _SessionGuard:
    def __init__(self, sid, undo):
        self.sid, self.undo = sid, undo

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for restore in reversed(self.undo):
            try:
                restore()
            except Exception:  # noqa: BLE001  (undo what can be undone)
                pass
        if self.sid in _sessions:
            _sessions.remove(self.sid)
        _session_options.pop(self.sid, None)
        _events.append({"e": "close", "s": self.sid})
        return False


_HOOK = "__autograde_recorded_call__"


def _trampoline(n_freevars: int, key: int) -> types.CodeType:
    """A code object that calls the recorder, with as many free variables as the student's
    function has closure cells (they are carried, never read)."""
    names = [f"_autograde_free_{i}" for i in range(n_freevars)]
    lines = ["def _outer():"]
    lines += [f"    {n} = None" for n in names]
    lines += ["    def _t(*_autograde_args, **_autograde_kwargs):"]
    if names:
        lines += [f"        lambda: ({', '.join(names)},)"]
    lines += [f"        return {_HOOK}({key}, _autograde_args, _autograde_kwargs)",
              "    return _t"]
    namespace = {}
    exec("\n".join(lines), namespace)  # noqa: S102  (our own text: the recording hook)
    return namespace["_outer"]().__code__


_calls = {}     # key -> (sid, slot, original callable)


def _install(fn, sid, slot):
    """Make calls of ``fn`` go through the recorder; returns the undo function."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    key = len(_calls) + 1
    if isinstance(fn, types.FunctionType):
        original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                                      fn.__closure__)
        original.__kwdefaults__ = fn.__kwdefaults__
        original.__dict__.update(fn.__dict__)
        _calls[key] = (sid, slot, original, _parameter_names(fn), False, _display_name(fn))
        old_code = fn.__code__
        globals_ = fn.__globals__
        had_hook = _HOOK in globals_
        globals_[_HOOK] = _recorded_call
        fn.__code__ = _trampoline(len(fn.__closure__ or ()), key)

        def undo():
            fn.__code__ = old_code
            if not had_hook:
                globals_.pop(_HOOK, None)
            _calls.pop(key, None)
        return undo
    if hasattr(fn, "run") and callable(getattr(fn, "fn", None)):      # a Triton kernel
        original_run = fn.run
        _calls[key] = (sid, slot, original_run, _parameter_names(fn), True, _display_name(fn))

        def run(*args, **kwargs):
            return _recorded_call(key, args, kwargs)
        fn.run = run

        def undo():
            fn.__dict__.pop("run", None)
            _calls.pop(key, None)
        return undo
    raise TypeError(f"cannot record calls of a {type(fn).__name__}")


def _tensor_args(args, kwargs):
    """The tensors among the arguments themselves: (position or keyword, tensor)."""
    import torch
    found = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            found.append((i, a))
    for k, a in kwargs.items():
        if isinstance(a, torch.Tensor):
            found.append((k, a))
    return found


_NEST_DEPTH = 4                 # containers inside containers that are looked into
_NEST_ITEMS = 4096              # items looked at per argument


def _is_namedtuple(value):
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _nested(value, depth=0, budget=None):
    """(path, tensor) for every tensor held in ``value``'s lists, tuples (named tuples too)
    and dicts, down to a few levels; a path is the keys from ``value`` to the tensor."""
    import torch
    budget = [_NEST_ITEMS] if budget is None else budget
    found = []
    if depth >= _NEST_DEPTH or budget[0] <= 0:
        return found
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        return found
    for key, item in items:
        budget[0] -= 1
        if budget[0] < 0:
            break
        if isinstance(item, torch.Tensor):
            found.append(((key,), item))
        else:
            found.extend(((key,) + path, t) for path, t in _nested(item, depth + 1, budget))
    return found


def _with_copies(value, watched, top, depth=0, path=()):
    """``value`` with every tensor nested in its lists, tuples and dicts replaced by a private
    copy (the containers are new ones of the same kind); each pair goes into ``watched``."""
    import torch
    if isinstance(value, torch.Tensor):
        copy = private_copy(value)
        watched.append(((top,) + path if path else top, value, copy, None))
        return copy
    if depth >= _NEST_DEPTH:
        return value
    if isinstance(value, dict) and type(value) in (dict,) + _dict_kinds():
        out = type(value)() if type(value) is not dict else {}
        for key, item in value.items():
            out[key] = _with_copies(item, watched, top, depth + 1, path + (key,))
        return out
    if isinstance(value, list) and type(value) is list:
        return [_with_copies(item, watched, top, depth + 1, path + (i,))
                for i, item in enumerate(value)]
    if _is_namedtuple(value):
        return type(value)(*[_with_copies(item, watched, top, depth + 1, path + (i,))
                             for i, item in enumerate(value)])
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_with_copies(item, watched, top, depth + 1, path + (i,))
                     for i, item in enumerate(value))
    return value


def _dict_kinds():
    import collections
    return (collections.OrderedDict,)


def _watched_inputs(args, kwargs):
    """(where, tensor) for the tensors among the arguments and those nested in them; a nested
    one's ``where`` is a tuple: the argument, then the keys down to it."""
    import torch
    found = []
    for where, a in list(enumerate(args)) + list(kwargs.items()):
        if isinstance(a, torch.Tensor):
            found.append((where, a))
        else:
            found.extend(((where,) + path, t) for path, t in _nested(a))
    return found


def nested_name(base, path) -> str:
    """How a message names a tensor nested in argument ``base`` at ``path`` (a list of keys:
    ``values[1]``, ``inputs['weights']``); a key that is neither a small integer nor a short
    identifier is shown as ``[...]``, so a record cannot put text of its own in the message."""
    import keyword
    out = base
    for key in list(path)[:_NEST_DEPTH] if isinstance(path, (list, tuple)) else []:
        if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < 10 ** 6:
            out += f"[{key}]"
        elif isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key) \
                and key.isascii() and len(key) <= 32:
            out += f"['{key}']"
        else:
            out += "[...]"
    return out


def _changed(before, after) -> bool:
    import torch
    if before.shape != after.shape or before.dtype != after.dtype:
        return True
    if before.is_floating_point() or before.is_complex():
        return not torch.equal(torch.nan_to_num(before), torch.nan_to_num(after)) or \
            not torch.equal(torch.isnan(before), torch.isnan(after))
    return not torch.equal(before, after)


def _parameter_names(fn):
    """The parameter names of a function or Triton kernel ([] when they cannot be read)."""
    import inspect
    names = getattr(fn, "arg_names", None)
    if isinstance(names, (list, tuple)):
        return [str(n) for n in names]
    target = getattr(fn, "fn", fn)
    try:
        return list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return []


def argument_name(where, names) -> str:
    """How a message names argument ``where`` (a position or a keyword): the parameter's
    name when it is a plain identifier, else its position."""
    import keyword
    name = where if isinstance(where, str) else (
        names[where] if isinstance(where, int) and 0 <= where < len(names) else None)
    if isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) \
            and len(name) <= 64:
        return name
    return f"argument {where + 1}" if isinstance(where, int) else "a keyword argument"


def wrote_into_message(function, argument, kernel) -> str:
    """The mistake of a graded function (or the check's kernel around a helper of the
    student's) that changed one of its inputs."""
    return (f"{function}: your code wrote into {argument}, one of its inputs; the check "
            "computes what it expects from its own copy of the inputs, so a call that changes "
            "them cannot pass: leave every input as it is and "
            + ("store only into the output" if kernel else "return a new tensor"))


class InputChanged(AssertionError):
    """A graded function wrote into one of the tensors it was given to read."""


def private_copy(t):
    """A copy of tensor ``t`` with its own storage and the same shape, strides, dtype, device
    and ``requires_grad`` (a leaf): what a student's function may do with it reaches nothing
    of the check's."""
    import torch
    source = t.detach()
    try:
        copy = torch.empty_strided(source.size(), source.stride(), dtype=source.dtype,
                                   device=source.device)
        copy.copy_(source)
    except RuntimeError:                           # overlapping strides (expand): plain clone
        copy = source.clone()
    if t.requires_grad and (copy.is_floating_point() or copy.is_complex()):
        copy.requires_grad_(True)
    return copy


def _recorded_call(key, args, kwargs):
    """What a student's function does while recorded: run, then note what happened.

    A Python function runs on private copies of its tensor arguments (unless the session
    shares them); a Triton kernel on the check's own buffers, whose inputs are restored from
    a snapshot when it wrote into them.  A write into an input is noted by name only (the
    replay fails the call on it), a write into an output (``writes``) with its value."""
    global _depth
    sid, slot, original, names, is_kernel, display = _calls[key]
    if _depth > 0:                                 # an inner call: only the outermost counts
        return original(*args, **kwargs)
    writes, share = _session_options.get(sid, (frozenset(), False))
    private = not is_kernel and not share
    watched = []                                   # (where, check's tensor, tensor passed, snapshot)
    if private:
        # every tensor the function is handed, also inside lists, tuples and dicts, is a
        # private copy; the containers are new ones, so nothing of the check's is reachable
        args = tuple(_with_copies(a, watched, i) for i, a in enumerate(args))
        kwargs = {k: _with_copies(a, watched, k) for k, a in kwargs.items()}
    else:
        watched = [(where, t, t, t.detach().clone())
                   for where, t in _watched_inputs(args, kwargs)]
    launches_before = (_launches[0], len(_launches[1]))
    _depth += 1
    note = {"e": "call", "s": sid, "slot": slot}
    wrote = []
    try:
        result = original(*args, **kwargs)
    except Exception as exc:
        note["exc"] = {"type": type(exc).__name__,
                       "mro": [c.__name__ for c in type(exc).__mro__][:12],
                       "msg": str(exc)[:2000]}
        raise
    else:
        note["result"] = codec.encode(result)
    finally:
        _depth -= 1
        mutated = []
        import torch
        for where, theirs, passed, snapshot in watched:
            before = theirs.detach() if snapshot is None else snapshot
            try:
                changed = _changed(before, passed.detach())
            except Exception:                      # noqa: BLE001
                changed = True
            if not changed:
                continue
            if not isinstance(where, tuple) and where in writes:
                try:
                    mutated.append([where, codec.encode(passed.detach())])
                except Exception:                  # noqa: BLE001
                    mutated.append([where, {"$t": "opaque", "type": "unreadable tensor"}])
                if passed is not theirs:
                    with torch.no_grad():
                        theirs.copy_(passed.detach())
                continue
            if isinstance(where, tuple):           # a tensor nested in an argument
                top, path = where[0], list(where[1:])
                wrote.append([top, argument_name(top, names), _plain_keys(path)])
            else:
                wrote.append([where, argument_name(where, names)])
            if snapshot is not None:               # the check's own tensor: put it back
                try:
                    with torch.no_grad():
                        theirs.copy_(snapshot)
                except Exception:                  # noqa: BLE001
                    pass
        note["mut"] = mutated
        if wrote:
            note["wrote"] = wrote
            note["kernel"] = is_kernel
        note["launches"] = _launches[0] - launches_before[0]
        note["kernels"] = _launches[1][launches_before[1]:][:50]
        _events.append(note)
    if wrote:
        first = wrote[0]
        shown = nested_name(first[1], first[2]) if len(first) > 2 else first[1]
        raise InputChanged(wrote_into_message(display, shown, is_kernel))
    return result


def _plain_keys(path):
    """A nested tensor's keys as a record carries them (JSON: ints and short strings)."""
    out = []
    for key in path:
        if isinstance(key, int) and not isinstance(key, bool):
            out.append(key)
        elif isinstance(key, str):
            out.append(key[:64])
        else:
            out.append(None)
    return out


def _display_name(fn):
    """A function's or kernel's name as a message shows it (an identifier, else "?")."""
    name = getattr(getattr(fn, "fn", fn), "__name__", "?")
    return name if isinstance(name, str) and name.isidentifier() and len(name) <= 64 else "?"


def watch_kernel_launches(on_launch):
    """Call ``on_launch(kernel_name)`` for every Triton launch (``kernel[grid](...)``,
    compiled or interpreted; warm-up compilations excluded) until the returned ``undo()``."""
    from ..compat.triton_compat import launch_classes
    classes = launch_classes()
    originals = []
    for cls in classes:
        original = cls.__dict__.get("run")
        if original is None:
            continue

        def run(self, *args, __original=original, **kwargs):
            if not kwargs.get("warmup", False):
                on_launch(getattr(getattr(self, "fn", None), "__name__", "?"))
            return __original(self, *args, **kwargs)
        cls.run = run
        originals.append((cls, original))

    def undo():
        for cls, original in originals:
            cls.run = original
    return undo


def _count_launches():
    """Count Triton launches made inside recorded calls (compiled or interpreted)."""
    def seen(name):
        if _depth > 0:
            _launches[0] += 1
            _launches[1].append(name)
    return watch_kernel_launches(seen)


# ------------------------------------------------------------------ in the grader
class ReplayError(Exception):
    """The record cannot be replayed (missing, out of order, or malformed)."""


class Proxy:
    """Stands in for a student's function (or class) during a replay."""

    def __init__(self, context, name, parent=None):
        self._ctx = context
        self.__name__ = self.__qualname__ = name
        self._parent = parent
        self._children = {}

    def _child(self, name):
        if name not in self._children:
            self._children[name] = Proxy(self._ctx, name, parent=self)
        return self._children[name]

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._child(name)

    def __call__(self, *args, **kwargs):
        if self._ctx.bound(self):
            return self._ctx.replay_call(self, args, kwargs)
        if self._parent is None:                   # a class being instantiated
            return _Instance(self)
        if self._parent is not None and self._ctx.bound_any_child(self._parent):
            raise ReplayError(f"{self.__name__} was called outside a recorded block")
        return None

    def __getitem__(self, grid):                  # kernel[grid](...)
        def launch(*args, **kwargs):
            return self(*args, **kwargs)
        return launch

    def __repr__(self):
        return f"<recorded {self.__name__}>"


class _Instance:
    """An instance of a replayed class: calling it replays ``forward``; other methods replay
    when the check bound them, else they are no-ops returning the instance (``.double()``)."""

    def __init__(self, cls_proxy):
        self._cls = cls_proxy

    def __call__(self, *args, **kwargs):
        return self._cls._child("forward")(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = self._cls._child(name)
        ctx = self._cls._ctx

        def method(*args, **kwargs):
            if ctx.bound(child):
                return ctx.replay_call(child, args, kwargs)
            return self
        return method


class ReplayContext:
    def __init__(self, events, base_seed, device_map=None):
        if not isinstance(events, list):
            raise ReplayError("malformed record")
        self.base_seed = base_seed
        self.device_map = device_map
        self.seeds = {}
        self.opens = {}
        self.calls = []
        self.unrecordable = set()
        for ev in events:
            if not isinstance(ev, dict):
                raise ReplayError("malformed record")
            kind = ev.get("e")
            if kind == "seed":
                self.seeds.setdefault(str(ev.get("m")), []).append(_int(ev.get("k")))
            elif kind == "open":
                self.opens.setdefault(str(ev.get("m")), []).append(ev)
            elif kind == "call":
                self.calls.append(ev)
            elif kind == "unrecordable":
                self.unrecordable.add((ev.get("s"), ev.get("slot")))
        self.next_call = 0
        self.bindings = {}          # id(proxy) -> (sid, slot)
        self.counters = []
        self.last_k = {}
        self.allowed = set()
        self.judged_only_here = False   # the check deferred its comparisons to the replay
        self.writes = {}                # sid -> the arguments the check's session lets be written

    def next_seed(self, module):
        queue = self.seeds.get(module)
        if queue:
            k = queue.pop(0)
        else:
            k = self.last_k.get(module, -1) + 1    # more generators than recorded: next one
        self.last_k[module] = k
        return derive_seed(self.base_seed, k)

    @contextlib.contextmanager
    def session(self, functions, module, writes=()):
        queue = self.opens.get(module)
        if not queue:
            raise ReplayError("the kernel recorded fewer checked calls than the check makes")
        ev = queue.pop(0)
        if _int(ev.get("n")) != len(functions):
            raise ReplayError("the record does not match the check")
        sid = ev.get("s")
        self.writes[sid] = frozenset(writes)
        added = []
        for slot, fn in enumerate(functions):
            if isinstance(fn, Proxy):
                if (sid, slot) in self.unrecordable:
                    raise ReplayError(f"{fn.__name__} could not be recorded in the kernel")
                self.bindings[id(fn)] = (sid, slot)
                added.append(id(fn))
        try:
            yield
        finally:
            for key in added:
                self.bindings.pop(key, None)

    def bound(self, proxy):
        return id(proxy) in self.bindings

    def bound_any_child(self, proxy):
        return any(id(c) in self.bindings for c in proxy._children.values())

    def replay_call(self, proxy, args, kwargs):
        sid, slot = self.bindings[id(proxy)]
        if self.next_call >= len(self.calls):
            raise ReplayError(f"the kernel recorded no result for this call of {proxy.__name__}")
        ev = self.calls[self.next_call]
        self.next_call += 1
        if ev.get("s") != sid or ev.get("slot") != slot:
            raise ReplayError("the recorded calls are out of order")
        launches = _int(ev.get("launches", 0))
        kernels = ev.get("kernels") or []
        for counter in self.counters:
            counter.count += launches
            counter.kernels.extend(str(k)[:100] for k in kernels if isinstance(k, str))
        tensors = dict(_tensor_args(args, kwargs))
        writes = self.writes.get(sid, frozenset())
        import torch
        outputs = []
        for entry in ev.get("mut") or []:
            if not isinstance(entry, list) or len(entry) != 2:
                raise ReplayError("malformed call record")
            where, value = entry
            if not isinstance(where, (int, str)) or isinstance(where, bool) or \
                    where not in tensors:
                raise ReplayError("the record changes an argument the check did not pass")
            if where not in writes:                # an input: the call fails, nothing is copied
                raise InputChanged(wrote_into_message(
                    proxy.__name__, argument_name(where, []), bool(ev.get("kernel"))))
            outputs.append((tensors[where], value))
        for entry in ev.get("wrote") or []:
            where = entry[0] if isinstance(entry, list) and entry else None
            name = entry[1] if isinstance(entry, list) and len(entry) > 1 else None
            shown = argument_name(name if isinstance(name, str) else where, [])
            if isinstance(entry, list) and len(entry) > 2 and isinstance(entry[2], list):
                shown = nested_name(shown, entry[2])
            raise InputChanged(wrote_into_message(proxy.__name__, shown,
                                                  bool(ev.get("kernel"))))
        for target, value in outputs:              # the outputs the check handed to be written
            new = codec.decode(value, device_map=self.device_map)
            if not isinstance(new, torch.Tensor) or new.shape != target.shape:
                raise ReplayError("a recorded argument changed shape")
            with torch.no_grad():
                target.copy_(new.to(target.device))
        if "exc" in ev:
            raise _rebuild_exception(ev["exc"])
        if "result" not in ev:
            raise ReplayError("malformed call record")
        return codec.decode(ev["result"], device_map=self.device_map)


def _int(v):
    if not isinstance(v, int) or isinstance(v, bool):
        raise ReplayError("malformed record")
    return v


def _rebuild_exception(info):
    import builtins
    name = str(info.get("type", "Exception"))[:100]
    mro = info.get("mro") or []
    base = Exception
    for base_name in mro:
        candidate = getattr(builtins, str(base_name), None)
        if isinstance(candidate, type) and issubclass(candidate, Exception):
            base = candidate
            break
    cls = base if base.__name__ == name else type(name, (base,), {})
    return cls(str(info.get("msg", ""))[:2000])


def replay_check(check, args, kwargs, context):
    """Run ``check(*args, **kwargs)`` in this (the grader's) process against ``context`` (a
    :class:`ReplayContext` holding the kernel's record); the student's functions among the
    arguments are :class:`Proxy` objects of that context.  Returns the check's return value;
    raises what the check raises (AssertionError on a wrong result) or :class:`ReplayError`."""
    global _mode, _replay
    previous = (_mode, _replay)
    _mode, _replay = "replay", context
    try:
        return check(*args, **kwargs)
    finally:
        _mode, _replay = previous


def unused_calls(context) -> int:
    """Recorded calls the replay did not consume."""
    return len(context.calls) - context.next_call
