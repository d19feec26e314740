"""The figure style of the course book: every chapter imports this, so that the same thing
has the same colour on every page.  It also shows source code as highlighted blocks.

Chapters live in ``book/chapters/`` and run there, so they put ``book/`` on ``sys.path``
first::

    import sys
    sys.path.insert(0, "..")
    import _figures
    _figures.use_course_style()
"""
from __future__ import annotations

import matplotlib as mpl

# One colour per pyramid level, finest (level 0, stride 8) first.  The Okabe-Ito palette:
# distinguishable with the common forms of colour blindness and in greyscale print.
LEVEL_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7")

# Colours for memory figures: a sector a warp had to fetch, the bytes it actually used,
# and memory it never touched.
SECTOR_FETCHED = "#D55E00"
BYTES_USED = "#0072B2"
UNTOUCHED = "#EEEEEE"
REFERENCE_POINT = "#000000"
NEUTRAL = "#777777"


def level_color(level: int) -> str:
    """The colour of pyramid level ``level`` (0 = finest)."""
    return LEVEL_COLORS[level % len(LEVEL_COLORS)]


def level_label(level: int, height: int | None = None, width: int | None = None) -> str:
    """'level 0 (100 x 167)' style labels, the same in every legend."""
    if height is None or width is None:
        return f"level {level}"
    return f"level {level} ({height} \u00d7 {width})"


def use_course_style() -> None:
    """Matplotlib defaults for the book: SVG output, readable fonts, light grids."""
    mpl.rcParams.update({
        "figure.dpi": 100,
        "figure.figsize": (7.5, 3.6),
        "font.size": 10,
        "axes.titlesize": 10.5,
        "axes.labelsize": 10,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": False,
        "grid.color": "#DDDDDD",
        "legend.frameon": False,
        "legend.fontsize": 9,
        "savefig.bbox": "tight",
        "svg.fonttype": "path",        # glyphs as paths: the SVG needs no font at view time
    })
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # pragma: no cover - outside Jupyter
        return
    shell = get_ipython()
    if shell is not None:
        # inline figures even if MPLBACKEND (say, agg on a CI machine) picked another
        # backend: otherwise plt.show() would draw nothing into the page
        shell.run_line_magic("matplotlib", "inline")
        set_matplotlib_formats("svg")


def show_source(obj_or_text, first: str | None = None, last: str | None = None) -> None:
    """Display Python source as a highlighted code block.

    ``obj_or_text`` is a function/class/module (its source is read with ``inspect``), a
    ``@triton.jit`` kernel, or a string.  With ``first``/``last``, only the lines from the first line containing
    ``first`` to the first later line containing ``last`` (inclusive) are shown; a
    ``ValueError`` names the marker that is missing, so a chapter that reads code line by
    line fails loudly when that code changes under it.
    """
    import inspect
    import textwrap

    from IPython.display import Markdown, display

    obj = obj_or_text
    # a @triton.jit kernel (compiled or interpreted) wraps the Python function in .fn
    while not isinstance(obj, str) and not inspect.isroutine(obj) and hasattr(obj, "fn"):
        obj = obj.fn
    text = obj if isinstance(obj, str) else inspect.getsource(obj)
    lines = text.splitlines()
    start, stop = 0, len(lines)
    if first is not None:
        hits = [i for i, line in enumerate(lines) if first in line]
        if not hits:
            raise ValueError(f"no line contains {first!r}")
        start = hits[0]
    if last is not None:
        hits = [i for i, line in enumerate(lines) if i >= start and last in line]
        if not hits:
            raise ValueError(f"no line after {first!r} contains {last!r}")
        stop = hits[0] + 1
    shown = textwrap.dedent("\n".join(lines[start:stop]))
    display(Markdown("```python\n" + shown + "\n```"))


def show_contract(func) -> None:
    """Display a function's signature and docstring, without its body.

    The chapters use this for functions that a lab asks the student to write: the contract
    is part of the course, the body is the lab's answer.
    """
    import inspect

    from IPython.display import Markdown, display

    doc = inspect.getdoc(func) or ""
    body = "\n".join("    " + line if line else "" for line in doc.splitlines())
    text = f"def {func.__name__}{inspect.signature(func)}:\n    \"\"\"" + body.lstrip() \
        + "\n    \"\"\"\n    ...  # the body is yours to write in the labs"
    display(Markdown("```python\n" + text + "\n```"))
