"""Everything this repository measures on a GPU, in one runner.

    python3 scripts/gpu/run.py PART [PART ...] --out DIR [--budget-s 570]
    python3 scripts/gpu/run.py --list

Run from the repository root with the host's python3 (torch and Triton installed; the
repository itself need not be: the runner puts it on ``PYTHONPATH`` for every step).  The
parts, in the order ``all`` runs them (about 20 minutes in all on an H200 host whose CPU
compiles a loop kernel in 10-20 s):

- ``tests``:   the GPU tests (operator, spec, launch path, model; the two-GPU tests where two
               GPUs are visible);
- ``sweep``:   the launch-configuration sweep -> sweep_h200.json, and the plan it chooses
               written into source_kernels/ for the parts after it;
- ``scripts``: PTX/SASS and atomics (hardware.py), the grader's replay on a GPU;
- ``bench``:   every preset, distribution and dtype beside the grid_sample reference
               -> bench_h200.json;
- ``model``:   the model's training parity, step time, dispatch, compile and CUDA graph;
- ``limits``:  what bounds a decoder forward (an empty kernel, the bare corner-row gather)
               and where the host time of one eager call goes;
- ``labs``:    the labs' GPU scripts (tiling, the bf16 cliff);
- ``ncu``:     Nsight Compute counters of the main cases -> ncu_h200.csv and ncu_h200.json;
- ``grading``: the synthetic class graded on this host (``grade_synthetic_class`` below;
               nbgrader travels as wheels in .whl/ to a host without it).

One more part, not in ``all``: ``refill`` re-measures what the committed results files lack
(under 5 minutes on an H200): the determinism and missing accumulation rows of
results/hardware_h200.json (hardware.py --fill-missing keeps the rest of that file), and
results/pitfalls_h200.json whole.

Every step has its own time limit and the whole call one (``--budget-s``), so the archive is
always written: DIR/gpu_run_<parts>.tgz holding results/ and logs/.  Results and the Triton
cache are kept in .gpu_state/ (ignored by git), so a later call on the same machine finds
them.  A part that needs a CUDA GPU on a machine without one is skipped, with the reason in
the output.  Exit status 0 when every step that ran exited 0.

``make gpu-check`` (scripts/gpu/check.py) is the one-call check of the course's GPU path; its
grading part is ``grade_synthetic_class`` of this file.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE = REPO / ".gpu_state"
ALL = ("tests", "sweep", "scripts", "bench", "model", "limits", "labs", "ncu", "grading")
NCU_METRICS = ",".join([
    "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active", "lts__t_sectors_op_read.sum",
    "lts__t_sectors_op_atom.sum", "lts__t_sectors_op_red.sum", "dram__bytes_read.sum",
    "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct", "launch__registers_per_thread",
    "launch__occupancy_limit_registers"])


# ------------------------------------------------------------------------ running a step
def run_step(command, log: Path, limit_s: float, cwd=REPO, env=None, stdout=None) -> int:
    """Run ``command`` in ``cwd`` under a time limit, its output in ``log`` (stdout to the
    open file ``stdout`` instead, where given).  Past the limit its process group gets
    SIGTERM, ten seconds later SIGKILL, and the exit status is 124 (as `timeout`'s)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        try:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout or handle,
                                       stderr=handle, start_new_session=True)
        except OSError as error:
            handle.write(f"could not start {command[0]}: {error}\n")
            return 127
        try:
            return process.wait(timeout=max(1.0, limit_s))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            handle.write(f"\n[stopped: past its {limit_s:.0f} s]\n")
            return 124


def tail(path: Path, lines: int) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []


def has_cuda() -> tuple[bool, str]:
    """(whether this machine has a CUDA GPU torch can use, why not)."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "this machine has no CUDA GPU"
    return True, ""


class Runner:
    """The steps of one call: their logs in .gpu_state/logs, results in .gpu_state/results,
    each step's limit cut to what the call's budget leaves."""

    RESERVE_S = 15.0                    # kept for the archive after the last step

    def __init__(self, budget_s: float, state: Path = STATE, test_workers: int = 8):
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.state = state
        self.results = state / "results"
        self.logs = state / "logs"
        self.triton_cache = state / "triton_cache"
        self.test_workers = test_workers
        self.failed: list[str] = []
        self.skipped: list[str] = []
        for folder in (self.results, self.logs):
            folder.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, TRITON_CACHE_DIR=str(self.triton_cache),
                        PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join([str(REPO)] + [
                            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started) - self.RESERVE_S

    def say(self, text: str) -> None:
        print(f"== {datetime.datetime.now():%H:%M:%S} {text}", flush=True)

    def run(self, name: str, limit_s: float, command, stdout=None) -> int | None:
        """One step; None when the budget has no room left for it."""
        limit = min(limit_s, self.left())
        if limit < 5:
            self.say(f"{name}: not started, the call's budget is spent")
            self.failed.append(name)
            return None
        self.say(f"{name} (limit {limit:.0f} s)")
        log = self.logs / f"{name}.log"
        log.unlink(missing_ok=True)
        code = run_step([str(c) for c in command], log, limit, env=self.env, stdout=stdout)
        with log.open("a") as handle:
            handle.write(f"exit {code}\n")
        for line in tail(log, 3):
            print("   " + line, flush=True)
        if code != 0:
            self.failed.append(name)
        return code

    def python(self, name: str, limit_s: float, *args) -> int | None:
        return self.run(name, limit_s, [sys.executable, *args])

    def apply_plan(self) -> None:
        """Write the plan of this machine's sweep (results/sweep_h200.json) into the code."""
        sweep = self.results / "sweep_h200.json"
        if not sweep.exists():
            return
        log = self.logs / "plan.log"
        log.unlink(missing_ok=True)
        if run_step([sys.executable, "-m", "source_kernels.bench", "--write-plan", str(sweep)],
                    log, 60, env=self.env) == 0:
            print(f"plan of {sweep} applied", flush=True)

    def versions(self) -> None:
        log = self.logs / "versions.txt"
        log.unlink(missing_ok=True)
        if shutil.which("nvidia-smi"):
            run_step(["nvidia-smi"], log, 30, env=self.env)
        run_step([sys.executable, "-c", "import torch, triton, sys; print(sys.version); "
                  "print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', "
                  "torch.cuda.device_count())"], log, 60, env=self.env)


# --------------------------------------------------------------------------------- parts
def part_tests(r: Runner) -> None:
    files = ["tests/test_operator.py", "tests/test_spec.py", "tests/test_launch.py",
             "tests/test_model.py"]
    import importlib.util
    workers = (["-n", str(r.test_workers)] if importlib.util.find_spec("xdist") else [])
    r.python("gpu_tests", 230, "-m", "pytest", *files, "-p", "no:cacheprovider", *workers,
             "-v", "--tb=short", "-rfs", "--timeout", "170")


def part_sweep(r: Runner) -> None:
    r.python("sweep", 260, "-m", "source_kernels.bench", "--sweep", "--no-bench", "--out",
             r.results / "sweep_h200.json")
    r.apply_plan()


def part_scripts(r: Runner) -> None:
    r.python("hardware", 130, "scripts/gpu/hardware.py", r.results, "--budget-s", "100")
    r.python("grading_replay", 40, "scripts/gpu/grading_replay.py", r.results)


def part_bench(r: Runner) -> None:
    r.apply_plan()
    r.python("bench", 330, "-m", "source_kernels.bench", "--fast", "--out",
             r.results / "bench_h200.json")


def part_model(r: Runner) -> None:
    r.python("model_training", 200, "scripts/gpu/model_training.py", r.results)


def part_limits(r: Runner) -> None:
    r.python("decoder_limits", 60, "scripts/gpu/decoder_limits.py", r.results)
    r.python("dispatch_profile", 60, "scripts/gpu/dispatch_profile.py", r.results)


def part_labs(r: Runner) -> None:
    for name in ("lab06_tiling", "lab09_cliff"):
        r.python(name, 45, f"scripts/gpu/{name}.py", r.results, "--budget-s", "30")


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    return candidates[0] if candidates else None


def part_ncu(r: Runner) -> None:
    ncu = find_ncu()
    if ncu is None:
        r.say("ncu: skipped, Nsight Compute (ncu) is not on PATH nor in /opt/nvidia/nsight-compute")
        r.skipped.append("ncu")
        return
    csv_path = r.results / "ncu_h200.csv"
    with csv_path.open("w") as csv_file:
        r.run("ncu", 60, [ncu, "--clock-control", "none", "--csv", "-k", "regex:_msda",
                          "--metrics", NCU_METRICS, sys.executable, "scripts/gpu/ncu_cases.py"],
              stdout=csv_file)
    # its provenance: the stack and the date beside the counters, the commit from the caller
    versions = r.results / "ncu_versions.txt"
    with versions.open("w") as handle:
        run_step([sys.executable, "-c", "import datetime, torch, triton; print(torch.__version__,"
                  " triton.__version__, torch.cuda.get_device_name(), datetime.datetime.now("
                  "datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S'))"],
                 r.logs / "ncu_versions.log", 60, env=r.env, stdout=handle)
    r.python("summarize_ncu", 60, "scripts/summarize_ncu.py", csv_path,
             r.results / "ncu_h200.json", versions, os.environ.get("COURSE_COMMIT", "unknown"))


def part_grading(r: Runner, options: argparse.Namespace) -> None:
    limit = min(options.grading_budget_s + 40, r.left())
    if limit < 30:
        r.say("grading: not started, the call's budget is spent")
        r.failed.append("grading")
        return
    r.say(f"grading (limit {limit:.0f} s)")
    log = r.logs / "grading.log"
    code = grade_synthetic_class(
        r.results, grading_env=options.grading_env, sandbox=options.sandbox,
        sequential=options.sequential, workers=options.workers,
        budget_s=min(options.grading_budget_s, limit - 40), python=options.python,
        wheels=options.wheels, keep_work=options.keep_work, log_path=log, echo=False,
        env=dict(r.env))
    with log.open("a") as handle:
        handle.write(f"exit {code}\n")
    for line in tail(log, 3):
        print("   " + line, flush=True)
    if code != 0:
        r.failed.append("grading")


def part_refill(r: Runner) -> None:
    r.python("hardware_fill", 200, "scripts/gpu/hardware.py", r.results, "--fill-missing",
             "results/hardware_h200.json", "--budget-s", "150")
    r.python("pitfalls", 90, "scripts/gpu/pitfalls.py", r.results, "--budget-s", "60")


PARTS = {"tests": part_tests, "sweep": part_sweep, "scripts": part_scripts,
         "bench": part_bench, "model": part_model, "limits": part_limits, "labs": part_labs,
         "ncu": part_ncu, "grading": part_grading, "refill": part_refill}
NEEDS_GPU = {"tests", "sweep", "scripts", "bench", "model", "limits", "labs", "ncu", "refill"}


# ------------------------------------------------------------------ the graded class
ASSIGNMENT = "labfx"
SITE = Path("/tmp/site")


def _env_default(name: str, default):
    return os.environ.get(name) or default


def grade_synthetic_class(out, *, grading_env: str = "gpu", sandbox: str = "auto",
                sequential: str = "beside", workers=None, budget_s: float = 200,
                python: str = sys.executable, wheels: str = ".whl", keep_work: bool = False,
                log_path: Path | None = None, echo: bool = True, env: dict | None = None) -> int:
    """The instructor's grading of the synthetic class, run on this host and recorded as JSON.

    tests/fixtures/course is copied to a temporary folder; ``nbgrader generate_assignment
    labfx`` releases its lab, scripts/make_synthetic_class.py writes one submission per case
    (correct, partly wrong, empty, every cheat, every resource abuse, corrupt), as
    tests/test_grading.py does; then the parallel ``python3 -m autograde grade labfx`` grades
    the class (and nbgrader's sequential ``nbgrader autograde labfx`` grades a second copy,
    beside it or after it, for as long as the time budget allows), ``nbgrader
    generate_feedback labfx`` and ``nbgrader export`` follow.  Every student's score, status
    and reasons are compared with what this grading environment should give
    (scripts/gpu/grade_class_expected.py: tests/test_grading.py's EXPECTED, with the GPU-only
    cells graded when the environment is the GPU).

    Writes ``out``/grading_<grading_env>.json (scripts/gpu/grade_class_report.py),
    ``out``/grade_class.log (this function's log; ``log_path`` instead, where given) and
    ``out``/grading_logs.tgz (the steps' logs, the status ledgers, the autograded notebooks,
    one feedback page, grades.csv).  Returns 0 when every student is as expected and every
    check passed (feedback, export, sequential = parallel, nothing reached the grader's
    loopback), 1 otherwise, 2 when the run could not be set up.

    ``grading_env``: c.AutogradeSettings.environment (gpu, cpu or auto; the expected table
    is the one of the environment the log reports); ``sandbox``: auto, bwrap or none;
    ``sequential``: beside (its kernels under other uids), after or 0 (none); ``workers``:
    the parallel command's (None: on the CPU its own choice, otherwise half the cores, 2 to
    8, which leaves room for the sequential run and for Triton's compilations inside the
    lab's 5 s cells); ``budget_s``: the whole run, the sequential run stopped in time for the
    report; ``wheels``: the folder of wheels installed where nbgrader is missing.

    A host without nbgrader (the GPU machines: torch and Triton, no Jupyter) gets the wheels
    installed into /tmp/site and the repository put on PYTHONPATH; the grading kernels are
    given the same folders (c.AutogradeSettings.extra_python_paths).  Without bwrap,
    Debian's bubblewrap from ``wheels``/deb/ is unpacked into /tmp/bw.  ``sandbox="auto"``
    falls back to a plain kernel where bubblewrap cannot run; the JSON records the sandbox
    actually used.  ``env``: the environment of the steps (default: this process's)."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if workers is None and grading_env != "cpu":
        workers = min(8, max(2, (os.cpu_count() or 2) // 2))
    log_file = (log_path or out / "grade_class.log").open("a")
    started = time.monotonic()
    lock = threading.Lock()

    def say(text: str) -> None:
        with lock:
            log_file.write(text + "\n")
            log_file.flush()
            if echo:
                print(text, flush=True)

    try:
        return _grade_class(out, say, started, grading_env, sandbox, sequential, workers,
                            budget_s, python, Path(wheels), keep_work,
                            dict(os.environ if env is None else env))
    finally:
        log_file.close()


def _grade_class(out, say, started, grading_env, sandbox, sequential, workers, budget_s,
                 python, wheels: Path, keep_work, env) -> int:
    def elapsed() -> int:
        return int(time.monotonic() - started)

    def left() -> int:
        return int(budget_s) - elapsed()

    def up_to(seconds: int) -> int:
        """``seconds``, or what the budget leaves after 15 s for the report."""
        return min(seconds, left() - 15)

    if not (REPO / "tests/fixtures/course").is_dir() or \
            not (REPO / "scripts/make_synthetic_class.py").is_file():
        say("the repository's tests/fixtures/course or scripts/make_synthetic_class.py is missing")
        return 2
    work = Path(tempfile.mkdtemp(prefix="grade_class.", dir="/tmp"))
    logs = work / "logs"
    logs.mkdir()
    env["PYTHONUNBUFFERED"] = "1"
    wheels = wheels if wheels.is_absolute() else REPO / wheels

    def step(name: str, limit: int, cwd: Path, *command, extra_env=None) -> int:
        """Run ``command`` in ``cwd`` under a time limit, its output in logs/NAME.log;
        steps.tsv gets NAME, exit status, milliseconds and the command."""
        limit = max(10, limit)
        t0 = time.monotonic()
        shown = " ".join(map(str, command))
        say(f"== {datetime.datetime.now():%H:%M:%S} (+{elapsed()} s) {name} (limit {limit} s): "
            f"{shown}")
        code = run_step([str(c) for c in command], logs / f"{name}.log", limit, cwd=cwd,
                        env=dict(env, **(extra_env or {})))
        ms = int((time.monotonic() - t0) * 1000)
        with lock_tsv:
            with (work / "steps.tsv").open("a") as tsv:
                tsv.write(f"{name}\t{code}\t{ms}\t{shown}\n")
        (work / f"{name}.rc").write_text(f"{code}\n")
        for line in tail(logs / f"{name}.log", 4):
            say(f"   [{name}] {line}")
        say(f"   [{name}] exit {code} after {ms // 1000} s")
        return code

    lock_tsv = threading.Lock()

    def quiet(*command, cwd="/", drop_pythonpath=False) -> bool:
        """Whether ``command`` exits 0 (run from / so that the repository is not found by
        accident, and without PYTHONPATH where asked)."""
        run_env = {k: v for k, v in env.items() if not (drop_pythonpath and k == "PYTHONPATH")}
        return subprocess.run(list(command), cwd=cwd, env=run_env, capture_output=True
                              ).returncode == 0

    def prepend(name: str, value: str) -> None:
        env[name] = value + (os.pathsep + env[name] if env.get(name) else "")

    say(f"== grade_class: environment {grading_env}, sandbox {sandbox}, sequential "
        f"{sequential}, budget {budget_s:.0f} s, work folder {work}")

    # 1. nbgrader and the course's packages, for this process and for the grading kernels
    installed, kernel_paths = "none", []
    if quiet(python, "-c", "import nbgrader, ipykernel") \
            and not quiet(python, "-c", "import nbgrader, ipykernel", drop_pythonpath=True) \
            and (SITE / "nbgrader").is_dir():
        # already installed from the wheels by the caller (scripts/gpu/check.py): the kernels
        # need the same folder, since the sandbox gives them a PYTHONPATH of their own
        installed = f"{wheels.name} -> {SITE} (by the caller)"
        kernel_paths.append(str(SITE))
    elif not quiet(python, "-c", "import nbgrader"):
        found = sorted(wheels.glob("*.whl"))
        if not found:
            say(f"nbgrader is not installed and {wheels}/ holds no wheels")
            return 2
        if step("wheels", 180, REPO, python, "-m", "pip", "install", "-q", "--no-index",
                "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade", "--target",
                SITE, *found) != 0:
            return 2
        prepend("PYTHONPATH", str(SITE))
        prepend("PATH", str(SITE / "bin"))
        # nbconvert's templates (the feedback pages) are data files: /tmp/site/share/jupyter
        prepend("JUPYTER_PATH", str(SITE / "share" / "jupyter"))
        installed = f"{wheels.name} -> {SITE}"
        kernel_paths.append(str(SITE))
    # Installed packages (pip install -e .) reach the kernels through the interpreter's own
    # site-packages; packages found only through PYTHONPATH (a GPU host without an install)
    # do not, since the sandbox's kernels get a PYTHONPATH of their own: link them.
    if not quiet(python, "-c", "import importlib.util as u, sys; sys.exit(not ("
                 "u.find_spec('autograde') and u.find_spec('source_kernels')))",
                 drop_pythonpath=True):
        env["PYTHONPATH"] = (env["PYTHONPATH"] + os.pathsep if env.get("PYTHONPATH") else "") \
            + str(REPO)
        # the kernels see the two packages only, not the whole repository
        (work / "pkgs").mkdir()
        for package in ("autograde", "source_kernels"):
            (work / "pkgs" / package).symlink_to(REPO / package)
        kernel_paths.append(str(work / "pkgs"))
    if not shutil.which("alembic", path=env.get("PATH")):
        say("   warning: no alembic executable on PATH (nbgrader runs it to create the gradebook)")

    # 2. bubblewrap
    bwrap = shutil.which("bwrap", path=env.get("PATH"))
    debs = wheels / "deb"
    if bwrap is None and list(debs.glob("bubblewrap_*.deb")):
        bw = Path("/tmp/bw")
        bw.mkdir(exist_ok=True)
        subprocess.run(["dpkg", "-x", str(next(debs.glob("bubblewrap_*.deb"))), str(bw)],
                       check=False)
        known = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
        libs = ""
        for library, package in (("libcap.so.2", "libcap2"), ("libselinux.so.1", "libselinux1")):
            deb = sorted(debs.glob(f"{package}_*.deb"))
            if library not in known and deb:
                subprocess.run(["dpkg", "-x", str(deb[0]), str(bw)], check=False)
                libs = f"{bw}/lib/x86_64-linux-gnu:{bw}/usr/lib/x86_64-linux-gnu"
        (bw / "bin").mkdir(exist_ok=True)
        wrapper = bw / "bin" / "bwrap"
        wrapper.unlink(missing_ok=True)
        if libs:        # bwrap clears the environment of what it starts
            wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH={libs} exec {bw}/usr/bin/bwrap "$@"\n')
            wrapper.chmod(0o755)
        else:
            wrapper.symlink_to(bw / "usr" / "bin" / "bwrap")
        prepend("PATH", str(bw / "bin"))
        bwrap = (f"{wrapper} (Debian's bubblewrap from {wheels.name}/deb"
                 f"{', with its libraries' if libs else ''})")
        say(f"   bubblewrap unpacked: {bwrap}")
    check = subprocess.run([python, "-m", "autograde.isolation.sandbox", "check"], cwd=REPO, env=env,
                           capture_output=True, text=True)
    for line in (check.stdout + check.stderr).splitlines():
        say("   " + line)

    command = (f"python3 scripts/gpu/run.py grading --out OUTDIR --grading-env {grading_env} "
               f"--sandbox {sandbox} --sequential {sequential} --grading-budget-s {budget_s:.0f}"
               + (f" --workers {workers}" if workers else ""))
    (work / "settings.json").write_text(json.dumps(
        {"command": command, "grading_env": grading_env, "sandbox": sandbox,
         "sequential": sequential, "workers": str(workers) if workers else None,
         "budget_s": int(budget_s), "wheels_installed": installed, "bwrap": bwrap or "none"},
        indent=1))

    # 3. the course: the fixture, the grading environment, the kernels' import path
    par, seq = work / "par", work / "seq"

    def add_config(course: Path, *lines: str) -> None:
        with (course / "nbgrader_config.py").open("a") as handle:
            handle.write("\n# --- set by scripts/gpu/run.py (grading)\n")
            handle.write("".join(line + "\n" for line in lines))

    shutil.copytree(REPO / "tests/fixtures/course", par,
                    ignore=shutil.ignore_patterns("__pycache__"))
    add_config(par, f'c.AutogradeSettings.environment = "{grading_env}"',
               f'c.AutogradeSettings.sandbox = "{sandbox}"',
               "c.AutogradeSettings.extra_python_paths = "
               f"list(c.AutogradeSettings.extra_python_paths) + {json.dumps(kernel_paths)}",
               "c.AutogradeSettings.similarity_threshold = 0  # as tests/test_grading.py: "
               "scores and statuses")
    if step("generate_assignment", 120, par, python, "-m", "nbgrader", "generate_assignment",
            ASSIGNMENT) != 0:
        return 2
    # one grading kernel of this configuration: its uid, network, limits, GPU
    step("probe", 90, par, python, "-m", "autograde", "probe")

    # a listener on the grader's loopback: read_secrets tries it; no kernel may reach it
    canary = socket.socket()
    canary.bind(("127.0.0.1", 0))
    canary.listen(8)
    canary_file = work / "canary.txt"
    canary_file.write_text("")

    def listen() -> None:
        while True:
            try:
                conn, address = canary.accept()
            except OSError:
                return
            with canary_file.open("a") as handle:
                handle.write("%s:%s\n" % address)
            conn.close()

    threading.Thread(target=listen, daemon=True).start()
    try:
        if step("synthetic_class", 120, par, python, REPO / "scripts/make_synthetic_class.py",
                ".", "--canary-port", canary.getsockname()[1]) != 0:
            return 2

        # 4. grading: the sequential run on a copy (beside: its kernels under other uids)
        beside = None
        if sequential != "0":
            shutil.copytree(par, seq, symlinks=True)
            if sequential == "beside":
                add_config(seq, "c.AutogradeSettings.kernel_uid = 64623")
        if sequential == "beside":
            beside = threading.Thread(target=step, args=(
                "sequential", left() - 35, seq, python, "-m", "nbgrader", "autograde",
                ASSIGNMENT))
            beside.start()
        step("parallel", left() - 25, par, python, "-m", "autograde", "grade", ASSIGNMENT,
             "--json", work / "par_summary.json",
             *(["--workers", str(workers)] if workers else []))
        step("generate_feedback", up_to(60), par, python, "-m", "nbgrader", "generate_feedback",
             ASSIGNMENT)
        step("export", up_to(60), par, python, "-m", "nbgrader", "export", "--to",
             work / "grades.csv")
        if beside is not None:
            beside.join()
        elif sequential == "after":
            step("sequential", left() - 15, seq, python, "-m", "nbgrader", "autograde",
                 ASSIGNMENT)
    finally:
        canary.close()

    # 5. the record
    record = out / f"grading_{grading_env}.json"
    code = step("report", 60, REPO, python, "scripts/gpu/grade_class_report.py", work, record,
                extra_env={"GRADE_CLASS_ELAPSED_S": str(elapsed())})
    for line in (logs / "report.log").read_text(errors="replace").splitlines()[:40]:
        say(line)
    with tarfile.open(out / "grading_logs.tgz", "w:gz") as archive:
        for item in ("logs", "steps.tsv", "settings.json", "par_summary.json", "grades.csv",
                     "canary.txt", "par/autograde_status", "par/autograded",
                     "par/feedback/partly_wrong", "seq/autograde_status"):
            if (work / item).exists():
                archive.add(work / item, arcname=item)
    say(f"== done in {elapsed()} s: {record}")
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    if code != 0:
        return 2
    result = json.loads(record.read_text())
    return 0 if result["all_as_expected"] and result["all_checks_passed"] else 1


# ---------------------------------------------------------------------------------- main
def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="parts: " + ", ".join(PARTS) + "; all = " + " ".join(ALL))
    parser.add_argument("parts", nargs="*", metavar="PART",
                        help="parts to run, in the order given ('all': " + " ".join(ALL) + ")")
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_out"),
                        help="folder of the archive (default $OUT or /tmp/gpu_out)")
    parser.add_argument("--budget-s", type=float, default=float(_env_default("BUDGET", 570)),
                        help="seconds for the whole call; each step is cut to fit (default 570)")
    parser.add_argument("--state", type=Path, default=STATE,
                        help="folder kept between calls: results/, logs/, triton_cache/ "
                             "(default .gpu_state)")
    parser.add_argument("--test-workers", type=int,
                        default=int(_env_default("TEST_WORKERS", 8)),
                        help="pytest-xdist workers of the tests part (default 8)")
    grading = parser.add_argument_group(
        "grading part", "each option's default is taken from the environment variable named "
        "in its help, where set")
    grading.add_argument("--grading-env", choices=("gpu", "cpu", "auto"),
                         default=_env_default("GRADING_ENV", "gpu"),
                         help="c.AutogradeSettings.environment of the run (GRADING_ENV; gpu)")
    grading.add_argument("--sandbox", choices=("auto", "bwrap", "none"),
                         default=_env_default("SANDBOX", "auto"),
                         help="c.AutogradeSettings.sandbox (SANDBOX; auto)")
    grading.add_argument("--sequential", choices=("beside", "after", "0"),
                         default=_env_default("SEQUENTIAL", "beside"),
                         help="nbgrader's sequential autograde on a second copy: beside the "
                              "parallel command, after it, or 0 for none (SEQUENTIAL; beside)")
    grading.add_argument("--workers", type=int, default=_env_default("WORKERS", None),
                         help="workers of the parallel command (WORKERS; on the CPU its own "
                              "choice, otherwise half the cores, 2 to 8)")
    grading.add_argument("--grading-budget-s", type=float,
                         default=float(_env_default("BUDGET_S", 200)),
                         help="seconds for the grading run, the report included (BUDGET_S; 200)")
    grading.add_argument("--python", default=_env_default("PYTHON", sys.executable),
                         help="the interpreter of the steps (PYTHON; this one)")
    grading.add_argument("--wheels", default=_env_default("WHEELS", ".whl"),
                         help="wheels installed into /tmp/site where nbgrader is missing, "
                              "Debian packages of bubblewrap in its deb/ (WHEELS; .whl)")
    grading.add_argument("--keep-work", action="store_true",
                         default=bool(os.environ.get("KEEP_WORK")),
                         help="keep the temporary course folders, /tmp/grade_class.* "
                              "(KEEP_WORK)")
    args = parser.parse_args(argv)
    if args.workers is not None:
        args.workers = int(args.workers)
    parts = [p for name in args.parts for p in (ALL if name == "all" else [name])]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; --list shows them")
    if not parts and not args.list:
        parser.error("name at least one PART ('all' for every part but refill)")
    args.parts = parts
    return args


SUMMARY = {
    "tests": "the GPU tests (pytest on tests/test_operator, spec, launch, model)",
    "sweep": "the launch sweep -> sweep_h200.json; its plan written into source_kernels/",
    "scripts": "scripts/gpu/hardware.py -> hardware_h200.json, grading_replay.py",
    "bench": "python -m source_kernels.bench --fast -> bench_h200.json",
    "model": "scripts/gpu/model_training.py -> model_h200.json",
    "limits": "scripts/gpu/decoder_limits.py, dispatch_profile.py",
    "labs": "scripts/gpu/lab06_tiling.py, lab09_cliff.py",
    "ncu": "Nsight Compute on scripts/gpu/ncu_cases.py -> ncu_h200.csv, ncu_h200.json",
    "grading": "the synthetic class graded -> grading_<env>.json (nbgrader from .whl/)",
    "refill": "hardware.py --fill-missing, pitfalls.py -> pitfalls_h200.json",
}


def describe() -> str:
    return "\n".join(
        f"{name:8s} {'(in all)' if name in ALL else '(not in all)':13s} "
        f"{'CUDA GPU' if name in NEEDS_GPU else 'CPU or GPU':11s} {SUMMARY[name]}"
        for name in PARTS)


def main(argv=None) -> int:
    args = parse(argv)
    if args.list:
        print(describe())
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(args.budget_s, state=args.state.resolve(), test_workers=args.test_workers)
    gpu, why = has_cuda() if NEEDS_GPU & set(args.parts) else (True, "")
    runner.versions()
    for part in args.parts:
        if part in NEEDS_GPU and not gpu:
            runner.say(f"{part}: skipped, {why} (this part measures a CUDA GPU)")
            runner.skipped.append(part)
            continue
        if part == "grading":
            part_grading(runner, args)
        else:
            PARTS[part](runner)
    runner.say("done" + (f"; not passed: {', '.join(runner.failed)}" if runner.failed else "")
               + (f"; skipped: {', '.join(runner.skipped)}" if runner.skipped else ""))
    archive = out / f"gpu_run_{'_'.join(args.parts)}.tgz"
    with tarfile.open(archive, "w:gz") as handle:
        for folder in ("results", "logs"):
            handle.add(runner.state / folder, arcname=folder)
    print(f"{archive} ({archive.stat().st_size} bytes)", flush=True)
    return 1 if runner.failed else 0


if __name__ == "__main__":
    sys.exit(main())
