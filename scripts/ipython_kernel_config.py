# Configuration for the Jupyter kernels of the course's virtual environment.
#
# `make setup` copies this file to .venv/etc/ipython/, where every IPython kernel started from
# that environment reads it (the chapters run by `jupyter-book build`, the labs' checks run by
# nbclient and nbgrader, JupyterLab's kernels).
#
# ipykernel 7 logs "Kernel is running over TCP without encryption..." at start-up whenever the
# kernel manager gives it a TCP connection without CurveZMQ keys, which is what
# jupyter-book/myst-nb, nbclient and nbgrader do.  Here every kernel listens on 127.0.0.1 only,
# started by a process of the same user on the same machine, so the message says nothing
# actionable; it would be printed once for every notebook a build or a test runs.  This filter
# drops that one message and nothing else: every other log line of the kernel stays.
import logging


class _DropLoopbackTcpNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Kernel is running over TCP without encryption")


logging.getLogger("IPKernelApp").addFilter(_DropLoopbackTcpNotice())
