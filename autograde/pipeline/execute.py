"""Running a submission: nbgrader's Execute preprocessor with a sandboxed kernel, per-lab
timeouts, an output cap, and recovery from a kernel that hangs or dies.

What nbgrader does on its own: a cell that runs past the timeout is interrupted with SIGINT
and the next cell runs.  What happens here as well:

- the kernel is started by :mod:`autograde.isolation.kernel` (sandbox, limits, the grader's seed);
- a cell that ignores the interrupt (its kernel stops answering) or kills its kernel is
  recorded as an incident; the kernel is restarted and every earlier cell that is not a test
  cell and did not fail is run again, silently, to rebuild the student's state; then grading
  goes on with the next cell, so the rest of the submission is still graded;
- output beyond ``output_limit_kb`` per cell is dropped as it arrives (the grader never holds
  it), and the cell says how much was dropped.
"""
from __future__ import annotations

import asyncio
import copy
import json
import os
import secrets
import socket
import time

from nbformat.notebooknode import NotebookNode
from nbgrader import utils as nbutils
from nbgrader.preprocessors import Execute
from traitlets import Integer

from . import dblock, status
from ..isolation import limits
from ..compat.nbclient_compat import CellTimeoutError, DeadKernelError, TimeoutHook, cleanup_kernel, ensure_async, run_sync
from ..compat.nbconvert_compat import begin_run
from ..config import AutogradeSettings, describe, resolve_environment
from ..isolation.kernel import KernelSetup
from ..isolation.limits import limit_grader_memory, memory_reason
from ..trust.recording import MIME
from ..isolation.sandbox import sandbox_available

__all__ = ["SandboxedExecute", "resolve_sandbox", "sandbox_warning"]

_SANDBOX_CACHE = {}


def resolve_sandbox(settings: AutogradeSettings, log=None) -> str:
    if settings.sandbox == "none":
        return "none"
    if "v" not in _SANDBOX_CACHE:
        _SANDBOX_CACHE["v"] = sandbox_available()
    ok, why = _SANDBOX_CACHE["v"]
    if ok:
        return "bwrap"
    if settings.sandbox == "bwrap" or settings.sandbox_required:
        raise RuntimeError(
            f"the grading sandbox is required but unavailable: {why}.  Install bubblewrap "
            f"(`apt-get install bubblewrap`) and run the grading command as root; or, to grade "
            f"trusted notebooks without isolation, set c.AutogradeSettings.sandbox = 'none'")
    if log is not None:
        log.warning(NO_SANDBOX_BANNER, why)
    return "none"


NO_SANDBOX_BANNER = ("GRADING RUNS WITHOUT A SANDBOX: student code can read and write whatever "
                     "the grader can (%s)")


def sandbox_warning(settings):
    """None when grading kernels run in the sandbox here, else the loud line for the
    console (raises like resolve_sandbox when the sandbox is required)."""
    if settings.sandbox == "none":
        return NO_SANDBOX_BANNER % "AutogradeSettings.sandbox = 'none'"
    if resolve_sandbox(settings) == "none":
        return NO_SANDBOX_BANNER % _SANDBOX_CACHE["v"][1]
    return None


def _error(ename, evalue):
    return NotebookNode(output_type="error", ename=ename, evalue=evalue,
                        traceback=[f"{ename}: {evalue}"])


def first_answer(nb) -> int:
    return next((i for i, c in enumerate(nb.cells) if nbutils.is_solution(c)), len(nb.cells))


def _is_test_cell(cell) -> bool:
    return cell.cell_type == "code" and nbutils.is_grade(cell) and not nbutils.is_solution(cell)


class SandboxedExecute(TimeoutHook, Execute):
    """nbgrader's Execute, run in the grading sandbox (see the module docstring)."""

    iopub_timeout = Integer(5).tag(config=True)
    startup_timeout = Integer(120).tag(config=True)

    def preprocess(self, nb, resources, km=None):
        settings = AutogradeSettings(parent=self)
        # the grader's own memory, under `nbgrader autograde` as in `autograde grade`'s
        # workers (set once in the process; never loosened)
        in_force = limit_grader_memory(settings.grader_memory_mb)
        memory_mb = in_force // 2 ** 20 if in_force else settings.grader_memory_mb
        nbg = resources["nbgrader"]
        assignment, student = nbg["assignment"], nbg["student"]
        self._settings = settings
        explicit = any("timeout" in self.config.get(section, {})
                       for section in ("Execute", "SandboxedExecute"))
        # nbgrader's own --Execute.timeout, when given, wins over the lab's default
        self.timeout = self._cell_timeout = self.timeout if explicit and self.timeout else \
            settings.timeout_for(assignment)
        self.iopub_timeout = self._output_deadline()
        self.shutdown_kernel = "immediate"
        size = len(json.dumps(nb))
        if settings.submission_limit_mb and size > settings.submission_limit_mb * 2 ** 20:
            why = (f"the notebook is {size / 2 ** 20:.1f} MiB, over the submission size limit "
                   f"of {settings.submission_limit_mb} MiB: it was not run")
            for cell in nb.cells:
                if cell.cell_type == "code":
                    cell.outputs = [_error("CellNotRun", why)]
            status.note_failure(os.getcwd(), settings, assignment, student, why)
            resources.setdefault("autograde", {}).update(cells={}, incidents=[], seeds={},
                                                        kernels=[])
            return nb, resources
        environment = resolve_environment(settings)
        mode = resolve_sandbox(settings, self.log)
        self._worker = int(os.environ.get("AUTOGRADE_WORKER", "0") or 0)
        self._workers = int(os.environ.get("AUTOGRADE_WORKERS", "1") or 1)
        self._mode, self._environment = mode, environment
        self._assignment = assignment
        self._describe = (student, nbg["notebook"], environment, mode, settings)
        # what nbconvert's ExecutePreprocessor.preprocess does before running cells
        begin_run(self, nb, km, resources)
        self.info = resources.setdefault("autograde", {})
        self.info.update(environment=environment, sandbox=mode, timeout=self.timeout,
                         cells={}, incidents=[], seeds={}, kernels=[])
        self._setup = None
        self._whole = None
        self._dropped_notebook = False
        self._incarnation = 0
        self._restarts = 0
        self._failed = set()
        dblock.release()
        try:
            run_sync(self._async_run_all)()
        except MemoryError:
            status.note_failure(os.getcwd(), settings, assignment, student,
                                memory_reason(memory_mb))
            raise
        except Exception as exc:
            status.note_failure(os.getcwd(), settings, assignment, student,
                                f"grading kernel failed: {exc}")
            raise
        finally:
            dblock.acquire()
        self.set_widgets_metadata()
        return self.nb, self.resources

    # ------------------------------------------------------------------ kernel lifecycle
    async def _start(self):
        self._incarnation += 1
        seed = secrets.token_hex(16)
        self._setup = KernelSetup(mode=self._mode, environment=self._environment,
                                  settings=self._settings, seed=seed, worker=self._worker,
                                  workers=self._workers, assignment=self._assignment,
                                  course_root=os.getcwd())
        self.info["seeds"][str(self._incarnation)] = seed
        kernel = {"incarnation": self._incarnation, "uid": self._setup.uid,
                  "host": socket.gethostname(), "pid": os.getpid(), "start": time.time()}
        if self._setup.gpu is not None:
            kernel["gpu"] = self._setup.gpu
        self.info["kernels"].append(kernel)
        if self._incarnation == 1:
            student, notebook, environment, mode, settings = self._describe
            self.log.info("%s/%s: %s", status.printable(student, limit=100),
                          status.printable(notebook, limit=200),
                          describe(environment, mode, settings, self.timeout, self._setup.uid))
        else:
            self.log.info("kernel %d runs as uid %s", self._incarnation, self._setup.uid)
        if self._setup.gpu is not None:
            self.log.info("kernel %d sees GPU %s (CUDA_VISIBLE_DEVICES)", self._incarnation,
                          self._setup.gpu or "none")
        self.km = self._setup.kernel_manager(parent=self)
        started = time.monotonic()
        try:
            await self.async_start_new_kernel()
            await self.async_start_new_kernel_client()
        except Exception as exc:
            named = limits.from_exit(await self._exit_report(), self._settings)
            self._setup.cleanup()
            kernel["end"] = time.time()
            self._setup = None
            raise RuntimeError(f"the grading kernel did not start ({exc})"
                               + (f"; {named[1]}" if named else "")) from exc
        problems = self._setup.close_socket_dir()
        if problems:
            # something of the kernel's could still write into its socket folder on the host
            # (outside the sandbox's size-limited folders): it does not run a cell
            await self._stop()
            raise RuntimeError("the grading kernel kept a way to write into its socket "
                               "folder after it was closed (socket folder limit): "
                               + "; ".join(status.printable(p, limit=300)
                                           for p in problems[:3]))
        self.log.debug("kernel %d up in %.2f s", self._incarnation, time.monotonic() - started)

    async def _stop(self):
        if self.km is not None:
            try:
                await cleanup_kernel(self)
            except Exception as exc:                    # noqa: BLE001
                self.log.warning("cleaning up the kernel: %s", exc)
            self.km = None
            self.kc = None
        if self._setup is not None:
            self._setup.cleanup()
            self._setup = None
            if self.info["kernels"]:
                self.info["kernels"][-1]["end"] = time.time()

    async def _exit_report(self, wait=2.0):
        """The launcher's exit report of the current kernel (it is written just after the
        kernel's end, so wait a little for it)."""
        if self._setup is None:
            return None
        deadline = time.monotonic() + wait
        while True:
            report = self._setup.exit_report()
            if report is not None or time.monotonic() > deadline:
                return report
            await asyncio.sleep(0.05)

    async def _exit_status(self):
        try:
            return await self.km.provisioner.poll()
        except Exception:                               # noqa: BLE001
            return None

    # ------------------------------------------------------------------ cells
    async def _async_run_all(self):
        await self._start()
        msg_id = await ensure_async(self.kc.kernel_info())
        info = await self.async_wait_for_reply(msg_id)
        if info and "language_info" in info.get("content", {}):
            self.nb.metadata["language_info"] = info["content"]["language_info"]
        gave_up = None
        answer = first_answer(self.nb)
        try:
            for index, cell in enumerate(self.nb.cells):
                setup = index < answer and nbutils.is_locked(cell) and \
                    not nbutils.is_grade(cell)
                self.timeout = self._settings.setup_timeout if setup else self._cell_timeout
                self.iopub_timeout = self._output_deadline()
                if cell.cell_type != "code" or not cell.source.strip():
                    continue
                if gave_up is not None:
                    cell.outputs = [_error("CellNotRun", gave_up)]
                    self.info["cells"][str(index)] = {"not_run": gave_up}
                    continue
                entry = {"incarnation": self._incarnation}
                self.info["cells"][str(index)] = entry
                problem = await self._run_cell(cell, index, entry)
                if problem is None:
                    continue
                self._failed.add(index)
                self._incident(index, cell, *problem)
                ok, why = await self._restart_and_replay(index)
                if not ok:
                    gave_up = why
                    self._incident(index, cell, f"grading stopped: {why}")
        finally:
            await self._stop()

    def _incident(self, index, cell, text, limit=None):
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        entry = {"cell": index, "grade_id": gid, "what": text}
        if limit:
            entry["limit"] = limit
        self.info["incidents"].append(entry)
        self.log.warning("cell %s%s: %s", index, f" ({status.printable(gid, limit=64)})" if gid
                         else "", status.printable(text))

    def _output_deadline(self):
        """Seconds nbclient waits, after a cell's reply, for the rest of its output (the
        kernel's idle message).  Not a time limit of the cell: on a loaded host the output
        of a correct cell can trail its reply by many seconds, so the deadline is the cell's
        own time limit (at least a minute); only after a real timeout, once the kernel has
        been interrupted, is it the interrupt's grace."""
        return max(60, int(self.timeout or 0))

    async def _run_cell(self, cell, index, entry):
        """Run one cell; None if the kernel is still usable, else what went wrong."""
        self._timed_out = False
        self._dropped = 0
        started = time.monotonic()
        try:
            await self.async_execute_cell(cell, index, store_history=True)
        except CellTimeoutError:
            if not self._timed_out:
                # the cell ended (its reply came) but its output stopped arriving: not a
                # timeout of the cell, and said as what it is
                entry["output_stalled"] = True
                wait = self.iopub_timeout
                cell.outputs.append(_error(
                    "OutputStalled", f"the cell finished, but its output did not arrive "
                                     f"within {wait} s after it; the kernel was restarted"))
                return (f"the cell finished but its output did not arrive within {wait} s "
                        "after it (not a timeout of the cell)"), None
            entry["timeout"] = entry["unresponsive"] = True
            cell.outputs.append(_error(
                "CellTimeoutError", f"the cell ran past {self.timeout} s and did not stop when "
                                    "interrupted; the kernel was restarted"))
            return (f"timed out after {self.timeout} s and ignored the interrupt; "
                    f"time limit: {self.timeout} s per cell"), "time limit"
        except DeadKernelError:
            code = await self._exit_status()
            entry["died"] = True
            report = await self._exit_report()
            if report is not None:
                code = report.get("status", code)
            named = limits.from_exit(report, self._settings)
            what = f"the kernel died while running this cell (exit status {code})"
            if named:
                what += f"; {named[1]}"
            cell.outputs.append(_error("KernelDied", what + "; the kernel was restarted"))
            return what, named[0] if named else None
        finally:
            entry["seconds"] = round(time.monotonic() - started, 3)
            if self._dropped:
                entry["output_dropped_bytes"] = self._dropped
                whole = getattr(self, "_dropped_notebook", False)
                limit = (f"{self._settings.notebook_output_limit_kb} KiB for the whole "
                         "notebook" if whole else f"{self._settings.output_limit_kb} KiB")
                cell.outputs.append(NotebookNode(
                    output_type="stream", name="stdout",
                    text=f"\n[autograde: {self._dropped} bytes of output beyond "
                         f"{limit} were dropped]\n"))
                self._incident(index, cell, f"output limit: {self._dropped} bytes dropped "
                                            f"(the limit is {limit}"
                                            + (")" if whole else " per cell)"), "output limit")
                self._dropped_notebook = False
        if self._timed_out:
            entry["timeout"] = True
            self._failed.add(index)
            self._incident(index, cell, f"timed out after {self.timeout} s (interrupted); "
                                        f"time limit: {self.timeout} s per cell", "time limit")
        seen = set()
        for out in cell.get("outputs", []):
            if out.get("output_type") != "error" or out.get("ename") in ("CellTimeoutError",):
                continue
            named = limits.from_error(out.get("ename", ""), out.get("evalue", ""),
                                      self._settings)
            if named and named[0] not in seen:
                seen.add(named[0])
                entry.setdefault("limits", []).append(named[0])
                self._incident(index, cell, named[1], named[0])
        return None

    async def _restart_and_replay(self, failed_index):
        self._restarts += 1
        if self._restarts > self._settings.max_restarts:
            return False, f"the kernel was restarted {self._settings.max_restarts} times"
        await self._stop()
        try:
            await self._start()
        except RuntimeError as exc:
            return False, str(exc)
        for j, original in enumerate(self.nb.cells[:failed_index]):
            if original.cell_type != "code" or not original.source.strip() or j in self._failed \
                    or _is_test_cell(original):
                continue
            scratch = copy.deepcopy(original)
            self._timed_out = False
            self.timeout = self._settings.setup_timeout if j < first_answer(self.nb) \
                else self._cell_timeout
            self.iopub_timeout = self._output_deadline()
            try:
                await self.async_execute_cell(scratch, j, store_history=False)
            except (CellTimeoutError, DeadKernelError):
                self._timed_out = True
            finally:
                self.nb.cells[j] = original
            if self._timed_out:
                return False, f"rebuilding the state after a restart failed at cell {j}"
            self.iopub_timeout = self._output_deadline()
        return True, ""

    def on_cell_timeout(self):
        """A real timeout: the cell ran past its limit.  The kernel is interrupted; it then
        has the interrupt's grace to go idle before it counts as one that ignored it."""
        self._timed_out = True
        self.iopub_timeout = max(1, int(round(self._settings.interrupt_grace)))

    # ------------------------------------------------------------------ output cap
    def process_message(self, msg, cell, cell_index):
        msg_type = msg.get("msg_type")
        if msg_type in ("stream", "display_data", "execute_result", "update_display_data",
                        "error"):
            content = msg.get("content", {})
            data = content.get("data") or {}
            is_record = MIME in data
            if msg_type == "stream":
                size = len(content.get("text", ""))
            elif msg_type == "error":
                size = len(content.get("evalue", "")) + sum(len(t) for t in
                                                            content.get("traceback", []))
            else:
                size = sum(len(v) if isinstance(v, str) else len(json.dumps(v))
                           for v in data.values())
            budgets = self._budgets_for(cell_index)
            whole = self._notebook_budgets()
            key = "record" if is_record else "output"
            if size > budgets[key] or size > whole[key]:
                if not is_record:
                    self._dropped = getattr(self, "_dropped", 0) + size
                    # the tighter of the two caps names the drop: the notebook's when no
                    # more of it is left than of the cell's own
                    if whole[key] <= budgets[key]:
                        self._dropped_notebook = True
                else:
                    budgets["record_overflow"] = True
                return None
            budgets[key] -= size
            whole[key] -= size
        return super().process_message(msg, cell, cell_index)

    def _notebook_budgets(self):
        """What is left of the whole notebook's output and records (bytes): a submission of
        many cells, each just under the cell's cap, stops at the notebook's."""
        if getattr(self, "_whole", None) is None:
            self._whole = {"output": self._settings.notebook_output_limit_kb * 1024,
                           "record": self._settings.notebook_record_limit_mb * 2 ** 20}
        return self._whole

    def _budgets_for(self, cell_index):
        if not hasattr(self, "_budgets") or self._budgets[0] != cell_index:
            self._budgets = (cell_index, {"output": self._settings.output_limit_kb * 1024,
                                          "record": 64 * 2 ** 20})
        return self._budgets[1]
