"""The verdict of one graded test cell, decided outside the kernel: a cell that needs a GPU
on a CPU host is not gradable here; one the kernel did not finish fails; every check call is
replayed in this process with the kernel's record (:mod:`autograde.trust.recording`), the expected
values and the comparison being the grader's own; a checked function that the static scan
finds reaching what the lab forbids is ``forbidden``."""
from __future__ import annotations

import importlib

from ...trust import recording
from ...config import gpu_visible
from .outputs import has_error, records

__all__ = ["NOT_GRADABLE", "needs_gpu", "resolve", "scan_verdict", "verify_cell"]

NOT_GRADABLE = "not_gradable_here"


def device_map(kind):
    return "cuda" if kind == "cuda" and gpu_visible() else "cpu"


def needs_gpu(cell_tags, calls, gpu_cell_tags):
    if cell_tags & set(gpu_cell_tags):
        return True
    for module, function, _, _ in calls:
        fn = resolve(module, function)
        if fn is not None and getattr(fn, "requires_gpu", False):
            return True
    return False


def resolve(module, function):
    try:
        return getattr(importlib.import_module(module), function)
    except Exception:                          # noqa: BLE001
        return None


def scan_verdict(calls, tainted, rule=None):
    for module, function, args, kwargs in calls:
        for spec in list(args or []) + list((kwargs or {}).values()):
            if spec[0] in ("name", "attr"):
                root = spec[1].split(".")[0]
                if root in tainted:
                    why = f" ({rule})" if rule else ""
                    return {"verdict": "forbidden", "ename": "ForbiddenReference",
                            "message": f"{root} {tainted[root]}, which a graded function "
                                       f"must not use{why}"}
    return None


def verify_cell(cell, calls, cell_tags, environment, run_info, seeds, tainted, rule,
                gpu_cell_tags):
    """The verdict of one graded test cell (a dict: ``verdict``, ``message``, maybe
    ``ename``, ``replayed``, ``partial``): what the kernel reported about it, its check
    calls replayed with the kernel's record, and the static scan of what it hands them
    (``tainted(extra_allowed)``: {name: why} of the names that reach what the lab forbids;
    ``rule``: the course's call rule in words, for the message)."""
    in_kernel_error = has_error(cell)
    if needs_gpu(cell_tags, calls, gpu_cell_tags) and environment != "gpu":
        return {"verdict": NOT_GRADABLE, "message": "needs a CUDA GPU"}
    if run_info.get("not_run"):
        return {"verdict": "fail", "message": f"not run: {run_info['not_run']}"}
    if run_info.get("timeout"):
        return {"verdict": "fail", "message": "timed out", "ename": "CellTimeoutError"}
    if run_info.get("died"):
        return {"verdict": "fail", "message": "the kernel died in this cell"}
    if in_kernel_error:
        # a graded function that reached what its lab forbids (a chip of this lab, which
        # the grading kernel does not hold, or the reference) says so; the grader's own
        # scan of the submitted source decides it, not the kernel's error text
        return scan_verdict(calls, tainted(), rule) or \
            {"verdict": "fail", "message": "the cell raised an error in the kernel"}
    if not calls:
        return scan_verdict(calls, tainted(), rule) or \
            {"verdict": "pass", "message": "scored in the kernel (no check to replay)",
             "replayed": False}
    events, overflow = records(cell)
    if overflow:
        return {"verdict": "needs_review", "ename": "VerificationFailed",
                "message": "the record of this check was too large to verify"}
    if not events:
        return {"verdict": "needs_review", "ename": "VerificationFailed",
                "message": "the kernel reported a pass but sent no record of the hidden "
                           "check (was the check replaced or silenced?)"}
    seed = seeds.get(str(run_info.get("incarnation", 1)))
    if seed is None:
        return {"verdict": "needs_review", "ename": "VerificationFailed",
                "message": "no grading seed for this cell"}
    try:
        context = recording.ReplayContext(events, seed, device_map)
    except recording.ReplayError as exc:
        return {"verdict": "needs_review", "ename": "VerificationFailed",
                "message": f"the record cannot be read: {exc}"}
    result = None
    for module, function, args, kwargs in calls:
        if args is None:
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": f"{module}.{function} is called with arguments the grader "
                               "cannot replay"}
        fn = resolve(module, function)
        if fn is None:
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": f"the grader cannot import {module}.{function}"}
        proxies = {}

        def value(spec):
            if spec[0] == "const":
                return spec[1]
            root, *rest = spec[1].split(".")
            obj = proxies.setdefault(root, recording.Proxy(context, root))
            for part in rest:
                obj = getattr(obj, part)
            return obj
        try:
            result = recording.replay_check(fn, [value(a) for a in args],
                                            {k: value(v) for k, v in kwargs.items()},
                                            context)
        except recording.ReplayError as exc:
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": f"the grader could not replay {function}: {exc}"}
        except AssertionError as exc:
            if context.judged_only_here:
                # the check compares only here: this is its verdict on a wrong answer,
                # with the check's own diagnosis as the message the student reads
                return {"verdict": "fail", "ename": "AssertionError",
                        "message": "\n".join(str(exc).strip().splitlines()[:20])[:3000]
                        or "the check failed"}
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": "the kernel reported a pass, the grader's replay failed: "
                               + first_lines(exc)}
        except Exception as exc:                    # noqa: BLE001
            return {"verdict": "needs_review", "ename": "VerificationFailed",
                    "message": f"the grader's replay of {function} raised "
                               f"{type(exc).__name__}: {first_lines(exc)}"}
    if recording.unused_calls(context):
        return {"verdict": "needs_review", "ename": "VerificationFailed",
                "message": "the record holds calls the check never made"}
    forbidden = scan_verdict(calls, tainted(context.allowed), rule)
    if forbidden:
        return forbidden
    verdict = {"verdict": "pass", "message": "verified by the grader's replay",
               "replayed": True}
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        verdict["partial"] = float(result)
    return verdict


def first_lines(exc, n=3):
    text = str(exc).strip()
    lines = text.splitlines()
    return " ".join(lines[:n])[:1500] if lines else type(exc).__name__
