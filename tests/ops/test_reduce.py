"""Split-K: a GEMM with few output tiles is split over K into fp32 partials that a REDUCE
instruction sums (in split order) before the GEMM's epilogue."""
import numpy as np
import pytest

import megak
from megak import abi, scheduler
from megak.ops import gemm, reduce
from tests.reference import check_graph


def skinny(m=16, k=1024, n=300, dtype="float32", made_b=False, **epi):
    """a @ b with the epilogue `epi`; made_b: b copied by the graph first (an fp32 GEMM of at
    most 16 rows streams a b that is an input instead of splitting K: test_gemm_stream_f32)."""
    g = megak.Graph()
    a = g.input("a", (m, k), dtype)
    b = g.copy(g.input("b", (k, n), dtype)) if made_b else g.input("b", (k, n), dtype)
    kw = {}
    if epi.get("bias"):
        kw["bias"] = g.input("bias", (n,), dtype)
    if epi.get("residual"):
        kw["residual"] = g.input("res", (m, n), "float32")
    g.output(g.gemm(a, b, activation=epi.get("activation"), out_dtype=epi.get("out_dtype"),
                    **kw), "y")
    return g


def test_split_decision():
    assert gemm.split_k_factor(16, 1024, 1024, 132) == (8, 128)    # 8 tiles, 132 SMs
    assert gemm.split_k_factor(16, 4096, 1024, 132) == (16, 256)
    assert gemm.split_k_factor(4096, 4096, 4096, 132) == (1, 4096)  # enough tiles
    assert gemm.split_k_factor(16, 200, 1024, 132) == (1, 200)      # too little K
    # wgmma tiles (128 x 256): 64 tiles run unsplit, 16 split in 8
    assert gemm.split_k_factor(512, 4096, 4096, 132, 256, gemm.WGMMA_MIN_SPLITS) == (1, 4096)
    assert gemm.split_k_factor(128, 4096, 4096, 132, 256, gemm.WGMMA_MIN_SPLITS) == (8, 512)
    splits, chunk = gemm.split_k_factor(16, 1000, 128, 132)
    assert chunk % 64 == 0 and (splits - 1) * chunk < 1000 <= splits * chunk


def test_split_plan_structure():
    g = skinny(m=17, k=1024, n=256)
    plan = scheduler.build_plan(g, n_sm=132)
    ins = plan.instrs
    part = ins[ins["opcode"] == abi.OPCODE_OF["gemm"]]
    red = ins[ins["opcode"] == reduce.OP.opcode]
    splits = len(part) // 2                       # 2 column tiles
    assert splits > 1 and len(red) == 2
    # partials: A rows as the GEMM's, output rows in their split's block, K chunks tile K
    assert (part["row0"] == 0).all() and sorted(set(part["out_row0"])) == \
        [17 * s for s in range(splits)]
    # no epilogue on the partials; b is a graph input (MK_FLAG_B_READY)
    assert part["klen"].sum() == 2 * 1024 and (part["flags"] == abi.FLAG_B_READY).all()
    assert (red["k0"] == 17).all() and (red["klen"] == splits).all()
    assert (red["out_row0"] == red["row0"]).all()
    # each reduce waits only on its column's partials (one column-band counter)
    assert (red["n_waits"] == 1).all() and (red["wait_target"][:, 0] == splits).all()
    assert any("split-K" in label for label in plan.op_labels)
    hidden = [t for t in plan.tensors if t.name.endswith("_partials")]
    assert len(hidden) == 1 and hidden[0].shape == (17 * splits, 256)


@pytest.mark.parametrize("epi", [{}, {"bias": True, "activation": "gelu"},
                                 {"residual": True, "activation": "silu", "bias": True}],
                         ids=["plain", "bias-gelu", "bias-silu-residual"])
# splits (split_k_factor, 132 SMs): 2, 8, 4, then 10, 11 and 16 on regions of <= 16 rows,
# which the device reduces 8 partials at a time (reduce.cuh): a round and a short one, a
# round and 3 of 5 rows, two full rounds
@pytest.mark.parametrize("m,k,n", [(1, 300, 7), (16, 1024, 300), (130, 512, 129),
                                   (16, 1280, 130), (5, 2000, 40), (16, 4096, 256)])
def test_split_k_matches_float64(backend, rng, m, k, n, epi):
    g = skinny(m, k, n, made_b=m <= 16, **epi)
    prog = megak.compile(g, backend=backend, **({"n_sm": 132} if backend == "sim" else {}))
    check_graph(prog, g, rng, f"split-K {m}x{k}x{n} {epi}")
    assert "reduce" in prog.stats["instructions_per_opcode"]


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_split_k_bf16(backend, rng, out_dtype):
    # M = 80: bf16 GEMMs of <= 64 rows with weights are streamed instead (test_gemm_stream.py)
    g = skinny(80, 2048, 384, dtype="bfloat16", bias=True, activation="relu",
               out_dtype=out_dtype)
    prog = megak.compile(g, backend=backend, **({"n_sm": 132} if backend == "sim" else {}))
    check_graph(prog, g, rng, f"split-K bf16 -> {out_dtype}")
    assert "reduce" in prog.stats["instructions_per_opcode"]


def test_reduce_sums_in_split_order():
    # fp32 addition is not associative: the simulator must add s = 0, 1, 2, ... as the device
    parts = np.array([[1e8], [1.0], [-1e8], [1.0]], dtype=np.float32)   # 4 splits of M = 1
    rec = abi.empty_instrs(1)[0]
    rec["opcode"], rec["rows"], rec["cols"], rec["k0"], rec["klen"] = reduce.OP.opcode, 1, 1, 1, 4
    rec["tensor"][abi.ARG_A], rec["tensor"][abi.ARG_OUT] = 0, 1
    out = np.full((1, 1), np.nan, np.float32)
    reduce.OP.simulate(rec, [parts, out])
    expected = np.float32(np.float32(np.float32(1e8) + np.float32(1.0)) - np.float32(1e8))
    assert out[0, 0] == np.float32(expected + np.float32(1.0))
