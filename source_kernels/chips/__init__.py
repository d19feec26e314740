"""Builtin chips: the reference solution of every lab stage, importable by the student.

``source_kernels.chips.labNN`` holds what lab NN asks you to build.  A lab's setup cell
imports only the chips of earlier labs, so if an earlier stage of yours is broken you can
build on the chip instead and carry on.  Where the operator package already has the answer,
the chip re-exports it rather than copying it.

A graded function must do its own work, with one rule for the chips: graded code of lab N may
call the chips of earlier labs that lab N imports (its first cell lists them, and each chip
module's docstring says in which labs), never a chip of lab N itself and never the course's
reference; a check, the visible one too, fails a function that breaks the rule and says why.

The modules are not imported here: ``import source_kernels.chips.lab01`` loads only that one.
"""
