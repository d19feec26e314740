"""The grading kernel's view of the course packages (autograde/isolation/view.py, autograde/labs.py):
built for every lab, it holds what the lab's notebook and checks import and none of what
scores: the reference, the operator's kernels and wrapper, the graded lab's chips."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograde import labs
from autograde.isolation import view

REPO = Path(__file__).resolve().parents[1]
LABS = sorted(p.name for p in (REPO / "assignments").iterdir() if p.name.startswith("lab"))
NEVER = ("source_kernels/reference.py", "source_kernels/op.py", "source_kernels/validate.py",
         "source_kernels/traced.py", "source_kernels/bench.py", "source_kernels/model.py",
         "autograde/checks/diagnose.py")
# the engine but what a check uses in the kernel (check_api, trust, compat): the pipeline
# (the verification among it), the isolation layer and the runner
NEVER_FOLDERS = ("autograde/pipeline/", "autograde/isolation/", "autograde/runner/")


def _defined(folder):
    """{top-level name defined in a staged file: [files]}."""
    names = {}
    for path in Path(folder).rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.setdefault(node.name, []).append(str(path.relative_to(folder)))
    return names


def _notebook_imports(lab):
    """Names the lab's notebook imports from the course's operator package (its tools)."""
    nb = json.loads((REPO / "assignments" / lab / f"{lab}.ipynb").read_text())
    names = set()
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse("".join(cell["source"]))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("source_kernels"):
                names |= {a.name for a in node.names}
    return names


def _graded_chip_names(lab):
    number = labs.lab_number(lab)
    tree = ast.parse((REPO / "source_kernels" / "chips" / f"lab{number:02d}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


@pytest.mark.parametrize("lab", LABS)
def test_view_holds_no_answer(tmp_path, lab):
    folder = view.stage(lab, str(tmp_path / "view"))
    files = {str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file()}
    assert not [f for f in files if f in NEVER or f.startswith(NEVER_FOLDERS)
                or "__pycache__" in f or f.endswith(".pyc")]
    number = labs.lab_number(lab)
    assert f"source_kernels/chips/lab{number:02d}.py" not in files
    defined = _defined(folder)
    # the graded chips' own definitions are nowhere (names also in an earlier lab's chips,
    # which that lab's view legitimately holds, aside)
    earlier = set()
    for n in range(number):
        if f"source_kernels/chips/lab{n:02d}.py" in files:
            earlier |= _graded_chip_names(f"lab{n:02d}")
    leaked = {name: defined[name] for name in _graded_chip_names(lab) - earlier -
              _notebook_imports(lab) if name in defined}
    assert not leaked, leaked
    # the reference's MSDA functions only where a chip of an earlier lab re-exports them
    if number not in (1, 2, 4, 5, 7):
        assert "msda_naive" not in defined and "msda_grid_sample" not in defined


def test_every_view_imports_without_the_reference(tmp_path):
    """In one fresh interpreter, with only the view on the path (the editable install's
    finder removed, as the sandbox has no course folder to find): every module of each
    lab's view imports, and the reference, the operator and the graded chips do not."""
    folders = {lab: view.stage(lab, str(tmp_path / lab)) for lab in LABS}
    script = r'''
import importlib, json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ and
                    "editable" not in getattr(f, "__module__", "") and
                    "editable" not in getattr(f, "__name__", "")]
import torch, triton  # noqa: F401
out = {}
for lab, (folder, modules, absent) in json.loads(sys.argv[1]).items():
    for name in [m for m in sys.modules if m.split(".")[0] in ("source_kernels", "autograde")]:
        del sys.modules[name]
    sys.path.insert(0, folder)
    importlib.invalidate_caches()
    failed, present = [], []
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as exc:
            failed.append(f"{m}: {type(exc).__name__}: {exc}")
    for m in absent:
        try:
            importlib.import_module(m)
            present.append(m)
        except ImportError:
            pass
    sys.path.remove(folder)
    out[lab] = {"failed": failed, "present": present}
print(json.dumps(out))
'''
    plan = {}
    for lab, folder in folders.items():
        number = labs.lab_number(lab)
        absent = ["source_kernels.reference", "source_kernels.op", "source_kernels.validate",
                  f"source_kernels.chips.lab{number:02d}", "autograde.checks.diagnose"]
        plan[lab] = [folder, sorted(labs.kernel_view(lab)), absent]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(plan)], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    problems = {lab: r for lab, r in result.items() if r["failed"] or r["present"]}
    assert not problems, problems


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="the interpreter runs only where there is no GPU")
def test_the_views_switch_picks_the_interpreter_and_installs_its_shortcuts(tmp_path):
    """The grading kernel imports the view's ``source_kernels`` (the switch), not the
    package's: on a CPU it picks the interpreter and installs the same shortcuts
    (``source_kernels.triton_compat.interpreter_shortcuts``) from the view's own copy."""
    folder = view.stage("lab08_concurrent_writes", str(tmp_path / "view"))
    script = r'''
import json, os, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ and
                    "editable" not in getattr(f, "__module__", "") and
                    "editable" not in getattr(f, "__name__", "")]
sys.path.insert(0, sys.argv[1])
import source_kernels
from source_kernels import triton_compat
interp = triton_compat.interpreter()
print(json.dumps({"mode": os.environ.get("TRITON_INTERPRET"), "file": triton_compat.__file__,
                  "once_per_launch": getattr(interp._patch_lang, "_once_per_launch", False),
                  "overflow_checks": interp.interpreter_builder.options.sanitize_overflow,
                  "remembered": getattr(interp._get_np_dtype, "_remembered", False)}))
'''
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", script, folder], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(folder), got
    assert got == {"mode": "1", "file": got["file"], "once_per_launch": True,
                   "overflow_checks": False, "remembered": True}
