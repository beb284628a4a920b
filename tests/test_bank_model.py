"""Shared-memory bank and global-coalescing model of the copy and transpose ops (CPU only).

Bank rule (sm_90): a warp's shared access of w bytes per lane is served in phases of 128 / w
lanes (32 for 4 B, 16 for 8 B, 8 for 16 B); a phase costs as many wavefronts as the most
distinct 4-B words any one bank (word % 32) holds. Extra wavefronts = bank conflicts.

The copy moves data through registers only (copy.cuh says why): its previous shared-memory
ring was conflict-free under this model, yet Nsight Compute's counter
(l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld) reported 5-7% extra LDS wavefronts:
that hardware counter also counts arbitration with other traffic on the L1 data banks
(cp.async fills, global stores), which no address layout removes. So the model's verdict for
the copy is "no shared access at all", checked on its source. The transpose's paged path
reads each tile from the pages the loader filled by swizzled TMA boxes and writes it back
transposed for the TMA stores (transpose.cuh): both patterns are modelled below against the
128-B swizzle's definition (no conflict in any phase, the tile out equal to A's tile
transposed), with the global side of both ops, restated from the device code:

- copy: mk_copy_stream and mk_copy_walk::next (copy.cuh) -- unit t + 256 s of the region's
  (row, float4 unit) index space, walked incrementally; groups of MK_COPY_GROUP_LOADS.
- transpose: mk_transpose_blocks (transpose.cuh) -- block (P, Q) of thread (w, l), b = 0..3:
  P = 8 (w & 3) + 4 (b & 1) + (l >> 3), Q = 16 (w >> 2) + 8 (b >> 1) + (l & 7).
"""
import re
from pathlib import Path

import numpy as np
import pytest

from megak import abi

DEVICE = Path(__file__).resolve().parent.parent / "megak" / "device"
THREADS = abi.LIMITS["MK_THREADS"]
_COPY = (DEVICE / "ops" / "copy.cuh").read_text()
GROUPS, GROUP_LOADS = (int(re.search(rf"\b{n} = (\d+)", _COPY).group(1))
                       for n in ("MK_COPY_GROUPS", "MK_COPY_GROUP_LOADS"))


def extra_wavefronts(addrs, width):
    """Per phase: wavefronts beyond one, for byte addresses (None = inactive lane)."""
    per = 128 // width
    out = []
    for ph in range(0, 32, per):
        banks: dict[int, set] = {}
        for a in (a for a in addrs[ph:ph + per] if a is not None):
            for w in range(a // 4, (a + width) // 4):
                banks.setdefault(w % 32, set()).add(w)
        out.append(max(map(len, banks.values()), default=1) - 1)
    return out


def sectors(addrs, width):
    return len({b // 32 for a in addrs if a is not None for b in range(a, a + width, 4)})


def test_bank_rule():
    assert extra_wavefronts([16 * i for i in range(32)], 16) == [0, 0, 0, 0]   # LDS.128 row
    assert extra_wavefronts([8 * i for i in range(32)], 4) == [1]               # stride 2 words
    assert extra_wavefronts([512 * i for i in range(32)], 16) == [7, 7, 7, 7]   # one column


def test_copy_touches_no_shared_memory():
    """No shared access: zero wavefronts, hence zero conflicts, in every phase of any band."""
    src = (DEVICE / "ops" / "copy.cuh").read_text()
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", src, flags=re.S)
    used = re.findall(r"mk_lds\w*|mk_sts\w*|mk_cp_async\w*|\.shared\b|__shared__|mk_smem\w*|"
                      r"pages\s*\[", code)
    assert not used, f"copy.cuh accesses shared memory: {sorted(set(used))}"
    assert abi.OP_SHAPES["MK_COPY_PAGES"] == 0


def swizzled(row, chunk):
    """Byte offset in a page of 16-B chunk `chunk` of box row `row` (128 B a row) under the
    128-B swizzle, as a TMA copy places it and a TMA store reads it (pages 1 KiB aligned)."""
    return 128 * row + 16 * (chunk ^ (row % 8))


def test_paged_transpose_through_swizzled_pages(rng):
    """mk_transpose_paged on a random tile: the pages as A's 4 boxes land in them (page b: A
    columns 32 b .., every row), each thread's 16 LDS.128 (block P = 8 g + i, Q_b = 8 b +
    ((i + w) & 7)), the write-back's 16 STS.128 into page g, then OUT's 4 boxes as the stores
    read them: the tile out is A's transposed, every phase of 8 lanes of every warp
    instruction is served in one wavefront both ways, and no byte is read or written twice."""
    tile = abi.OP_SHAPES["MK_TRANSPOSE_TILE"]
    box_cols = abi.OP_SHAPES["MK_TRANSPOSE_BOX_COLS"]
    page_bytes = abi.LIMITS["MK_PAGE_BYTES"]
    assert box_cols * 4 == 128 and tile * 128 == page_bytes
    A = rng.uniform(-1, 1, (tile, tile)).astype(np.float32)
    pages = np.full((4, page_bytes // 4), np.nan, np.float32)   # the boxes, as TMA lands them
    for b in range(4):
        for r in range(tile):
            for c in range(box_cols // 4):
                off = swizzled(r, c) // 4
                pages[b, off:off + 4] = A[r, 32 * b + 4 * c:32 * b + 4 * c + 4]
    x = {}
    read = set()
    for w in range(8):
        for b in range(4):
            for k in range(4):
                addrs = []
                for lane in range(32):
                    i, g = lane & 7, lane >> 3
                    P, q = 8 * g + i, (i + w) & 7
                    off = swizzled(4 * P + k, q)
                    addrs.append(off)
                    assert (b, off) not in read
                    read.add((b, off))
                    x[(w, lane, b, k)] = pages[b, off // 4:off // 4 + 4].copy()
                assert extra_wavefronts(addrs, 16) == [0, 0, 0, 0], ("read", w, b, k)
    assert len(read) == tile * tile // 4
    pages[:] = np.nan                                           # the barrier, then the write-back
    written = set()
    for w in range(8):
        for b in range(4):
            for e in range(4):
                addrs = {}
                for lane in range(32):
                    i, g = lane & 7, lane >> 3
                    r = 4 * (8 * b + ((i + w) & 7)) + e
                    off = swizzled(r, i)
                    addrs[lane] = off
                    assert (g, off) not in written
                    written.add((g, off))
                    pages[g, off // 4:off // 4 + 4] = [x[(w, lane, b, kk)][e] for kk in range(4)]
                # a phase's 8 lanes share g: they write the same page, so the offsets decide
                assert extra_wavefronts([addrs[n] for n in range(32)], 16) == [0, 0, 0, 0], \
                    ("write", w, b, e)
    out = np.full((tile, tile), np.nan, np.float32)             # OUT's boxes, as stored
    for g in range(4):
        for r in range(tile):
            for c in range(box_cols // 4):
                off = swizzled(r, c) // 4
                out[r, 32 * g + 4 * c:32 * g + 4 * c + 4] = pages[g, off:off + 4]
    np.testing.assert_array_equal(out, A.T)


@pytest.mark.parametrize("rows,units,ld", [(40, 2048, 8192), (300, 3, 12), (7, 100, 404),
                                           (1025, 64, 256), (33, 256, 1024)])
def test_copy_stream_covers_each_unit_once_and_coalesces(rows, units, ld):
    # mk_copy_stream: walker steps (bytes) as in the .cuh; ld in floats, units of 16 B
    dr, dc = THREADS // units, THREADS % units
    step, wrap = 4 * (dr * ld + 4 * dc), 4 * (ld - 4 * units)
    stages = GROUPS * GROUP_LOADS
    n_steps = -(-rows * units // THREADS) + stages          # past the end: predicated off
    at = np.zeros((THREADS, n_steps), np.int64)
    for t in range(THREADS):
        r, c, a = t // units, t % units, 4 * ((t // units) * ld + 4 * (t % units))
        for s in range(n_steps):                             # mk_copy_walk::next
            at[t, s] = a if r < rows else -1
            c, r, a = c + dc, r + dr, a + step
            if c >= units:
                c, r, a = c - units, r + 1, a + wrap
    u = np.arange(THREADS)[:, None] + THREADS * np.arange(n_steps)[None, :]
    want = np.where(u < rows * units, 4 * ((u // units) * ld + 4 * (u % units)), -1)
    np.testing.assert_array_equal(at, want)   # unit t + 256 s, each exactly once
    for s in range(n_steps):                   # 16-B requests: 512 contiguous bytes when the
        for w in range(THREADS // 32):         # warp's 32 units share a row
            lane = at[32 * w:32 * w + 32, s]
            uu = u[32 * w:32 * w + 32, s]
            if (lane >= 0).all() and len(set(uu // units)) == 1 and lane[0] % 32 == 0:
                assert sectors(lane, 16) == 16


def transpose_run(A, ni, nj, lda, ldo, a_vec, o_vec):
    """mk_transpose_blocks on flat A (ld lda): the output (flat, ld ldo, NaN = unwritten) and
    the warp requests {request: [(lane, element offset, floats)]} of its loads and stores."""
    out = np.full(nj * ldo, np.nan)
    reqs = {"ld": {}, "st": {}}

    def access(kind, key, lane, base, n, vec):   # mk_ld_f4_edge / mk_st_f4_edge
        for e in ("v",) if vec and n >= 4 else range(min(n, 4)):
            reqs[kind].setdefault(key + (e,), []).append(
                (lane, base if e == "v" else base + e, 4 if e == "v" else 1))

    for w in range(8):
        for lane in range(32):
            for b in range(4):
                p = 8 * (w & 3) + 4 * (b & 1) + (lane >> 3)
                q = 16 * (w >> 2) + 8 * (b >> 1) + (lane & 7)
                x = np.zeros((4, 4))                 # x[b][k] = A row 4p+k, columns 4q..
                for k in range(4):
                    n = nj - 4 * q
                    if 4 * p + k < ni and n > 0:
                        base = (4 * p + k) * lda + 4 * q
                        access("ld", (w, b, k), lane, base, n, a_vec)
                        x[k, :min(n, 4)] = A[base:base + min(n, 4)]
                for m in range(4):                   # y[m] = (x[0].m, .., x[3].m) -> row 4q+m
                    n = ni - 4 * p
                    if 4 * q + m < nj and n > 0:
                        base = (4 * q + m) * ldo + 4 * p
                        access("st", (w, b, m), lane, base, n, o_vec)
                        assert np.isnan(out[base:base + min(n, 4)]).all(), "written twice"
                        out[base:base + min(n, 4)] = x[:min(n, 4), m]
    return out, reqs


@pytest.mark.parametrize("ni,nj,lda,ldo,a_vec,o_vec", [
    (128, 128, 8192, 8192, True, True),      # the audit's tiles
    (128, 128, 132, 160, True, True), (65, 128, 256, 128, True, True),
    (128, 3, 8192, 8192, True, True), (7, 1, 12, 8, True, True),
    (100, 77, 101, 103, False, False), (128, 128, 129, 128, False, True)])
def test_transpose_is_exact_and_coalesced(ni, nj, lda, ldo, a_vec, o_vec, rng):
    A = rng.standard_normal(ni * lda)
    out, reqs = transpose_run(A, ni, nj, lda, ldo, a_vec, o_vec)
    got = out.reshape(nj, ldo)
    want = A.reshape(ni, lda)[:, :nj].T
    np.testing.assert_array_equal(got[:, :ni], want)     # each output once, exact
    assert np.isnan(got[:, ni:]).all()                   # nothing outside the region
    read = {e for r in reqs["ld"].values() for _, b, n in r for e in range(b, b + n)}
    assert read == {i * lda + j for i in range(ni) for j in range(nj)}
    for kind, ld in (("ld", lda), ("st", ldo)):
        for req in reqs[kind].values():
            if len(req) == 32 and req[0][2] == 4 and ld % 32 == 0:   # full 16-B requests
                assert sectors([4 * b for _, b, _ in req], 16) == 16
