"""nbclient internals the grading kernel's executor uses, written against nbclient 0.11.0
(pinned in requirements.txt).

:class:`autograde.pipeline.execute.SandboxedExecute` is an nbclient ``NotebookClient`` (through
nbgrader's ``Execute`` and nbconvert's ``ExecutePreprocessor``) that runs its own loop over
the cells.  It needs three things nbclient does not document:

- ``nbclient.util``'s ``run_sync`` and ``ensure_async`` (the bridge between the
  preprocessor's synchronous call and the client's coroutines);
- ``_async_cleanup_kernel``, to stop a kernel between two incarnations;
- ``_async_handle_timeout``, the point where a cell past its time limit is interrupted, which
  :class:`TimeoutHook` turns into the method ``on_cell_timeout``.
"""
from __future__ import annotations

from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async, run_sync

__all__ = ["CellTimeoutError", "DeadKernelError", "NotebookClient", "TimeoutHook",
           "cleanup_kernel", "ensure_async", "run_sync"]


async def cleanup_kernel(client) -> None:
    """Shut the client's kernel down and close its channels (``km`` and ``kc`` stay set)."""
    await client._async_cleanup_kernel()


class TimeoutHook:
    """Mixed in before a ``NotebookClient`` subclass: ``on_cell_timeout()`` runs when a cell
    has run past ``timeout``, before nbclient interrupts the kernel."""

    def on_cell_timeout(self) -> None:
        """Called once per timeout, before the interrupt."""

    async def _async_handle_timeout(self, timeout, cell=None):
        self.on_cell_timeout()
        return await super()._async_handle_timeout(timeout, cell)
