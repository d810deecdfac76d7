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

The hot loop's *instruction mix* (``mix``) puts every instruction under the pipe that issues it
(``PIPES``, after the pipes Nsight Compute counts executed instructions by): ``tensor`` (the MMAs), ``fma``
(fp32 multiply-adds, multiplies, adds; integer multiply-adds), ``fp16`` (packed half2 arithmetic), ``alu``
(integer and logic, comparisons, selects, min/max, moves and conversions between registers), ``xu`` (the
special-function unit: exponentials, conversions between integers and floats), ``memory`` (loads, stores,
shuffles, TMA, the asynchronous copies), ``control`` (branches, barriers, fences, warpgroup arrive/wait),
``uniform`` (the uniform datapath: U-prefixed opcodes) and ``other``. A static count over one iteration is
what each warp issues per K/V tile, one issue slot each. ``loop_flops`` weighs them by the floating-point
work of one warp's instruction: an ``HMMA.16816`` 2·16·8·16, an ``HGMMA.64xNx16`` 2·64·N·16 over the 4 warps
of its warpgroup, an FFMA 2 per lane, FADD, FMUL, FMNMX and MUFU 1 per lane, a half2 FMA 4 per lane.
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

# the pipe that issues each opcode (PIPE_ORDER: how the columns are ordered); U-prefixed opcodes not named here
# run on the uniform datapath, anything else is "other"
PIPES = {
    "tensor": "HMMA HGMMA QGMMA IMMA IGMMA BMMA DMMA".split(),
    "fma": "FFMA FMUL FADD IMAD IMUL FSWZADD".split(),
    "fp16": "HFMA2 HADD2 HMUL2 HMNMX2 HSET2 HSETP2".split(),
    "alu": (
        "IADD3 VIADD LOP3 LEA SHF ISETP FSETP FSEL SEL FMNMX IMNMX VIMNMX IABS SGXT BMSK PRMT MOV F2FP I2FP F2IP "
        "PLOP3 P2R R2P POPC FLO CS2R R2UR"
    ).split(),
    "xu": "MUFU F2F F2I I2F FRND".split(),
    "memory": (
        "LDG STG LDS STS LDSM STSM LDGSTS LDGDEPBAR LDL STL LD ST LDC ATOM ATOMS ATOMG RED SHFL UTMALDG UTMASTG UBLKCP"
    ).split(),
    "control": (
        "BRA BRX EXIT RET CALL BAR BSSY BSYNC WARPSYNC YIELD NOP DEPBAR SYNCS WARPGROUP ELECT VOTE NANOSLEEP MEMBAR "
        "FENCE ERRBAR CCTL"
    ).split(),
}
PIPE_ORDER = ("tensor", "fma", "fp16", "alu", "xu", "memory", "control", "uniform", "other")
_PIPE_OF = {op: pipe for pipe, ops in PIPES.items() for op in ops}
LANES = 32
# floating-point operations of one lane's instruction (the tensor pipe's are per warp, from the shape)
_LANE_FLOPS = {"FFMA": 2, "FMUL": 1, "FADD": 1, "FMNMX": 1, "MUFU": 1, "HFMA2": 4, "HADD2": 2, "HMUL2": 2}
# mma.sync shapes as SASS writes them (HMMA.16816: m16 n8 k16)
_MMA_SHAPES = {"16816": (16, 8, 16), "1688": (16, 8, 8), "884": (8, 8, 4), "16832": (16, 8, 32), "8816": (8, 8, 16)}
_HMMA = re.compile(r"\b[HI]MMA\.(\d+)")
_GMMA = re.compile(r"\b[HQ]GMMA\.(\d+)x(\d+)x(\d+)")

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


def pipe(op: str) -> str:
    """The pipe that issues an opcode (``PIPES``; U-prefixed ones not listed: ``uniform``; else ``other``)."""
    return _PIPE_OF.get(op) or ("uniform" if op.startswith("U") else "other")


def mix(texts) -> dict[str, int]:
    """Instructions per pipe (every pipe of ``PIPE_ORDER``, 0 where none) of the instructions ``texts``."""
    out = dict.fromkeys(PIPE_ORDER, 0)
    for text in texts:
        out[pipe(opcode(text))] += 1
    return out


def flops(texts) -> tuple[float, float]:
    """``(tensor, other)``: the floating-point operations one warp does issuing ``texts`` once, on the tensor
    pipe (from each MMA's shape) and on the others (module docstring)."""
    tensor = other = 0.0
    for text in texts:
        op = opcode(text)
        if (m := _GMMA.search(text)) is not None:
            tensor += 2.0 * int(m.group(1)) * int(m.group(2)) * int(m.group(3)) / 4  # a warpgroup's 4 warps
        elif (m := _HMMA.search(text)) is not None:
            if m.group(1) not in _MMA_SHAPES:
                raise ValueError(f"unknown mma.sync shape in {text!r}")
            a, b, c = _MMA_SHAPES[m.group(1)]
            tensor += 2.0 * a * b * c
        else:
            other += LANES * _LANE_FLOPS.get(op, 0)
    return tensor, other


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
    texts = [t for _, t in kernel.instructions[loop[0] : loop[1]]] if loop else []
    for name, n in mix(texts).items():
        row[f"loop_pipe_{name}"] = n
    row["loop_tensor_flops"], row["loop_other_flops"] = flops(texts)
    # the loop that issues the K/V loads: the producer's with warp specialisation, else the hot loop
    loads = kernel.innermost("tma", "thread_loads")
    ops = kernel.opcodes(*loads) if loads else collections.Counter()
    row["load_loop_instructions"] = (loads[1] - loads[0]) if loads else 0
    row["load_loop_tma"] = count(ops, "tma")
    row["load_loop_thread_loads"] = count(ops, "thread_loads")
    row["load_loop_spills"] = count(ops, "spills")
    row["setmaxnreg"] = "/".join(map(str, kernel.register_limits()))
    return row
