"""``python -m autograde probe``: start one grading kernel the way autograde does and report
what it can reach."""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading

import nbformat

__all__ = ["probe", "PROBE_CODE"]

PROBE_CODE = r'''
import json, os, resource, socket
r = {}
r["uid"] = os.getuid()
r["cwd"] = os.getcwd()
def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "REACHABLE"
    except OSError as e:
        return f"unreachable ({e.__class__.__name__})"
r["loopback to the grader"] = reach("127.0.0.1", PORT)
try:
    socket.getaddrinfo("pypi.org", 443)
    r["dns"] = "RESOLVES"
except OSError as e:
    r["dns"] = f"fails ({e.__class__.__name__})"
for label, path in PATHS.items():
    r[label] = "VISIBLE" if os.path.exists(path) else "not visible"
names = {"RLIMIT_AS": "address space", "RLIMIT_NPROC": "processes", "RLIMIT_CPU": "cpu s",
         "RLIMIT_FSIZE": "file size"}
r["limits"] = {v: resource.getrlimit(getattr(resource, k))[0] for k, v in names.items()}
try:
    block = bytearray(8 * 2 ** 30)
    r["8 GiB allocation"] = "ALLOWED"
    del block
except MemoryError:
    r["8 GiB allocation"] = "refused (MemoryError)"
import torch
r["torch.cuda.is_available()"] = torch.cuda.is_available()
r["TRITON_INTERPRET"] = os.environ.get("TRITON_INTERPRET")
print(json.dumps(r))
'''


def probe(root, settings, environment=None):
    """Run PROBE_CODE in a grading kernel; returns its findings (a dict)."""
    from ..compat.nbclient_compat import NotebookClient
    from ..config import resolve_environment
    from ..pipeline.execute import resolve_sandbox
    from ..isolation.kernel import KernelSetup
    environment = environment or resolve_environment(settings)
    mode = resolve_sandbox(settings)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    port = listener.getsockname()[1]
    contacted = []

    def accept():
        listener.settimeout(30)
        try:
            conn, _ = listener.accept()
            contacted.append(True)
            conn.close()
        except OSError:
            pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    paths = {"gradebook.db": os.path.join(root, "gradebook.db"),
             "course folder": os.path.join(root, "nbgrader_config.py"),
             "source notebooks": os.path.join(root, "assignments"),
             "submissions": os.path.join(root, "submitted")}
    code = PROBE_CODE.replace("PORT", str(port)).replace("PATHS", repr(paths))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    setup = KernelSetup(mode=mode, environment=environment, settings=settings,
                        seed=secrets.token_hex(8))
    try:
        km = setup.kernel_manager()
        client = NotebookClient(nb, km=km, timeout=120, startup_timeout=120)
        client.execute()
    finally:
        setup.cleanup()
        listener.close()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout")
    errors = [o for o in nb.cells[0].outputs if o.get("output_type") == "error"]
    if errors or not text.strip():
        raise RuntimeError(f"probe failed: {errors or nb.cells[0].outputs}")
    result = {"sandbox": mode, "environment": environment}
    result.update(json.loads(text.strip().splitlines()[-1]))
    result["grader saw a connection"] = bool(contacted)
    return result
