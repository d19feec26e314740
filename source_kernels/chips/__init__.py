"""Builtin chips: the reference solution of every lab stage, importable by the student.

``source_kernels.chips.labNN`` holds what lab NN asks you to build.  A lab's setup cell
imports only the chips of earlier labs, so if an earlier stage of yours is broken you can
build on the chip instead and carry on.  Where the operator package already has the answer,
the chip re-exports it rather than copying it.  A graded function must do its own work:
the hidden checks fail a function that merely calls a chip.

The modules are not imported here: ``import source_kernels.chips.lab01`` loads only that one.
"""
