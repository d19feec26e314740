"""Every results file against the JSON Schema of its kind (results/schemas/).

A schema names the files it covers by the pattern under ``x-results-files``; every committed
``results/*.json`` must be covered by exactly one, and be valid against it.  Each schema
requires the ``provenance`` block with its keys (a file without it is rejected) and the
top-level structure the book and the tests read.  The scripts that can run on a CPU (the labs'
GPU scripts' ``--dry-run-cpu``) write files that the same schemas accept, so a script whose
output drifts from what the book reads fails here before it reaches a GPU host.
"""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
SCHEMAS = RESULTS / "schemas"
COMMITTED = sorted(RESULTS.glob("*.json"))


def _schemas() -> dict[str, dict]:
    return {path.name.removesuffix(".schema.json"): json.loads(path.read_text())
            for path in sorted(SCHEMAS.glob("*.schema.json"))}


def schema_for(name: str) -> tuple[str, dict]:
    """(kind, schema) of the results file called ``name``; fails unless exactly one schema
    covers it."""
    found = [(kind, schema) for kind, schema in _schemas().items()
             if re.match(schema["x-results-files"], name)]
    assert len(found) == 1, (f"results/{name} is covered by {len(found)} schemas "
                             f"({', '.join(k for k, _ in found) or 'none'}); add its kind to "
                             "results/schemas/ or narrow a pattern")
    return found[0]


def without_provenance(data: dict) -> dict:
    """``data`` with every provenance block taken out (the top-level one, or each run's
    where a file keeps one per run)."""
    stripped = copy.deepcopy(data)
    removed = stripped.pop("provenance", None) is not None
    for run in stripped.get("runs", []) if "provenance" not in data else []:
        if isinstance(run, dict) and run.pop("provenance", None) is not None:
            removed = True
    assert removed, "the file has no provenance block to take out"
    return stripped


def test_every_schema_is_a_valid_schema_and_covers_a_committed_file():
    schemas = _schemas()
    assert len(schemas) >= 20
    names = [path.name for path in COMMITTED]
    for kind, schema in schemas.items():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["properties"].get("provenance") or \
            schema["properties"]["runs"]["items"]["properties"]["provenance"], kind
        assert any(re.match(schema["x-results-files"], name) for name in names), (
            f"results/schemas/{kind}.schema.json covers no committed results file")


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_results_file_is_valid_against_its_schema(path):
    _, schema = schema_for(path.name)
    jsonschema.validate(json.loads(path.read_text()), schema)


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_a_results_file_without_its_provenance_is_rejected(path):
    _, schema = schema_for(path.name)
    with pytest.raises(jsonschema.ValidationError, match="'provenance' is a required property"):
        jsonschema.validate(without_provenance(json.loads(path.read_text())), schema)


def test_a_provenance_block_missing_a_key_is_rejected():
    data = json.loads((RESULTS / "hardware_h200.json").read_text())
    _, schema = schema_for("hardware_h200.json")
    del data["provenance"]["repository_commit"]
    with pytest.raises(jsonschema.ValidationError, match="'repository_commit'"):
        jsonschema.validate(data, schema)
    data = json.loads((RESULTS / "bench_h200.json").read_text())
    data["provenance"].pop("command")
    _, schema = schema_for("bench_h200.json")
    with pytest.raises(jsonschema.ValidationError, match="'command'"):
        jsonschema.validate(data, schema)


def test_a_results_file_of_no_known_kind_has_no_schema():
    with pytest.raises(AssertionError, match="covered by 0 schemas"):
        schema_for("throughput_of_something_new_h200.json")


def test_the_writer_gives_every_key_the_gpu_scripts_schemas_require():
    """The provenance block as source_kernels.provenance writes it on this machine (a CPU:
    its GPU fields None) satisfies the provenance part of every schema of a scripts/gpu
    script's results."""
    from source_kernels.provenance import KEYS, provenance

    block = provenance("python3 scripts/gpu/hardware.py OUTDIR")
    assert list(block)[:len(KEYS)] == list(KEYS)
    assert block["gpu"].startswith("none") and block["compute_capability"] is None
    for kind, schema in _schemas().items():
        if "scripts/gpu/" not in schema["description"] or kind in ("grading", "ncu"):
            continue
        jsonschema.validate(block, schema["properties"]["provenance"])


def _script(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_writer_{path.stem}", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cpu_tools_write_the_course_block_with_their_host():
    """The tools that measure on the CPU write source_kernels.provenance's block, the CPU's
    side in ``host``, and their own keys; each block passes its file's schema."""
    from source_kernels.provenance import KEYS

    loads = {"before": 0.5, "after": 1.0}
    blocks = {
        "grading_throughput.json": _script(Path("scripts/bench_grading.py")).provenance(["-x"]),
        "hub_scale_host.json": _script(Path("scripts/hub/scale.py")).run_provenance(["-x"],
                                                                                    loads),
    }
    import mutate_labs
    mutants = mutate_labs.provenance(["--labs", "lab00"], seed=24)
    for name, block in [*blocks.items(), ("mutants", mutants)]:
        assert list(block)[:len(KEYS)] == list(KEYS), name
        assert set(block["host"]) == {"cpu", "cores", "memory_mib"}, name
        assert block["host"]["cores"] >= 1, name
    assert mutate_labs.commit_of(mutants) == mutants["repository_commit"]
    assert mutants["seed"] == 24 and blocks["hub_scale_host.json"]["load_average_1_5_15min"]
    for name, block in blocks.items():
        _, schema = schema_for(name)
        holder = schema["properties"]
        part = holder["provenance"] if "provenance" in holder else \
            holder["runs"]["items"]["properties"]["provenance"]
        jsonschema.validate(block, part)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({k: v for k, v in block.items() if k != "repository_commit"},
                                part)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["lab08_race", "lab09_cliff", "lab06_tiling"])
def test_a_dry_run_writes_what_the_schema_accepts(tmp_path, script):
    """The labs' GPU scripts in Triton's interpreter (tiny inputs, 15-50 s on two cores):
    their file is marked as a dry run (the book never quotes it) and has the schema's
    shape, provenance included."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, f"scripts/gpu/{script}.py", str(tmp_path),
                           "--dry-run-cpu", "--budget-s", "60"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / f"{script}.json").read_text())
    assert data["dry_run"] is True
    assert data["provenance"]["gpu"].startswith("none (dry run")
    _, schema = schema_for(f"{script}.json")
    jsonschema.validate(data, schema)
