"""Reading compiled kernels: resource usage and SASS instruction counts, with the tools Triton's wheel ships.

A kernel compiled for sm_90 (on any machine: ``triton.compile`` with a ``GPUTarget``) is a cubin; Triton's
NVIDIA backend carries ``cuobjdump``, which prints its resource usage (registers per thread, the stack
frame that spilled registers live in, shared memory) and its SASS. Here the SASS becomes a list of
instructions, the loops are found by their backward branches, and the *hot loop* is the innermost loop
that issues matrix instructions: what one K/V tile costs each thread. Counts are per thread (per warp,
every instruction a warp issues), the unit the claims about instruction issue speak in.

What counts as what: ``mma`` = tensor-core instructions (HGMMA/QGMMA: warpgroup MMA on Hopper; HMMA:
the per-warp ``mma.sync`` of earlier GPUs), ``tma`` = bulk tensor copies (UTMALDG loads, UTMASTG stores),
``thread_loads`` = per-thread global loads (LDG, and LDGSTS, the asynchronous global→shared copy),
``spills`` = local-memory loads and stores (LDL/STL), ``exp`` = MUFU.EX2, ``barriers`` = mbarrier
operations (SYNCS) and named barriers (BAR). Not handled: timing (the counts are static; how often a loop
runs is the kernel's business) and other architectures' opcode names.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import subprocess
import tempfile

CLASSES = {
    "mma": ("HGMMA", "QGMMA", "HMMA", "IMMA"),
    "tma": ("UTMALDG", "UTMASTG"),
    "thread_loads": ("LDG", "LDGSTS"),
    "spills": ("LDL", "STL"),
    "exp": ("MUFU",),
    "barriers": ("SYNCS", "BAR"),
}

_LINE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
_SETMAXNREG = re.compile(r"USETMAXREG\.\w+\.CTAPOOL\s+(?:UP\d+,\s*)?0x([0-9a-f]+)")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One compiled kernel: its instructions (address, text) and resource usage."""

    instructions: tuple[tuple[int, str], ...]
    registers: int
    stack_bytes: int
    shared_bytes: int

    def opcodes(self, lo: int = 0, hi: int | None = None) -> collections.Counter:
        """Opcode (without modifiers or predicate) → count, over instructions [lo, hi)."""
        return collections.Counter(opcode(text) for _, text in self.instructions[lo:hi])

    def loops(self) -> list[tuple[int, int]]:
        """(first, last + 1) instruction indices of every loop, from backward branches. Branches after the
        last EXIT are the out-of-line retry stubs of barrier waits, which jump back into the body without
        being loops, and are left out."""
        index = {addr: i for i, (addr, _) in enumerate(self.instructions)}
        exits = [i for i, (_, text) in enumerate(self.instructions) if opcode(text) == "EXIT"]
        end = exits[-1] if exits else len(self.instructions)
        found = []
        for i, (addr, text) in enumerate(self.instructions[:end]):
            m = _BRANCH.search(text)
            if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
                found.append((index[int(m.group(1), 16)], i + 1))
        return found

    def innermost(self, *kinds: str) -> tuple[int, int] | None:
        """The smallest loop issuing instructions of any of ``kinds`` (``CLASSES``), or None."""
        loops = [(lo, hi) for lo, hi in self.loops() if any(count(self.opcodes(lo, hi), k) for k in kinds)]
        return min(loops, key=lambda r: r[1] - r[0]) if loops else None

    def hot_loop(self) -> tuple[int, int] | None:
        """The smallest loop that issues matrix instructions: one K/V tile of a consumer."""
        return self.innermost("mma")

    def register_limits(self) -> tuple[int, ...]:
        """The per-thread register counts that ``setmaxnreg`` moves warpgroups to (empty without it)."""
        found = {int(m.group(1), 16) for _, t in self.instructions if (m := _SETMAXNREG.search(t))}
        return tuple(sorted(found))


def opcode(text: str) -> str:
    words = text.split()
    if words and words[0].startswith("@"):  # a predicated instruction
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def count(opcodes: collections.Counter, kind: str) -> int:
    """Instructions of one class (``CLASSES``) in an opcode count."""
    return sum(opcodes.get(op, 0) for op in CLASSES[kind])


def compile_kernel(
    fn,
    kinds: dict[str, str],
    constexprs: dict,
    capability: int,
    options: dict,
    gluon: bool = False,
    aligned: tuple[str, ...] = (),
):
    """Compile a ``@triton.jit`` (or ``@gluon.jit``) function for ``sm_<capability>`` without a GPU.

    ``kinds`` gives the signature type of the non-constexpr arguments that are not plain ints (``"*fp16"``,
    ``"fp32"``, ``"tensordesc<...>"``); every other one is ``i32``. Pointers, ``stride_*`` arguments and the
    ints named in ``aligned`` (lengths that are multiples of 16) are marked 16-divisible, as Triton
    specialises them for aligned contiguous tensors. Returns Triton's ``CompiledKernel`` (``.asm["ptx"]``,
    ``.asm["cubin"]``, ``.metadata``).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, bound, attrs = {}, {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in constexprs:
            signature[arg], bound[(i,)] = "constexpr", constexprs[arg]
            continue
        signature[arg] = kinds.get(arg, "i32")
        if signature[arg].startswith("*") or arg.startswith("stride_") or arg in aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource

        source = GluonASTSource(fn, signature, bound, attrs)
    else:
        source = ASTSource(fn=fn, signature=signature, constexprs=bound, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


def cuobjdump() -> str:
    """The ``cuobjdump`` of Triton's NVIDIA backend (or one on PATH)."""
    import triton

    shipped = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return shipped if os.path.exists(shipped) else "cuobjdump"


def read(cubin: bytes) -> Kernel:
    """Disassemble a cubin and read its resource usage."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump(), "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run(
            [cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", usage)
    if not m:
        raise ValueError(f"cuobjdump printed no resource usage: {usage[:300]!r}")
    instructions = tuple((int(a, 16), t) for a, t in (x.groups() for x in map(_LINE.match, sass.splitlines()) if x))
    if not instructions:
        raise ValueError("cuobjdump printed no instructions")
    return Kernel(instructions, *(int(g) for g in m.groups()))


def summary(kernel: Kernel, dynamic_shared_bytes: int = 0) -> dict:
    """The numbers a table row holds: resources, whole-kernel and hot-loop counts per class."""
    row = {
        "registers": kernel.registers,
        "stack_bytes": kernel.stack_bytes,
        "shared_bytes": kernel.shared_bytes + dynamic_shared_bytes,
    }
    whole = kernel.opcodes()
    for kind in CLASSES:
        row[f"kernel_{kind}"] = count(whole, kind)
    loop = kernel.hot_loop()
    ops = kernel.opcodes(*loop) if loop else collections.Counter()
    row["loop_instructions"] = (loop[1] - loop[0]) if loop else 0
    for kind in CLASSES:
        row[f"loop_{kind}"] = count(ops, kind)
    # the loop that issues the K/V loads: the producer's with warp specialisation, else the hot loop
    loads = kernel.innermost("tma", "thread_loads")
    ops = kernel.opcodes(*loads) if loads else collections.Counter()
    row["load_loop_instructions"] = (loads[1] - loads[0]) if loads else 0
    row["load_loop_tma"] = count(ops, "tma")
    row["load_loop_thread_loads"] = count(ops, "thread_loads")
    row["load_loop_spills"] = count(ops, "spills")
    row["setmaxnreg"] = "/".join(map(str, kernel.register_limits()))
    return row
