"""The grading's own limits and copies, without a sandbox: tensors nested in a check's
arguments, the grader's memory under plain ``nbgrader autograde``, a configuration that still
sets a removed setting, what reaches a terminal, and the check of the kernel's socket folder.
"""
from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap

import pytest
import torch


def _record_and_replay(check, fn, secret="nested"):
    """Run ``check(fn)`` as the grading kernel does (recording), then as the grader replays
    it; returns (what the kernel side raised, what the replay raised), None where nothing."""
    from autograde.trust import recording

    recording._mode, recording._base_seed, recording._counter = "record", secret, 0
    recording._events = []
    in_kernel = None
    try:
        check(fn)
    except AssertionError as exc:
        in_kernel = exc
    finally:
        events, recording._events, recording._mode = recording._events, [], None
    context = recording.ReplayContext(events, secret)
    try:
        recording.replay_check(check, [recording.Proxy(context, "fn")], {}, context)
    except AssertionError as exc:
        return in_kernel, exc, events
    return in_kernel, None, events


Pair = collections.namedtuple("Pair", "locations weights")


def _check_nested(kind):
    """A hidden check that hands its function tensors nested in a list, a dict or a named
    tuple, and computes what it expects from its own copies afterwards."""
    from autograde.checks.common import forbid_references, fresh_generator, judging

    def check(fn):
        gen = fresh_generator()
        levels = [torch.randn(4, generator=gen), torch.randn(4, generator=gen)]
        weights = torch.rand(4, generator=gen)
        keep = [t.clone() for t in levels] + [weights.clone()]
        if kind == "list":
            arg = levels
        elif kind == "dict":
            arg = {"levels": levels, "weights": weights}
        else:
            arg = Pair(levels, weights)
        with forbid_references(fn):
            got = fn(arg, weights)
        assert all(torch.equal(a, b) for a, b in zip(levels + [weights], keep)), \
            "the check's own nested tensor changed"
        if judging():
            expected = (levels[0] + levels[1]) * weights
            assert torch.allclose(got, expected), "wrong result"
    return check


def _honest(kind):
    def fn(arg, weights):
        levels = arg if kind == "list" else (arg["levels"] if kind == "dict" else arg.locations)
        return (levels[0] + levels[1]) * weights
    return fn


def _zeroing(kind):
    """Writes zeros into the second level (nested) and returns what the zeroed inputs give:
    before nested copies, the check's expectation was computed from the zeroed level."""
    def fn(arg, weights):
        levels = arg if kind == "list" else (arg["levels"] if kind == "dict" else arg.locations)
        levels[1].zero_()
        return levels[0] * weights
    return fn


@pytest.mark.parametrize("kind,named", [("list", "arg[1]"), ("dict", "arg['levels'][1]"),
                                        ("namedtuple", "arg[0][1]")])
def test_a_write_into_a_nested_tensor_is_the_named_mistake(kind, named):
    from autograde.trust import recording

    check = _check_nested(kind)
    assert _record_and_replay(check, _honest(kind))[:2] == (None, None)
    fn = _zeroing(kind)
    fn.__name__ = "sample_levels"
    in_kernel, replayed, events = _record_and_replay(check, fn)
    assert isinstance(in_kernel, recording.InputChanged), in_kernel
    assert f"sample_levels: your code wrote into {named}, one of its inputs" in \
        str(in_kernel), str(in_kernel)
    assert isinstance(replayed, recording.InputChanged), replayed
    assert f"wrote into {named}," in str(replayed), str(replayed)
    # a record whose "wrote" note was removed: the replay copies nothing into the grader's
    # nested tensors, and the zeroed level's result is simply wrong
    forged = [{k: v for k, v in ev.items() if k != "wrote"} for ev in events]
    context = recording.ReplayContext(forged, "nested")
    with pytest.raises(AssertionError) as caught:
        recording.replay_check(check, [recording.Proxy(context, "fn")], {}, context)
    assert "wrong result" in str(caught.value)


def test_a_forged_nested_key_cannot_write_into_the_message():
    from autograde.trust import recording

    assert recording.nested_name("levels", [1, "weights"]) == "levels[1]['weights']"
    shown = recording.nested_name("levels", ["\x1b[2J", 10 ** 9, True, None, 0, 1, 2])
    assert shown == "levels[...][...][...][...]", shown


def test_the_containers_handed_over_are_new_ones():
    """An append to the list it was given does not reach the check's list either."""
    from autograde.trust import recording

    levels = [torch.ones(2), torch.ones(2)]
    watched = []
    copied = recording._with_copies(levels, watched, 0)
    copied.append(torch.zeros(2))
    copied[0].zero_()
    assert len(levels) == 2 and torch.equal(levels[0], torch.ones(2))
    assert [w[0] for w in watched] == [(0, 0), (0, 1)]


# ------------------------------------------------------------------ the grader's memory
def test_the_grader_memory_limit_is_set_once_in_the_process():
    code = textwrap.dedent("""
        import resource
        from autograde.isolation import limits
        limits.limit_grader_memory(300)
        first = resource.getrlimit(resource.RLIMIT_DATA)
        limits.limit_grader_memory(900)          # a second call never loosens it
        second = resource.getrlimit(resource.RLIMIT_DATA)
        try:
            block = bytearray(600 * 2 ** 20)
            print("ALLOCATED")
        except MemoryError:
            print("REFUSED")
        print(first[0] // 2 ** 20, second[0] // 2 ** 20)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["REFUSED", "300", "300"], out.stdout


def test_a_memory_error_under_nbgrader_autograde_is_named(monkeypatch):
    """The preprocessor that runs the notebook (nbgrader autograde's, not only the parallel
    command's workers) sets the limit and names it when grading ran into it."""
    import nbformat

    from autograde.isolation import limits as isolation_limits
    from autograde.pipeline import execute, status

    noted, limits = [], []
    monkeypatch.setattr(status, "note_failure",
                        lambda root, settings, assignment, student, reason:
                        noted.append(reason))
    monkeypatch.setattr(execute, "limit_grader_memory", limits.append)
    monkeypatch.setattr(execute, "resolve_environment", lambda settings: "cpu")
    monkeypatch.setattr(execute, "resolve_sandbox", lambda settings, log=None: "none")

    def out_of_memory(self):
        raise MemoryError()
    monkeypatch.setattr(execute.SandboxedExecute, "_async_run_all", out_of_memory)
    monkeypatch.setattr(execute, "run_sync", lambda fn: fn)
    pre = execute.SandboxedExecute()
    pre.config.AutogradeSettings.grader_memory_mb = 1234
    pre = execute.SandboxedExecute(config=pre.config)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    resources = {"nbgrader": {"assignment": "labfx", "student": "s1", "notebook": "labfx"}}
    with pytest.raises(MemoryError):
        pre.preprocess(nb, resources)
    assert limits == [1234]
    assert noted == [isolation_limits.memory_reason(1234)], noted
    assert noted[0].startswith("grader memory limit:") and "1234 MiB" in noted[0]
    assert "no limit is set" in isolation_limits.memory_reason(0)


# ------------------------------------------------------------------ removed setting
def test_a_config_that_still_sets_similarity_min_statements_loads():
    """The setting is gone (short answers are compared too, autograde/runner/similarity.py); a
    configuration written before still loads, with traitlets' warning naming the key."""
    from traitlets.config import Config

    from autograde.config import AutogradeSettings

    assert "similarity_min_statements" not in AutogradeSettings.class_trait_names()
    c = Config()
    c.AutogradeSettings.similarity_min_statements = 8
    c.AutogradeSettings.similarity_threshold = 0.5
    with pytest.warns(UserWarning, match="similarity_min_statements"):
        settings = AutogradeSettings(config=c)
    assert settings.similarity_threshold == 0.5
# ------------------------------------------------------------------ the socket folder
def test_a_descriptor_into_the_socket_folder_is_found(tmp_path):
    """The grader's check after it closes the kernel's socket folder: a process of the
    kernel's uid that still holds a file there (opened before the folder was taken back) is
    named, and so is a file in it that is not a socket."""
    from autograde.isolation import kernel

    folder = tmp_path / "ipc"
    folder.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"import sys, time; fh = open({str(folder / 'spill')!r}, 'w'); print('open', "
         "flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        found = kernel.socket_dir_problems(str(folder), os.getuid())
        assert any("spill" in p and "holds" in p for p in found), found
        assert any("spill" in p and "not a socket" in p for p in found), found
    finally:
        holder.kill()
        holder.wait()
    assert kernel.socket_dir_problems(str(folder), os.getuid()) == [
        f"a file that is not a socket: {folder / 'spill'} (0 bytes)"]
    (folder / "spill").unlink()
    assert kernel.socket_dir_problems(str(folder), os.getuid()) == []


# ------------------------------------------------------------------ terminal escapes
CONTROLS = "\x1b[2J\x1b]0;owned\x07\r\x08\x9b31m\x1b]52;c;b3duZWQ=\x07"


def _has_control(text):
    return any((ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) < 0xa0 for c in text)


def test_log_records_reach_the_terminal_escaped():
    """What nbgrader and the course log (a student's folder as an argument, an exception
    message, a traceback) is written out escaped; newlines stay."""
    import io
    import logging

    from autograde.logs import escape_log_records

    escape_log_records()
    escape_log_records()                              # once per process, whatever the calls
    stream = io.StringIO()
    log = logging.getLogger("autograde-test-escapes")
    handler = logging.StreamHandler(stream)
    log.addHandler(handler)
    log.propagate = False
    try:
        log.error("Autograding submission %s", "mallory" + CONTROLS)
        log.warning("cell 3 (%s): %s", "id" + CONTROLS, "line one\nline two")
        try:
            raise ValueError("bad" + CONTROLS)
        except ValueError:
            log.exception("There was an error processing assignment")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert not _has_control(text), repr(text)
    assert "Autograding submission mallory\\x1b[2J\\x1b]0;owned\\x07\\x0d\\x08\\x9b31m" in text
    assert "line one\nline two" in text
    assert "ValueError: bad\\x1b[2J" in text and "Traceback" in text


def test_the_sandbox_launcher_reports_a_kernels_output_escaped():
    from autograde.isolation.sandbox import exit_message

    text = exit_message(3, ("Traceback\n" + CONTROLS).encode())
    assert not _has_control(text), repr(text)
    assert text.startswith("[autograde sandbox] kernel exited with status 3; its first "
                           "output:\nTraceback\n\\x1b[2J")
    assert exit_message(1, b"") == "[autograde sandbox] kernel exited with status 1\n"


def test_a_kernel_that_keeps_a_way_into_its_socket_folder_runs_no_cell(monkeypatch):
    """The grading command's side of the check: a kernel whose socket folder is not closed is
    stopped, and grading says why (named: socket folder limit)."""
    import asyncio

    from autograde.pipeline import execute
    from autograde.config import AutogradeSettings

    events = []

    class FakeSetup:
        uid, gpu = 64999, None

        def __init__(self, **kwargs):
            events.append("setup")

        def kernel_manager(self, parent=None):
            return object()

        def close_socket_dir(self):
            return ["process 7 of the kernel's uid holds /tmp/ag-ipc-1-x/spill\x1b[2J"]

        def cleanup(self, wait=False):
            events.append("cleanup")

    async def nothing(*args, **kwargs):
        return None

    monkeypatch.setattr(execute, "KernelSetup", FakeSetup)
    pre = execute.SandboxedExecute()
    monkeypatch.setattr(pre, "async_start_new_kernel", nothing)
    monkeypatch.setattr(pre, "async_start_new_kernel_client", nothing)
    monkeypatch.setattr(pre, "_async_cleanup_kernel", nothing)
    pre._incarnation, pre._mode, pre._environment = 1, "bwrap", "cpu"
    pre._settings, pre._worker, pre._workers, pre._assignment = AutogradeSettings(), 0, 1, "x"
    pre._describe = ("s1", "x", "cpu", "bwrap", pre._settings)
    pre.info = {"seeds": {}, "kernels": []}
    pre.timeout = 10
    with pytest.raises(RuntimeError) as caught:
        asyncio.run(pre._start())
    message = str(caught.value)
    assert "kept a way to write into its socket folder" in message
    assert "(socket folder limit)" in message and "spill\\x1b[2J" in message, message
    assert events == ["setup", "cleanup"] and pre._setup is None and pre.km is None


def test_the_launchers_escaping_is_the_reports():
    """The launcher's stdlib copy of the escaping rule writes what ``status.printable`` does
    (newlines kept), and importing it loads none of the grader's heavier modules."""
    from autograde.logs import escaped
    from autograde.pipeline.status import printable

    sample = "a\tb\nc" + CONTROLS + "\u202e\u2028\U0001f600\ud800"
    assert escaped(sample) == printable(sample, limit=10 ** 6, newlines=True)
    code = ("import sys; import autograde.logs; from autograde.isolation.sandbox import exit_message; "
            "exit_message(1, b'x'); print(sorted(m for m in ('nbformat', 'autograde.pipeline.status', "
            "'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
