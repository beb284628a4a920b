"""The GEMM op's device code, checked without a GPU (NVRTC only):

- the megakernel's bf16 path is really on tensor cores: the PTX holds
  ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``, ``ldmatrix .trans`` and zero-filling
  ``cp.async``; where ``nvdisasm`` is installed, the SASS holds ``HMMA.16816.F32.BF16``;
- no entry (``megakernel``, ``megak_op``) and no op body spills, with and without MK_TRACE
  (the interpreter's loops may: tests/test_device_compile.py bounds them);
- a numpy model of the bf16 tile's index math (the formulas of ``ops/gemm_bf16.cuh`` and the
  staging tile of ``ops/gemm_epilogue.cuh``, restated here: change them together) multiplies
  correctly, zero-fills every edge, reads nothing outside the region and hits every ldmatrix
  phase without a bank conflict.

GPU correctness goes through the public API (tests/ops/test_gemm.py).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from tests import sass
from tests.reference import nan_outside_tile

compiler = pytest.importorskip("megak.runtime.compiler")
pytest.importorskip("cuda.core")

ARCH = "sm_90a"
ENTRIES = ("megakernel", "megak_op")
# the interpreter's control code may keep a few values in local memory (register saves around
# the op calls; tests/test_device_compile.py bounds them)
CONTROL_FUNCTIONS = ("mk_compute", "mk_loader", "megakernel_resident")
# an op body may save a few registers once per call (tests/test_device_compile.py says why)
OP_SAVE_LIMIT = 32
GEMM_BODIES = ("mk_gemm_f32", "mk_gemm_f32_short", "mk_gemm_bf16", "mk_gemm_stream",
               "mk_gemm_wgmma", "mk_gemm_wgmma_generic")
# mk_gemm_stream is one function per form its dispatch tells apart (gemm_stream.cuh,
# mk_stream_form: any record, narrow bands of 9-16 and of 1-8 rows, one-part wide bands, fp32
# bands)
STREAM_FORMS = 5
MMA_LOOP = r"\bH(GMMA|MMA)\b"
MMA = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("megak-gemm-cache")


@pytest.fixture(scope="module", params=[None, {"MK_TRACE": 1}], ids=["default", "trace"])
def kernel(request, cache_dir):
    return compiler.compile_megakernel(ARCH, defines=request.param, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def ptx() -> str:
    return _ptx()


def _ptx(defines: dict | None = None) -> str:
    """The megakernel as PTX, through NVRTC directly (cuda.core asks the driver before it hands
    out PTX, and this machine may have none). compute_90a: the same front end as the cubin."""
    from cuda.bindings import nvrtc
    src = compiler.device_source().encode()
    err, prog = nvrtc.nvrtcCreateProgram(src, b"megakernel.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    try:
        opts = [b"--gpu-architecture=compute_90a", b"--std=c++17"]
        opts += [f"-D{k}={v}".encode() for k, v in (defines or {}).items()]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, n = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * n
            nvrtc.nvrtcGetProgramLog(prog, log)
            pytest.fail(f"NVRTC failed: {log.decode(errors='replace')}")
        _, n = nvrtc.nvrtcGetPTXSize(prog)
        buf = b" " * n
        (err,) = nvrtc.nvrtcGetPTX(prog, buf)
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
        return buf.rstrip(b"\x00").decode()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _function_properties(log: str) -> dict[str, tuple[int, int, int]]:
    """(stack, spill stores, spill loads) of every function ptxas reports, entries or not
    (a function called from both entries is reported under each: keep the worst)."""
    out: dict[str, tuple[int, int, int]] = {}
    for m in re.finditer(r"Function properties for (\S+)\s*\n\S*\s*\.\s*(\d+) bytes stack frame, "
                         r"(\d+) bytes spill stores, (\d+) bytes spill loads", log):
        vals = tuple(map(int, m.groups()[1:]))
        prev = out.get(m.group(1), (0, 0, 0))
        out[m.group(1)] = tuple(max(a, b) for a, b in zip(prev, vals))
    return out


def test_no_spills_in_any_entry_or_callee(kernel):
    for entry in ENTRIES:
        info = compiler.parse_ptxas_log(kernel.log, entry)
        print(f"\n{entry}: {info}")
        assert info["registers"] is not None, f"no ptxas line for {entry}:\n{kernel.log}"
        assert info["registers"] <= 255
        assert info["spill_stores"] == info["spill_loads"] == 0, kernel.log
        # the megakernel calls its role functions (mk_loader, mk_compute): a call frame; the
        # separate-launch entry (benchmarks only) gets a 32-B frame from ptxas as soon as it
        # can call the streamed GEMM's body (not a spill: no spill stores or loads)
        if entry != "megakernel":
            assert info["stack_bytes"] <= 32, f"{entry} keeps a stack frame:\n{kernel.log}"
    props = _function_properties(kernel.log)
    gemm = [f for f in props if "mk_gemm" in f]
    # the bodies, and the loader's producer of the wgmma stages (a loader function)
    bodies = GEMM_BODIES + ("mk_gemm_stream",) * (STREAM_FORMS - 1) + ("mk_gemm_wgmma_produce",)
    assert sorted(_plain_name(f) for f in gemm) == sorted(bodies), \
        f"expected the GEMM bodies {GEMM_BODIES} as functions: {sorted(props)}"
    for name, (stack, stores, loads) in props.items():
        if any(c in name for c in CONTROL_FUNCTIONS):
            continue   # bounded in tests/test_device_compile.py
        assert stores <= OP_SAVE_LIMIT and loads <= 2 * OP_SAVE_LIMIT, \
            f"{name} spills:\n{kernel.log}"
        if name in gemm:
            assert stack <= stores, f"{name} has a {stack}-byte stack frame:\n{kernel.log}"


def test_each_stream_form_holds_its_own_code(kernel):
    # the dispatch's forms (gemm_stream.cuh, mk_stream_form) are the one body with each
    # form's facts constant: a narrow band's, a batch-1-8 band's and a one-part wide band's
    # function must keep only their k loop, reduce and store (in a W2 build 14, 18 and 27 KiB
    # of SASS against the any-record form's 103), or a tail fetches the other forms' code again
    sizes = compiler.code_sizes(kernel.cubin)
    forms = {}
    for name, size in sizes.items():
        m = re.fullmatch(r"\$megakernel\$_Z14mk_gemm_streamILi(\d)E.*", name)
        if m:
            forms[int(m.group(1))] = size
    assert sorted(forms) == list(range(STREAM_FORMS)), sorted(sizes)
    for form in range(1, STREAM_FORMS):
        assert forms[form] <= 0.35 * forms[0], (form, forms)


def _plain_name(mangled: str) -> str:
    """mk_gemm_bf16 of _Z12mk_gemm_bf16RK8mk_instr... (the length-prefixed first name)."""
    m = re.match(r"_Z(\d+)", mangled)
    return mangled[len(m.group(0)):len(m.group(0)) + int(m.group(1))] if m else mangled


def test_only_a_packed_stream_build_copies_b_as_pages():
    # a constant B packed for the stream is read by 1-D bulk copies, its readers' lanes each
    # handing the page back (stream.cuh, MK_RING_LANE_ARRIVALS); a build without
    # MK_BODY_STREAM_PACKED holds neither: tensor copies, lane 0's hand-back
    from megak import abi
    stream = (1 << abi.OP_NOP) | (1 << abi.OPCODE_OF["gemm"]) | abi.BODY_GEMM_STREAM
    bulk = re.compile(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier")
    tensor = re.compile(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global")
    plain = _ptx(compiler.bodies_defines(stream))
    packed = _ptx(compiler.bodies_defines(stream | abi.BODY_STREAM_PACKED))
    assert tensor.search(plain) and tensor.search(packed)
    assert not bulk.search(plain)
    assert bulk.search(packed)


def test_bf16_path_uses_tensor_cores_in_ptx(ptx):
    body = ptx[ptx.find("mk_gemm_bf16"):]
    assert MMA in body
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in body
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in body
    # 16-B cp.async with a register src-size: the zero fill of partial tiles
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16, %r\d+;", body)
    assert "cvt.rn.bf16x2.f32" in ptx        # bf16 outputs: round to nearest even
    assert ".entry megakernel" in ptx and ".entry megak_op" in ptx


def test_bf16_path_uses_tensor_cores_in_sass(kernel, tmp_path):
    funcs = sass.functions(kernel.cubin, tmp_path)
    bf16 = [f for f in funcs if f.startswith("$megakernel$") and "mk_gemm_bf16" in f.split(",")[0]]
    assert len(bf16) == 1, "the bf16 GEMM body is not a separate function of the megakernel"
    body = bf16[0]
    # per k slice: 2 k16 steps x 4 x 4 tiles, B via ldmatrix.trans (2 per step), A (4 per
    # step); twice: the full-tile path and the predicated short-tile path
    hmma = len(re.findall(r"HMMA\.16816\.F32\.BF16", body))
    assert hmma >= 32 and hmma % 32 == 0, hmma
    assert len(re.findall(r"LDSM\.16\.MT88\.4", body)) * 8 == hmma
    assert len(re.findall(r"LDSM\.16\.M88\.4", body)) * 4 == hmma
    assert "LDGSTS.E.BYPASS.128.ZFILL" in body                       # cp.async.cg, zero fill
    for f in funcs:
        if "mk_gemm" in f.split(",")[0]:
            _check_mma_loops(f)


# An MMA loop stores nothing to local memory, and reloads at most a few registers that ptxas
# saved around the loop (L1 hits, a few per k step of thousands of MMA cycles).
MMA_LOOP_RELOADS = 4


def _check_mma_loops(function: str) -> None:
    local = sass.local_memory_in_loops(function, MMA_LOOP)
    name = function.split(",")[0]
    assert not [t for t in local if "STL" in t], f"local stores in an MMA loop of {name}: {local}"
    assert len(local) <= MMA_LOOP_RELOADS, f"local loads in an MMA loop of {name}: {local}"


def test_wgmma_path_in_sass(kernel, tmp_path):
    """The Hopper tiles: warpgroup MMAs (n256 where a stage's B pages are neighbours, else two
    n128) fed by TMA tensor copies, in a function of their own, and the generic fill's n128."""
    funcs = sass.functions(kernel.cubin, tmp_path)
    body = [f for f in funcs if f.startswith("$megakernel$") and
            _plain_name(f.split(",")[0].split("$")[-1]) == "mk_gemm_wgmma"]
    assert len(body) == 1, "the wgmma GEMM body is not a separate function of the megakernel"
    body = body[0]
    assert re.search(r"HGMMA\.64x256x16\.F32\.BF16", body)
    assert re.search(r"HGMMA\.64x128x16\.F32\.BF16", body)
    assert re.search(r"\bUTMALDG\.2D\b", body), "no TMA tensor load"
    _check_mma_loops(body)


# ---- numpy model of the bf16 tile (restates ops/gemm_bf16.cuh and the staging tile) ----------

PAGE = 16384
B_OFFSET = 8192          # MK_GEMM_BF16_B_OFFSET
BK = 32                  # MK_GEMM_BF16_BK


def _bank_group_free(addrs) -> bool:
    """One ldmatrix phase (8 lanes x 16 B) is conflict-free iff its 8 chunks sit in 8 distinct
    16-byte bank groups."""
    return len({(a // 16) % 8 for a in addrs}) == 8


def _model_tile(a, b, row0, col0, rows, cols, k0, klen):
    """The 128 x 128 fp32 staging tile the device's bf16 path leaves behind (float64 math)."""
    import ml_dtypes   # noqa: F401  (bf16 arrays arrive as uint16 views)
    au, bu = a.view(np.uint16), b.view(np.uint16)
    pages = [np.zeros(PAGE, np.uint8) for _ in range(4)]

    def chunk(page, dst, mat, r, c, n):
        n = max(0, min(8, n))
        vals = np.zeros(8, np.uint16)
        if n:
            assert r < mat.shape[0] and c + n <= mat.shape[1]
            vals[:n] = mat[r, c:c + n]
        page[dst:dst + 16] = vals.view(np.uint8)

    def load(kt):
        pg, kb = pages[kt & 3], kt * BK
        for tid in range(256):
            la_r, la_c, lb_r, lb_c = tid >> 2, tid & 3, tid >> 4, tid & 15
            a_dst = la_r * 64 + ((la_c ^ ((la_r >> 1) & 3)) << 4)
            b_dst = B_OFFSET + lb_r * 256 + ((lb_c ^ (lb_r & 7)) << 4)
            a_n, b_n = klen - kb - 8 * la_c, cols - 8 * lb_c
            for dr in (0, 64):
                chunk(pg, a_dst + dr * 64, au, row0 + la_r + dr, k0 + kb + 8 * la_c,
                      a_n if la_r + dr < rows else 0)
            for dk in (0, 16):
                chunk(pg, b_dst + dk * 256, bu, k0 + kb + lb_r + dk, col0 + 8 * lb_c,
                      b_n if kb + lb_r + dk < klen else 0)

    def ldmatrix(pg, addrs, trans):
        for ph in range(4):
            assert _bank_group_free(addrs[8 * ph:8 * ph + 8]), (trans, addrs)
        mats = [np.stack([pg[addrs[8 * i + r]:addrs[8 * i + r] + 16].view(np.uint16)
                          for r in range(8)]) for i in range(4)]
        out = np.zeros((32, 4, 2), np.uint16)
        for t in range(32):
            for i in range(4):
                m = mats[i].T if trans else mats[i]
                out[t, i] = m[t // 4, 2 * (t % 4):2 * (t % 4) + 2]
        return out

    def as_f(u16):
        return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    def mma(acc, af, bf):   # PTX fragment layouts of m16n8k16 (bf16 in, f32 accumulate)
        am, bm = np.zeros((16, 16)), np.zeros((16, 8))
        for t in range(32):
            g, q = t // 4, t % 4
            x, y = as_f(af[t]), as_f(bf[t])
            am[g, 2 * q:2 * q + 2], am[g + 8, 2 * q:2 * q + 2] = x[0], x[1]
            am[g, 2 * q + 8:2 * q + 10], am[g + 8, 2 * q + 8:2 * q + 10] = x[2], x[3]
            bm[2 * q:2 * q + 2, g], bm[2 * q + 8:2 * q + 10, g] = y[0], y[1]
        c = am @ bm
        for t in range(32):
            g, q = t // 4, t % 4
            acc[t] += (c[g, 2 * q], c[g, 2 * q + 1], c[g + 8, 2 * q], c[g + 8, 2 * q + 1])

    lanes = np.arange(32)
    acc = np.zeros((8, 4, 4, 32, 4))   # warp, mi, ni, lane, element
    for kt in range((klen + BK - 1) // BK):
        load(kt)
        pg = pages[kt & 3]
        for w in range(8):
            wm, wn = w >> 2, w & 3
            # active m16 / n8 tiles (C division truncates toward zero, then clamp to 0..4)
            m_act = min(4, max(0, int((rows - 64 * wm + 15) / 16)))
            n_act = min(4, max(0, int((cols - 32 * wn + 7) / 8)))
            a_frag = (64 * wm + (lanes & 15)) * 64
            a_x = (lanes >> 4) ^ ((lanes >> 1) & 3)
            b_frag = B_OFFSET + (lanes & 15) * 256
            b_y = (4 * wn + (lanes >> 4)) ^ (lanes & 7)
            for ks in range(2):
                af = [ldmatrix(pg, list(a_frag + mi * 1024 + ((a_x ^ (2 * ks)) << 4)), False)
                      for mi in range(4)]
                bf = []
                for nj in range(2):
                    r = ldmatrix(pg, list(b_frag + ks * 4096 + ((b_y ^ (2 * nj)) << 4)), True)
                    bf += [r[:, 0:2], r[:, 2:4]]
                for mi in range(m_act):
                    for ni in range(n_act):
                        mma(acc[w, mi, ni], af[mi], bf[ni])

    # fragments -> staging tile (row r in page r // 32, chunk c at c ^ (r & 7)) -> rows
    stage = np.full((4, 32 * 128), np.nan)
    for w in range(8):
        wm, wn = w >> 2, w & 3
        for mi in range(4):
            for h in range(2):
                for ni in range(4):
                    banks = np.zeros(32, int)
                    for lane in range(32):
                        g, q = lane >> 2, lane & 3
                        r, c = 64 * wm + 16 * mi + 8 * h + g, 32 * wn + 8 * ni + 2 * q
                        off = (r % 32) * 128 + (((c >> 2) ^ (r & 7)) << 2) + (c & 3)
                        assert np.isnan(stage[r // 32, off:off + 2]).all(), "written twice"
                        stage[r // 32, off:off + 2] = acc[w, mi, ni, lane, 2 * h:2 * h + 2]
                        banks[[off % 32, (off + 1) % 32]] += 1
                    assert banks.max() == 2   # 256 B in the minimum 2 wavefronts
    tile = np.zeros((128, 128))
    for r in range(128):
        offs = [(r % 32) * 128 + ((ch ^ (r & 7)) << 2) for ch in range(32)]
        assert len({(o // 4) % 8 for o in offs}) == 8
        for ch, o in enumerate(offs):
            tile[r, 4 * ch:4 * ch + 4] = stage[r // 32, o:o + 4]
    return tile


@pytest.mark.parametrize("m,k,n,row0,col0,rows,cols,k0,klen", [
    (128, 32, 128, 0, 0, 128, 128, 0, 32),      # one full slice
    (300, 100, 260, 128, 128, 128, 128, 0, 100),  # 4 slices, the last one partial
    (7, 5, 3, 0, 0, 7, 3, 0, 5),
    (129, 129, 130, 128, 128, 1, 2, 0, 129),     # 1 x 2 edge tile, 5 slices (stage reuse)
    (200, 70, 200, 64, 8, 100, 77, 3, 61),       # nothing aligned
    (1, 1, 1, 0, 0, 1, 1, 0, 1),
    (16, 64, 300, 0, 128, 16, 128, 0, 64),       # batch-16 MLP tile: 1 of 4 m16 tiles active
    (70, 40, 40, 0, 0, 70, 40, 0, 40),           # partial m16 tile in the second warp row
])
def test_bf16_tile_model(m, k, n, row0, col0, rows, cols, k0, klen):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(m * 1000 + k)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    # NaN outside the region: a read there, or a missing zero fill, would show
    ref = nan_outside_tile(a, b, row0, rows, col0, cols, k0, klen)
    tile = _model_tile(a, b, row0, col0, rows, cols, k0, klen)
    np.testing.assert_allclose(tile[:rows, :cols], ref, rtol=1e-12, atol=1e-12)
    assert (tile[rows:] == 0).all() and (tile[:, cols:] == 0).all()


# ---- numpy model of the short fp32 tile (restates ops/gemm_f32_short.cuh) --------------------

SHORT_ROWS, SHORT_STAGES, SHORT_COLS = 16, 3, 128   # MK_GEMM_F32_SHORT_ROWS, _STAGES; columns
SHORT_A_BYTES = SHORT_ROWS * BK * 4                 # MK_F32S_A_BYTES: one stage's A slice


def _wavefronts(byte_addrs) -> int:
    """Shared-memory wavefronts of one warp-wide 16-B load or store: distinct 16-B chunks,
    grouped by 128-B bank lines (8 chunks a wavefront at best, any line, no bank twice)."""
    chunks = sorted({a // 16 for a in byte_addrs})
    banks: dict[int, int] = {}
    for c in chunks:
        banks[c % 8] = banks.get(c % 8, 0) + 1
    return max(max(banks.values()), -(-len(chunks) // 8))


def _model_short_tile(a, b, row0, col0, rows, cols, k0, klen, preloaded):
    """The staging rows the device's short fp32 path leaves in page 0 (float64 math), copies
    by the loader (`preloaded` leading stages, lanes lane + 32 j) and the compute threads."""
    pages = [np.full(PAGE // 4, np.nan) for _ in range(4)]   # never-written floats stay NaN
    copied = [np.zeros(PAGE // 4, int) for _ in range(4)]

    def cp16(page, dst, mat, r, c, n):
        """cp.async 16 B: `n` floats read (r, c ..), the rest zeroed."""
        assert dst % 16 == 0
        vals = np.zeros(4)
        if n:
            assert 0 <= r < mat.shape[0] and c + n <= mat.shape[1]
            vals[:n] = mat[r, c:c + n]
        pages[page][dst // 4:dst // 4 + 4] = vals
        copied[page][dst // 4:dst // 4 + 4] += 1

    def copy_b(page, kt, i):
        r, c = i >> 5, i & 31
        k = kt * BK + r
        n = min(4, max(0, cols - 4 * c)) if k < klen else 0
        cp16(page, (r * SHORT_COLS + 4 * c) * 4, b, k0 + k, col0 + 4 * c, n)

    def copy_a(stage, kt, i):
        m, j = i >> 3, i & 7
        k = kt * BK + 4 * j
        n = min(4, max(0, klen - k)) if m < rows else 0
        cp16(3, stage * SHORT_A_BYTES + (m * BK + 4 * j) * 4, a, row0 + m, k0 + k, n)

    def load(kt, stage, roles):
        for p in (stage, 3):
            copied[p][:] = 0
        inside = (kt + 1) * BK <= klen   # the lean copies of a slice inside K
        for t in roles:   # the compute threads' chunks, as load() sets them up
            b_row, b_chunk = t >> 5, t & 31
            b_bytes = 4 * min(4, max(0, cols - 4 * b_chunk))
            for j in range(4):
                assert (b_row + 8 * j) * 32 + b_chunk == t + 256 * j   # copy_b's chunk number
                if inside:   # b_from + kt b_slice + j b_rows8, b_to + 8 j rows, b_bytes
                    cp16(stage, (b_row * SHORT_COLS + 4 * b_chunk) * 4 + 8 * j * SHORT_COLS * 4,
                         b, k0 + kt * BK + b_row + 8 * j, col0 + 4 * b_chunk, b_bytes // 4)
                else:
                    copy_b(stage, kt, t + 256 * j)
            if t < 128:
                a_row, a_chunk = t >> 3, t & 7
                if inside:   # a_from + kt BK into a_to + the stage's slice, a_bytes
                    cp16(3, stage * SHORT_A_BYTES + (a_row * BK + 4 * a_chunk) * 4, a,
                         row0 + a_row, k0 + kt * BK + 4 * a_chunk, 4 if a_row < rows else 0)
                else:
                    copy_a(stage, kt, t)
        assert (copied[stage] == 1).all()                      # the whole B slice, once
        span = slice(stage * SHORT_A_BYTES // 4, (stage + 1) * SHORT_A_BYTES // 4)
        assert (copied[3][span] == 1).all() and copied[3].sum() == SHORT_A_BYTES // 4

    def loader_load(kt):
        copied[kt][:] = 0
        copied[3][:] = 0
        for lane in range(32):
            for i in range(lane, 1024, 32):
                copy_b(kt, kt, i)
            for i in range(lane, 128, 32):
                copy_a(kt, kt, i)
        assert (copied[kt] == 1).all() and copied[3].sum() == SHORT_A_BYTES // 4

    ntiles = -(-klen // BK)
    stages = min(ntiles, preloaded)
    for kt in range(stages):
        loader_load(kt)
    acc = np.zeros((8, 32, SHORT_ROWS, 4))   # warp, lane, row, column
    m_loop = SHORT_ROWS if rows > SHORT_ROWS // 2 else SHORT_ROWS // 2
    for kt in range(ntiles):
        s = kt % SHORT_STAGES
        if kt >= stages:      # (the device issues it two slices ahead; the data is the same)
            load(kt, s, range(256))
        bpage, apage = pages[s], pages[3][s * SHORT_A_BYTES // 4:(s + 1) * SHORT_A_BYTES // 4]
        for w in range(8):
            rows_b = [[(4 * w + kk) * SHORT_COLS + 4 * lane for lane in range(32)]
                      for kk in range(4)]
            for kk in range(4):   # one 512-B row a load: the minimum 4 wavefronts
                assert _wavefronts([4 * x for x in rows_b[kk]]) == 4
            a_at = [m * BK + 4 * w for m in range(m_loop)]   # a broadcast per row
            for lane in range(32):
                bk = np.array([bpage[rows_b[kk][lane]:rows_b[kk][lane] + 4] for kk in range(4)])
                for m in range(m_loop):
                    acc[w, lane, m] += apage[a_at[m]:a_at[m] + 4] @ bk
    # the partial tiles: warp w's in page w // 2 at float 2048 (w % 2), rows m < rows
    part = [np.full(PAGE // 4, np.nan) for _ in range(4)]
    for w in range(8):
        for m in range(rows):
            addrs = []
            for lane in range(32):
                off = (w & 1) * 2048 + m * SHORT_COLS + 4 * lane
                assert np.isnan(part[w >> 1][off:off + 4]).all(), "written twice"
                part[w >> 1][off:off + 4] = acc[w, lane, m]
                addrs.append(4 * off)
            assert _wavefronts(addrs) == 4
    # the sums (rows w and w + 8, lane's columns) into the staging rows of page 0
    stage = np.full(PAGE // 4, np.nan)
    for w in range(8):
        for h in range(2):
            r = w + 8 * h
            if r >= rows:
                continue
            addrs = []
            for lane in range(32):
                total = np.zeros(4)
                for v in range(8):
                    off = (v & 1) * 2048 + r * SHORT_COLS + 4 * lane
                    total += part[v >> 1][off:off + 4]
                so = (r % 32) * 128 + ((lane ^ (r & 7)) << 2)   # mk_gemm_stage_at
                stage[so:so + 4] = total
                addrs.append(4 * so)
            assert _wavefronts(addrs) == 4
    tile = np.zeros((rows, SHORT_COLS))
    for r in range(rows):
        for ch in range(32):
            so = (r % 32) * 128 + ((ch ^ (r & 7)) << 2)
            tile[r, 4 * ch:4 * ch + 4] = stage[so:so + 4]
    return tile


@pytest.mark.parametrize("m,k,n,row0,col0,rows,cols,k0,klen,preloaded", [
    (16, 32, 128, 0, 0, 16, 128, 0, 32, 2),       # one full slice, from the loader
    (16, 300, 260, 0, 128, 16, 128, 0, 300, 2),   # 10 slices: the stages reused, a tail slice
    (20, 200, 300, 4, 256, 9, 44, 64, 130, 0),    # 9 rows, column and k tails, no preload
    (1, 1, 1, 0, 0, 1, 1, 0, 1, 2),
    (8, 100, 40, 0, 0, 8, 37, 36, 61, 1),         # 8 rows (the 8-row loop), one stage preloaded
    (16, 64, 8, 0, 4, 15, 4, 0, 64, 2),           # one column chunk
])
def test_short_fp32_tile_model(m, k, n, row0, col0, rows, cols, k0, klen, preloaded):
    rng = np.random.default_rng(m * 1000 + k + klen)
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((k, n))
    # NaN outside the region: a read there, or a missing zero fill, would show
    ref = nan_outside_tile(a, b, row0, rows, col0, cols, k0, klen)
    tile = _model_short_tile(a, b, row0, col0, rows, cols, k0, klen, preloaded)
    np.testing.assert_allclose(tile[:, :cols], ref, rtol=1e-12, atol=1e-12)
    assert (tile[:, cols:] == 0).all()


# ---- the MK_WGMMA_ONLY kernel (device/pages.cuh): the wgmma body inlined, MMAs pipelined ----

@pytest.fixture(scope="module", params=[1, 2], ids=["n256", "n128"])
def wgmma_only(request, cache_dir):
    build = compiler.compile_megakernel(ARCH, defines={"MK_WGMMA_ONLY": request.param},
                                        cache_dir=cache_dir)
    return build, {1: "64x256", 2: "64x128"}[request.param]


def test_wgmma_only_kernel_pipelines_its_mmas(wgmma_only, tmp_path):
    """Both builds (MK_WGMMA_ONLY=1: n256 MMAs, 2: the narrow tiles' n128): ptxas reports no
    serialised wgmma (C7510 call boundary, C7511 registers, C7518 a divergent wait) though
    the kernel also calls the reduce body, nothing spills, and in the SASS the k loop's four
    MMAs of the build's one shape go out back to back: only the last of a stage carries the
    group's scoreboard and one wait (DEPBAR.LE gsb0, 0x1) follows them, not one wait per MMA
    as in the general kernel."""
    wgmma_only, shape = wgmma_only
    assert "serialized" not in wgmma_only.log, [
        line for line in wgmma_only.log.splitlines() if "serialized" in line]
    info = compiler.parse_ptxas_log(wgmma_only.log, "megakernel")
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, info
    assert info["stack_bytes"] == 0, info
    assert all(s == (0, 0) for s in compiler.function_spills(wgmma_only.log,
                                                            "megakernel").values())
    funcs = sass.functions(wgmma_only.cubin, tmp_path)
    entry = [f for f in funcs if f.startswith("megakernel,")]
    assert len(entry) == 1 and not [f for f in funcs if f.startswith(("megak_op,",
                                                                     "megakernel_resident,"))]
    # the one other op it dispatches to: the split-K reduce, a called body
    assert [f for f in funcs if "mk_reduce_body" in f.split(",")[0]], [
        f.split(",")[0] for f in funcs]
    mmas = re.findall(r"HGMMA\.(\d+x\d+)x16\.F32\.BF16[^;]*;", entry[0])
    assert mmas and set(mmas) == {shape}, mmas      # the build's one k loop
    code = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", entry[0])]
    at = [i for i, c in enumerate(code) if c.startswith("HGMMA")]
    assert len(at) == 4, at                          # one stage of 4 k16 steps, in a loop
    between = [c for c in code[at[0]:at[-1]] if "DEPBAR" in c]
    assert not between, between                      # no wait between them
    assert "gsb0" not in " ".join(code[i] for i in at[:-1])
    assert "gsb0" in code[at[-1]]
    waits = [c for c in code[at[-1]:at[-1] + 24] if "WARPGROUP.DEPBAR" in c]
    assert waits and waits[0].strip().endswith("0x1"), waits   # wgmma.wait_group 1


def test_general_kernel_serialises_its_wgmma(kernel):
    """Why MK_WGMMA_ONLY exists: in the general kernel the wgmma body is a called function,
    and ptxas says it serialises its MMAs. When this starts failing, ptxas learned to pipeline
    wgmma across calls: the variant may then go."""
    assert "C7510" in kernel.log
