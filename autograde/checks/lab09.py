"""Checks of lab 09 (hardware detective).  No compilation here: the listings are excerpts of the
backward kernel's PTX as Triton emits it for sm_80 and sm_90 (kept below), near-misses built to
separate the right reading of a listing from the almost-right ones, and random listings made of
the kinds of lines Triton emits.  The expected answer of each is known by construction.

Each check serves the visible cell (a shown ``seed=``) and the hidden one (the grader's seed).
"""
from __future__ import annotations

import torch

from .common import Raised, attempt, forbid_references, fresh_generator, judging, show

# ------------------------------------------------------------------ listings
# The first bf16 atomic add of the backward for sm_80 (Triton 3.x): a loop around atom.cas.
SM80_CAS_LOOP = """\
\tadd.s64 \t%rd11, %rd77, 2;
\tand.b64 \t%rd12, %rd77, -4;
\tshl.b32 \t%r26, %r129, 3;
\tmov.b32 \t%r130, 65535;
\tld.global.b32 \t%r371, [%rd12];
$L__BB0_2:                              // %atomicrmw.start48
                                        // =>This Inner Loop Header: Depth=1
\tshr.u32 \t%r132, %r371, %r26;
\tcvt.u16.u32 \t%rs29, %r132;
\tmov.b16 \t%rs30, 0x3F80;
\tfma.rn.bf16 \t%rs31, %rs29, %rs30, %rs4;
\tcvt.u32.u16 \t%r133, %rs31;
\tshl.b32 \t%r134, %r133, %r26;
\tand.b32 \t%r135, %r371, %r27;
\tor.b32 \t%r136, %r135, %r134;
\tatom.relaxed.gpu.global.cas.b32 \t%r28, [%rd12], %r371, %r136;
\tsetp.ne.b32 \t%p19, %r28, %r371;
\tmov.b32 \t%r371, %r28;
\t@%p19 bra \t$L__BB0_2;
// %bb.3:                               // %atomicrmw.end47
\tand.b64 \t%rd13, %rd11, -4;
"""
# The same add for sm_90: one predicated vector instruction (four bf16 channels at once).
SM90_VECTOR_ADD = """\
\t.loc\t1 140 18                        // backward.py:140:18 @[ backward.py:108:39 ]
\tmov.b32 \t%r26, 0;
\t@%p3 atom.global.gpu.relaxed.add.noftz.v4.bf16 { %rs5, %rs6, %rs7, %rs8 }, [ %rd12 + 0 ], \
{ %rs9, %rs10, %rs11, %rs12 };
\tadd.s64 \t%rd13, %rd77, 64;
\t@%p4 atom.global.gpu.relaxed.add.noftz.v4.bf16 { %rs13, %rs14, %rs15, %rs16 }, \
[ %rd14 + 0 ], { %rs17, %rs18, %rs19, %rs20 };
"""
# The sm_80 build with grad_value in an fp32 buffer: native fp32 adds.
SM80_FP32_ADDS = """\
\tcvt.f32.bf16 \t%r7, %rs9;
\t@%p3 atom.global.gpu.relaxed.add.f32 %r6, [ %rd12 + 0 ], %r7;
\t@%p3 atom.global.gpu.relaxed.add.f32 %r8, [ %rd13 + 0 ], %r9;
\tadd.f32 \t%r10, %r8, %r11;
\t@%p3 atom.global.gpu.relaxed.add.f32 %r12, [ %rd15 + 0 ], %r13;
"""


def _lines(*lines):
    return "\n".join("\t" + line for line in lines) + "\n"


# (what, listing, its atomic instructions)
INSTRUCTION_LISTINGS = [
    ("the sm_80 CAS loop (its labels' comments say %atomicrmw)", SM80_CAS_LOOP,
     ["atom.relaxed.gpu.global.cas.b32"]),
    ("the sm_90 vector adds, each behind a predicate such as @%p3", SM90_VECTOR_ADD,
     ["atom.global.gpu.relaxed.add.noftz.v4.bf16"] * 2),
    ("a comment that mentions an atomic, a label, a predicated vector add, a CAS and a red",
     "\t// atom.global.add.f32 in a comment is not an instruction\n$L__BB0_2:\n"
     + _lines("ld.global.b32 \t%r5, [%rd12];",
              "@%p3 atom.global.gpu.relaxed.add.noftz.v4.bf16 \t{%rs1, %rs2}, [%rd4], {%rs3, %rs4};",
              "atom.relaxed.gpu.global.cas.b32 \t%r7, [%rd12], %r5, %r6;",
              "red.global.add.f32 \t[%rd9], %f1;"),
     ["atom.global.gpu.relaxed.add.noftz.v4.bf16", "atom.relaxed.gpu.global.cas.b32",
      "red.global.add.f32"]),
    ("the same fp32 add three times, then a reduction", SM80_FP32_ADDS
     + _lines("red.global.gpu.relaxed.add.f32 \t[%rd20], %r30;"),
     ["atom.global.gpu.relaxed.add.f32"] * 3 + ["red.global.gpu.relaxed.add.f32"]),
]

# (what, listing, expected strategy, {a wrong answer: what it says about the reading})
STRATEGY_LISTINGS = [
    ("the sm_80 bf16 backward: a loop around atom.cas", SM80_CAS_LOOP, "cas-loop",
     {"none": "a compare-and-swap (cas among the instruction's parts) is the loop's atomic: "
              "it decides \"cas-loop\""}),
    ("the sm_90 bf16 backward: native vector adds (.v4.bf16)", SM90_VECTOR_ADD, "bf16-native",
     {"fp16-native": "'f16' is a substring of 'bf16': compare the dot-separated parts "
                     "(op.split('.')), not substrings",
      "none": "a vector form (.v4.bf16) is still an add on bf16"}),
    ("the sm_80 backward with the fp32 buffer", SM80_FP32_ADDS, "fp32", {}),
    ("a CAS on its own, with no loop, label or arithmetic around it",
     _lines("atom.global.cas.b32 \t%r1, [%rd1], %r2, %r3;"), "cas-loop",
     {"none": "a CAS anywhere decides \"cas-loop\": the loop around it (a label, a branch "
              "back, an add before it) is not part of the test"}),
    ("a native bf16 atomic add and a CAS in one listing",
     _lines("@%p1 atom.global.gpu.relaxed.add.noftz.bf16 \t%rs1, [%rd1], %rs2;",
            "atom.relaxed.gpu.global.cas.b32 \t%r7, [%rd12], %r5, %r6;"), "cas-loop",
     {"bf16-native": "a CAS decides \"cas-loop\" even beside native adds: test for cas "
                     "before you look at the adds"}),
    ("bf16 arithmetic that is not atomic (add.rn.bf16, fma.rn.bf16) beside fp32 atomic adds",
     _lines("add.rn.bf16 \t%rs3, %rs1, %rs2;", "fma.rn.bf16 \t%rs4, %rs1, %rs2, %rs3;",
            "@%p2 atom.global.gpu.relaxed.add.f32 %r6, [ %rd12 + 0 ], %r7;"), "fp32",
     {"bf16-native": "only atomic instructions count: add.rn.bf16 adds two registers; read "
                     "the types of the atom/red adds (your atomic_instructions), not of every "
                     "line"}),
    ("adds that are not atomic (add.s64, add.f32), and no atomics",
     _lines("add.s64 \t%rd13, %rd77, 64;", "add.f32 \t%r10, %r8, %r11;", "ret;"), "none",
     {"fp32": "add.f32 without atom./red. adds two registers: only atomic adds count"}),
    ("atomic adds of other types (.u32, .f64)",
     _lines("atom.global.add.u32 \t%r1, [%rd1], 1;", "@%p1 red.global.add.f64 \t[%rd2], %fd1;"),
     "none",
     {"fp32": "only bf16, f16 and f32 adds name a strategy; an atomic add of another type "
              "(u32, f64) leaves \"none\""}),
    ("fp16 and fp32 atomic adds", _lines("red.global.add.noftz.f16x2 \t[%rd1], %r2;",
                                         "atom.global.gpu.relaxed.add.f32 %r6, [%rd12], %r7;"),
     "fp16-native", {"fp32": "check the types in the order bf16, f16, f32: the first found "
                             "names the strategy"}),
    ("a comment that mentions atom.global.cas, and fp32 atomic adds",
     "\t// no atom.global.cas.b32 here: fp32 adds are native\n"
     + _lines("atom.global.gpu.relaxed.add.f32 %r6, [%rd12], %r7;"), "fp32",
     {"cas-loop": "comments (//) are not instructions: read the atomics your "
                  "atomic_instructions returns, not the text"}),
    ("other atomics (exch, max) and no add",
     _lines("atom.global.exch.b32 \t%r1, [%rd1], %r2;", "atom.global.max.s32 \t%r3, [%rd2], %r4;"),
     "none", {"fp32": "only adds (add among the parts) and CAS count",
              "cas-loop": "exch and max are not a compare-and-swap"}),
]

# Random listings: what an atomic line can look like (the first token after the predicate).
ATOMICS = {
    "cas-loop": ["atom.relaxed.gpu.global.cas.b32", "atom.global.cas.b32",
                 "atom.acq_rel.gpu.global.cas.b32"],
    "bf16-native": ["atom.global.gpu.relaxed.add.noftz.bf16",
                    "atom.global.gpu.relaxed.add.noftz.v4.bf16",
                    "atom.global.gpu.relaxed.add.noftz.v8.bf16",
                    "red.global.gpu.relaxed.add.noftz.bf16x2"],
    "fp16-native": ["atom.global.gpu.relaxed.add.noftz.f16", "red.global.add.noftz.f16x2",
                    "atom.global.gpu.relaxed.add.noftz.v4.f16"],
    "fp32": ["atom.global.gpu.relaxed.add.f32", "red.global.gpu.relaxed.add.f32",
             "atom.global.v4.f32.add"],
}
OTHER = ["ld.global.b32", "ld.global.v4.b32", "st.global.b16", "mov.b32", "fma.rn.f32",
         "add.s64", "setp.ne.s32", "cvt.rn.bf16.f32", "shl.b32", "and.b64", "add.rn.bf16"]
DISTRACTORS = [
    "\t// atom.global.add.f32 is not emitted here",
    "$L__BB0_2:                              // %atomicrmw.start48",
    "                                        // =>This Inner Loop Header: Depth=1",
    "\t.loc\t1 130 18                        // backward.py:130:18",
    "\tmov.b32 \t%r1321, 65535;   // red.global.add would be faster",
    "\t@%p7 bra \t$L__BB0_2;",
    "\tret;",
    "}",
]


def _operands(gen):
    r = int(torch.randint(1, 5000, (1,), generator=gen))
    return f"%r{r}, [%rd{r % 97}+{2 * (r % 8)}], %r{r + 1}"


def _line(gen, mnemonic):
    predicate = f"@%p{int(torch.randint(1, 64, (1,), generator=gen))} " \
        if bool(torch.rand((), generator=gen) < 0.6) else ""
    pad = " " * int(torch.randint(1, 4, (1,), generator=gen))
    return f"\t{predicate}{mnemonic}{pad}\t{_operands(gen)};"


def _choice(gen, items):
    return items[int(torch.randint(0, len(items), (1,), generator=gen))]


def _ptx(gen, atomics):
    """A PTX-like text holding the given atomic mnemonics, in order, among other lines."""
    lines = ["//", "// Generated by LLVM NVPTX Back-End", "//", ".version 8.4",
             ".target sm_90a", ".address_size 64", "", ".visible .entry kernel(", ")", "{"]
    for mnemonic in atomics:
        for _ in range(int(torch.randint(1, 6, (1,), generator=gen))):
            if bool(torch.rand((), generator=gen) < 0.3):
                lines.append(_choice(gen, DISTRACTORS))
            else:
                lines.append(_line(gen, _choice(gen, OTHER)))
        lines.append(_line(gen, mnemonic))
    lines += [_choice(gen, DISTRACTORS) for _ in range(3)] + ["\tret;", "}"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ atomic_instructions
def _tokens(line):
    return line.split()


def _first(tokens):
    return tokens[1:] if tokens and tokens[0].startswith("@") else tokens


def _is_atomic(token):
    return token.startswith(("atom.", "red."))


# How the usual wrong readers read a listing: (hint, reader).
INSTRUCTION_MISTAKES = [
    ("an instruction may follow a predicate such as @%p3 (only lanes whose predicate is true "
     "run it): skip a first token that starts with @",
     lambda text: [t[0] for t in map(_tokens, text.splitlines()) if t and _is_atomic(t[0])]),
    ("comments (from //) and labels are not instructions: only the first token of a line, "
     "after an optional predicate, is its instruction",
     lambda text: [tok for line in text.splitlines() for tok in _tokens(line)
                   if _is_atomic(tok)]),
    ("red.* instructions are atomics too: reductions that return nothing",
     lambda text: [t[0] for t in map(_first, map(_tokens, text.splitlines()))
                   if t and t[0].startswith("atom.")]),
    ("return every atomic line's instruction, in order of appearance, duplicates included",
     lambda text: sorted(set(t[0] for t in map(_first, map(_tokens, text.splitlines()))
                             if t and _is_atomic(t[0])))),
    ("return the instruction only (the text up to the first whitespace), not the whole line",
     lambda text: [line.strip() for line in text.splitlines()
                   if _first(_tokens(line)) and _is_atomic(_first(_tokens(line))[0])]),
]


def _instruction_cases(gen):
    cases = [(what, text, expected) for what, text, expected in INSTRUCTION_LISTINGS]
    pool = [m for group in ATOMICS.values() for m in group]
    for count in (0, 1, 5, 12):
        atomics = [_choice(gen, pool) for _ in range(count)]
        cases.append((f"a made-up listing with {count} atomic instructions", _ptx(gen, atomics),
                      atomics))
    return cases


def check_atomic_instructions(atomic_instructions, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _instruction_cases(gen)
    with forbid_references(atomic_instructions):
        results = [attempt(atomic_instructions, text) for _, text, _ in cases]
    if not judging():
        return
    for (what, text, expected), got in zip(cases, results):
        where = f"atomic_instructions on {what} (seed {seed})"
        if isinstance(got, Raised):
            raise AssertionError(f"{where}: raised {got}")
        if not isinstance(got, (list, tuple)) or list(got) != expected:
            hint = next((h for h, reader in INSTRUCTION_MISTAKES
                         if all(reader(t) == list(r) if isinstance(r, (list, tuple)) else False
                                for (_, t, _), r in zip(cases, results))), None) or \
                next((h for h, reader in INSTRUCTION_MISTAKES
                      if isinstance(got, (list, tuple)) and reader(text) == list(got)), None) or \
                ("an atomic line's first token (after an optional @%p predicate) starts with "
                 "atom. or red.")
            raise AssertionError(f"{where}: expected {expected}, got {got!r}\nListing:\n"
                                 f"{_excerpt(text)}\nHint: {hint}")
    show(f"atomic_instructions: {len(INSTRUCTION_LISTINGS)} excerpts of real listings and "
         f"{len(cases) - len(INSTRUCTION_LISTINGS)} made-up ones (seed {seed}) read right")


def _excerpt(text, limit=24):
    lines = text.rstrip("\n").splitlines()
    shown = lines[:limit] + ([f"... ({len(lines) - limit} more lines)"] if len(lines) > limit
                             else [])
    return "\n".join("    " + line.replace("\t", " ") for line in shown)


# ------------------------------------------------------------------ atomic_strategy
def _strategy_cases(gen):
    cases = [(what, text, expected, wrong) for what, text, expected, wrong in STRATEGY_LISTINGS]
    cases.append(("a made-up listing with no atomics", _ptx(gen, []), "none", {}))
    for strategy, group in ATOMICS.items():
        atomics = [_choice(gen, group) for _ in range(3)]
        cases.append((f"a made-up listing whose atomics are {atomics}", _ptx(gen, atomics),
                      strategy, {}))
    return cases


STRATEGY_RULE = ("\"cas-loop\" when any atomic is a CAS; else the first of bf16 (bf16, bf16x2), "
                 "f16 (f16, f16x2), f32 among the types of the atomic adds; else \"none\"")


def check_atomic_strategy(atomic_strategy, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    cases = _strategy_cases(gen)
    with forbid_references(atomic_strategy):
        results = [attempt(atomic_strategy, text) for _, text, _, _ in cases]
    if not judging():
        return
    for (what, text, expected, wrong), got in zip(cases, results):
        if isinstance(got, Raised) or got != expected:
            hint = wrong.get(got) if isinstance(got, str) else None
            raise AssertionError(
                f"atomic_strategy on {what} (seed {seed}): expected {expected!r}, got "
                f"{got if isinstance(got, Raised) else repr(got)}\nListing:\n{_excerpt(text)}\n"
                f"Hint: {hint or STRATEGY_RULE}")
    show(f"atomic_strategy: {len(STRATEGY_LISTINGS)} real and near-miss listings and "
         f"{len(cases) - len(STRATEGY_LISTINGS)} made-up ones (seed {seed}) named right")


# ------------------------------------------------------------------ the fp32 switch
CAPABILITIES = [None, (7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _accum_hint(dtype, capability, got):
    if dtype != torch.bfloat16:
        return ("only bf16 needs the buffer: fp16 atomic adds are native everywhere, fp32 and "
                "fp64 need no buffer")
    if capability is None:
        return ("capability None means Triton's CPU interpreter, which has no bf16 atomics: "
                "True for bf16")
    if capability[0] >= 9:
        return "sm_90 and later add bf16 natively: True only when the major version is below 9"
    return "no GPU before sm_90 has a native bf16 atomic add: True for every major version below 9"


def _accum_expected(dtype, capability):
    return dtype == torch.bfloat16 and (capability is None or capability[0] < 9)


def _accum_where(capability):
    return "the CPU interpreter" if capability is None else f"sm_{capability[0]}{capability[1]}"


def _accum_diagnosis(cases, results):
    """The hint for a wrong fp32_accum_default, from the whole table of its answers: a rule
    named only where every wrong answer (and no right one) is what it explains."""
    answers = {case: got for case, got in zip(cases, results)}
    wrong = {case for case, got in answers.items()
             if isinstance(got, Raised) or got != _accum_expected(*case)}
    for dtype in DTYPES:                           # the test picks another dtype than bf16
        if dtype != torch.bfloat16 and all(
                answers[(d, c)] == (_accum_expected(torch.bfloat16, c) if d == dtype else False)
                for d, c in cases if not isinstance(answers[(d, c)], Raised)) and \
                not any(isinstance(answers[case], Raised) for case in cases):
            return (f"your function answers for {dtype} what bf16 should get, and False for "
                    f"bf16: the buffer is for bf16 (dtype == torch.bfloat16), on the "
                    "interpreter and below sm_90")
    if wrong and all(d != torch.bfloat16 for d, _ in wrong):
        return ("only bf16 needs the buffer: fp16 atomic adds are native everywhere, fp32 and "
                "fp64 need no buffer")
    if wrong == {(torch.bfloat16, None)}:
        return ("capability None means Triton's CPU interpreter, which has no bf16 atomics: "
                "True for bf16")
    if wrong and all(d == torch.bfloat16 and c is not None and c[0] >= 9 for d, c in wrong):
        return "sm_90 and later add bf16 natively: True only when the major version is below 9"
    if wrong and all(d == torch.bfloat16 and c is not None and c[0] < 9 for d, c in wrong):
        return ("no GPU before sm_90 has a native bf16 atomic add: True for every major "
                "version below 9")
    listed = ", ".join(f"{d} on {_accum_where(c)}" for d, c in cases if (d, c) in wrong)
    return (f"your answers are wrong for {listed} (of {len(cases)} dtype and GPU pairs): True "
            "exactly for bf16 on the interpreter (capability None) and on GPUs below sm_90")


def check_fp32_accum_default(fp32_accum_default):
    cases = [(dtype, capability) for dtype in DTYPES for capability in CAPABILITIES]
    with forbid_references(fp32_accum_default):
        results = [attempt(fp32_accum_default, dtype, capability) for dtype, capability in cases]
    if not judging():
        return
    for (dtype, capability), got in zip(cases, results):
        expected = _accum_expected(dtype, capability)
        if isinstance(got, Raised) or (got is not expected and got != expected):
            raise AssertionError(f"fp32_accum_default({dtype}, {capability}), "
                                 f"{_accum_where(capability)}: expected {expected}, got {got}\n"
                                 f"Hint: {_accum_diagnosis(cases, results)}")
    show(f"fp32_accum_default: {len(DTYPES)} dtypes x {len(CAPABILITIES)} GPUs (the "
         "interpreter included) right")


def _cost_hint(got, numel, itemsize, half):
    if not half:
        if got.get("buffer_bytes") == 4 * numel or \
                got.get("conversion_bytes") == (4 + itemsize) * numel:
            return ("fp32 and fp64 need no buffer: both values are 0 (you give them the "
                    "half-precision cost)")
        return (f"for a {8 * itemsize}-bit value both values are 0 (no buffer, nothing to "
                f"convert); yours are {got.get('buffer_bytes')!r} and "
                f"{got.get('conversion_bytes')!r}")
    buffer, conversion = got.get("buffer_bytes"), got.get("conversion_bytes")
    if buffer != 4 * numel:
        return ("the buffer holds fp32: 4 bytes per element of value, whatever value's dtype"
                if buffer == itemsize * numel else
                "buffer_bytes = 4 x the number of elements of value (B * S * M * D)")
    if conversion in (4 * numel, itemsize * numel, 8 * numel):
        return (f"the conversion reads the fp32 buffer (4 bytes) and writes grad_value in "
                f"value's dtype ({itemsize} bytes): {4 + itemsize} bytes per element")
    return "conversion_bytes = (4 + the dtype's size) x the number of elements"


def check_fp32_buffer_cost(fp32_buffer_cost, seed=None):
    gen = fresh_generator(seed)
    seed = gen.initial_seed()
    sizes = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4, torch.float64: 8}
    cases = [((2, 10, 3, 4), torch.bfloat16)]
    for dtype in sizes:
        cases.append((tuple(int(s) for s in torch.randint(1, 400, (4,), generator=gen)), dtype))
    with forbid_references(fp32_buffer_cost):
        results = [attempt(fp32_buffer_cost, shape, dtype) for shape, dtype in cases]
    if not judging():
        return
    for (shape, dtype), got in zip(cases, results):
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        itemsize = sizes[dtype]
        half = itemsize == 2
        expected = {"buffer_bytes": 4 * numel if half else 0,
                    "conversion_bytes": (4 + itemsize) * numel if half else 0}
        where = f"fp32_buffer_cost({shape}, {dtype}) (seed {seed})"
        if isinstance(got, Raised) or not isinstance(got, dict):
            raise AssertionError(f"{where}: expected a dict {expected}, got {got}")
        if {k: got.get(k) for k in expected} != expected:
            raise AssertionError(f"{where}: expected {expected}, got {got!r}\n"
                                 f"Hint: {_cost_hint(got, numel, itemsize, half)}")
    show(f"fp32_buffer_cost: {len(cases)} shapes and dtypes (seed {seed}) right")
