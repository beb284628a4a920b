"""Each program runs a build of the op bodies its records use (instr.h, enum mk_bodies):
which bodies a plan needs, that a build holds those and no others, and that a record the
build lacks is refused on the GPU, never skipped."""
from __future__ import annotations

import numpy as np
import pytest

import megak
from megak import abi, ops
from megak.errors import MegakernelError
from tests.reference import assert_close, evaluate, random_inputs
# fp32 GEMM tiles, a transpose and a copy
from tests.runtime.test_cuda_runtime import _mixed_graph

GEMM = abi.OPCODE_OF["gemm"]


def _records(*rows):
    """(opcode, flags) rows as a record array (the fields ops.bodies reads)."""
    recs = np.zeros(len(rows), dtype=abi.INSTR_DTYPE)
    for i, (opcode, flags) in enumerate(rows):
        recs[i]["opcode"], recs[i]["flags"] = opcode, flags
    return recs


def _stream_graph():
    g = megak.Graph()
    x = g.input("x", (16, 512), "bfloat16")
    w = g.input("w", (512, 384), "bfloat16")
    g.output(g.gemm(x, w), "y")
    return g


def test_bodies_are_the_opcodes_and_the_gemm_paths():
    nop = 1 << abi.OP_NOP
    copy = abi.OPCODE_OF["copy"]
    assert ops.bodies(_records()) == nop
    assert ops.bodies(_records((copy, 0), (abi.OP_NOP, 0))) == nop | 1 << copy
    # an opcode no op has adds nothing: the device refuses it (MK_ERR_BAD_OPCODE) in any build
    assert ops.bodies(_records((abi.OPCODES["MK_OP_COUNT"], 0))) == nop
    gemm = nop | 1 << GEMM
    assert ops.bodies(_records((GEMM, abi.FLAG_BIAS))) == gemm | abi.BODY_GEMM_TILED
    assert ops.bodies(_records((GEMM, abi.FLAG_STREAM | abi.FLAG_B_READY))) == \
        gemm | abi.BODY_GEMM_STREAM
    assert ops.bodies(_records((GEMM, abi.FLAG_WGMMA))) == gemm | abi.BODY_GEMM_WGMMA
    assert ops.bodies(_records((GEMM, abi.FLAG_WGMMA), (GEMM, 0), (copy, 0))) == \
        gemm | abi.BODY_GEMM_WGMMA | abi.BODY_GEMM_TILED | 1 << copy
    # every path bit lies above the opcodes' bits
    assert min(abi.BODIES.values()) > 1 << abi.OPCODES["MK_OP_COUNT"]


@pytest.mark.parametrize("make,want", [
    (_mixed_graph, ("gemm", "transpose", "copy", "BODY_GEMM_TILED")),
    (_stream_graph, ("gemm", "BODY_GEMM_STREAM")),
])
def test_a_compiled_plan_needs_exactly_the_bodies_it_runs(make, want):
    plan = megak.compile(make(), backend="sim", n_sm=8).plan
    mask = 1 << abi.OP_NOP
    for w in want:
        mask |= getattr(abi, w) if w.startswith("BODY_") else 1 << abi.OPCODE_OF[w]
    assert ops.bodies(plan.instrs) == mask


# the non-inlined device functions of some bodies (the others are inlined into the interpreter)
FUNCTIONS = {abi.BODY_GEMM_TILED: ("mk_gemm_f32", "mk_gemm_bf16"),
             abi.BODY_GEMM_STREAM: ("mk_gemm_stream",),
             abi.BODY_GEMM_WGMMA: ("mk_gemm_wgmma",),
             1 << abi.OPCODE_OF["reduce"]: ("mk_reduce_body",),
             1 << abi.OPCODE_OF["transpose"]: ("mk_transpose_body",)}


@pytest.mark.gpu
def test_each_program_runs_a_build_of_its_own_bodies(rng):
    from megak.runtime import compiler
    for make in (_mixed_graph, _stream_graph):
        g = make()
        with megak.compile(g, backend="cuda", debug=True) as prog:
            ex = prog._executor
            assert ex.bodies == ops.bodies(prog.plan.instrs)
            names = " ".join(compiler.code_sizes(ex.compiled.cubin))
            assert "megakernel_resident" not in names   # the resident kernel: every body
            for bit, functions in FUNCTIONS.items():
                for fn in functions:
                    assert (fn in names) == bool(ex.bodies & bit), (make.__name__, fn, names)
            for _ in range(2):
                inputs = random_inputs(g, rng)
                out = prog.run(**inputs)
                env = evaluate(g, inputs)
                for name, t in g.outputs.items():
                    assert_close(out[name], *env[t.index], f"{make.__name__} {name}", t.dtype)


@pytest.mark.gpu
def test_a_record_the_build_lacks_is_refused(rng):
    g = _mixed_graph()
    with megak.compile(g, backend="cuda", debug=True) as prog:
        ex = prog._executor
        own = ex.bodies
        inputs = random_inputs(g, rng)
        # an op the build lacks: MK_ERR_BAD_OPCODE; a GEMM path it lacks: the record check
        for drop, error in [(1 << abi.OPCODE_OF["transpose"], "MK_ERR_BAD_OPCODE"),
                            (abi.BODY_GEMM_TILED, "MK_ERR_BAD_DESCRIPTOR")]:
            ex._use_bodies(own & ~drop)
            with pytest.raises(MegakernelError) as err:
                prog.run(**inputs)
            assert err.value.record["error"] == abi.ERRORS[error], str(err.value)
        ex._use_bodies(own)
        out = prog.run(**inputs)
        env = evaluate(g, inputs)
        for name, t in g.outputs.items():
            assert_close(out[name], *env[t.index], f"after the refusals: {name}", t.dtype)
