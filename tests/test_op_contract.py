"""The op contract (megak/ops/base.py) holds: the registry, instr.h's opcodes, page counts and
operand masks, and megakernel.cu's one dispatch list all name the same ops, and nothing
outside an op's own files names it."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import megak
from megak import abi
from megak.ops import BY_OPCODE, REGISTRY
from megak.ops.base import OpDef

ROOT = Path(megak.__file__).resolve().parent
DISPATCH = re.compile(r"X\((\w+), (\w+), ([01])\)")


def dispatch_list() -> list[tuple[str, str, int]]:
    src = (ROOT / "device" / "megakernel.cu").read_text()
    block = src[src.index("#define MK_FOR_EACH_OP(X)"):]
    block = block[:block.index("\n\n")]
    return [(a, b, int(c)) for a, b, c in DISPATCH.findall(block)]


def test_registry_matches_instr_h_opcodes():
    opcodes = {k[len("MK_OP_"):].lower(): v for k, v in abi.OPCODES.items()
               if k not in ("MK_OP_NOP", "MK_OP_COUNT")}
    assert set(REGISTRY) == set(opcodes)
    for name, op in REGISTRY.items():
        assert isinstance(op, OpDef) and op.name == name
        assert op.opcode == opcodes[name]
        assert BY_OPCODE[op.opcode] is op
    assert abi.OPCODES["MK_OP_COUNT"] == max(opcodes.values()) + 1


def test_dispatch_list_matches_the_registry():
    entries = dispatch_list()
    assert [name for _, name, _ in entries] == list(REGISTRY)
    for upper, name, preload in entries:
        assert upper == name.upper()
        header = (ROOT / "device" / "ops" / f"{name}.cuh").read_text()
        for fn in ("check", "check_operands", "run"):
            assert re.search(rf"\bmk_{name}_{fn}\(", header), f"{name}.cuh lacks mk_{name}_{fn}"
        for fn in ("preload_stages", "preload", "preload_late", "preload_drain"):
            has = bool(re.search(rf"\bmk_{name}_{fn}\(", header))
            assert has == bool(preload), f"{name}: preload column {preload}, mk_{name}_{fn}"
        # the early operand is what the loader preloads before the waits
        if REGISTRY[name].early_operand is not None:
            assert preload


def test_every_dispatch_into_an_op_is_guarded_by_its_body():
    """A build of some bodies (instr.h, MK_BODIES) compiles no call into the others: each
    X(...) of the dispatch functions that calls an op's entry checks MK_OP_BUILT(OP)."""
    src = (ROOT / "device" / "megakernel.cu").read_text().replace("\\\n", " ")
    defs = re.findall(r"#define X\(OP, name, PRELOAD\)(.*)", src)
    calls = [d for d in defs if "mk_##name##_" in d or "MK_PRELOAD" in d]
    assert len(calls) == 7, defs   # check, check_operands, run, the four preload entries
    for d in calls:
        assert "MK_OP_BUILT(OP)" in d, d


@pytest.mark.parametrize("name", list(REGISTRY))
def test_op_bodies_hold_its_opcode_and_no_other(name):
    op = REGISTRY[name]
    recs = np.zeros(3, dtype=abi.INSTR_DTYPE)
    recs["opcode"] = op.opcode
    mask = op.bodies(recs)
    below = (1 << abi.OPCODES["MK_OP_COUNT"]) - 1
    assert mask & below == 1 << op.opcode
    assert mask & ~below & ~sum(abi.BODIES.values()) == 0


@pytest.mark.parametrize("name", list(REGISTRY))
def test_operand_masks_and_pages_come_from_instr_h(name):
    op = REGISTRY[name]
    mask = op.operand_mask
    assert mask >> abi.ARG_OUT & 1, "every op writes its output"
    for pos in op.operands:
        assert mask >> pos & 1, f"{name} reads operand {pos}, which its mask lacks"
    assert op.pages == abi.OP_SHAPES[f"MK_{name.upper()}_PAGES"]
    # the device takes both from instr.h: no op header restates them
    for header in (ROOT / "device" / "ops").glob("*.cuh"):
        text = header.read_text()
        assert not re.search(rf"^\s*MK_{name.upper()}_OPERANDS\s*=", text, re.M), header.name
        assert not re.search(rf"^\s*MK_{name.upper()}_PAGES\s*=", text, re.M), header.name


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_op_has_its_three_files(name):
    assert (ROOT / "ops" / f"{name}.py").exists()
    assert (ROOT / "device" / "ops" / f"{name}.cuh").exists()
    tests = Path(__file__).resolve().parent / "ops" / f"test_{name}.py"
    assert tests.exists(), f"no {tests}"


def test_public_ops_are_graph_methods_with_docs():
    for name, op in REGISTRY.items():
        if op.internal:
            assert not hasattr(megak.Graph, name)
            continue
        method = getattr(megak.Graph, name)
        assert method is op.build
        assert method.__doc__ and len(method.__doc__.strip()) > 40, name


@pytest.mark.parametrize("module", ["graph.py", "scheduler.py", "sim.py", "page_plan.py"])
def test_the_pipeline_names_no_op(module):
    text = (ROOT / module).read_text()
    # strings and identifiers naming an op: "gemm", OP_GEMM, gemm_plan(...)
    for name in REGISTRY:
        hits = [line for line in text.splitlines()
                if re.search(rf"(['\"]{name}['\"]|\bOP_{name.upper()}\b|\b{name}_\w+\()",
                             line)]
        assert not hits, f"{module} names op {name!r}: {hits}"


def test_reference_names_no_op():
    text = (Path(__file__).resolve().parent / "reference.py").read_text()
    for name in REGISTRY:
        assert not re.search(rf"['\"]{name}['\"]", text), name
