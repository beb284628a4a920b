/* The fp32 weight stream's k loops (megak/device/ops/gemm_stream_f32.cuh) run on the CPU, so
 * that their index math, their ring hand-offs and their warp exchanges are checked as
 * written, not as restated:
 *
 *   - 256 std::threads are the compute threads (threadIdx.x each); each warp's 32 threads
 *     share a std::barrier for __syncwarp, __all_sync and __shfl_sync (every lane writes its
 *     value, the barrier, every lane reads its source's, the barrier); a std::barrier of 256
 *     is the compute barrier; threads are delayed at random before barriers;
 *   - with a ring (R > 0) a streamer thread fills the R ring pages in stage order as the TMA
 *     would (B's box of 32 columns x 128 k-rows from k0 + 128 pos, the 128-B swizzle, zeros
 *     past the tensor), each only once both readers of the slot's previous stage handed it
 *     back, poisoning it (NaN) first and waiting a little at random: a read after the
 *     hand-back, or of a stage before it landed, gives wrong sums. Without a ring (R = 0) the
 *     op copies each stage itself, four in its pages (mk_stream_kloop_copied_f32);
 *   - a cp.async copy lands when issued ("early") or only at the wait that covers it ("late");
 *   - the op's pages sit at scattered physical pages, poisoned (NaN); a page that is neither
 *     the op's nor the ring's must stay untouched; A and B hold NaN outside the record's
 *     operands (B's columns past the band are read by the box and never stored: NaN there
 *     shows only in columns the check skips);
 *   - the 8 warps' accumulators (the MMA layout the reduce reads) are summed here and checked
 *     against a float64 reference, rows past the record's exactly 0.
 * The headers around the loop are replaced by the stand-ins below; the loop is the device
 * source itself.
 *
 *   gemm_stream_f32 ROWS COLS KLEN K0 LDA LDB R LATE SEED
 *
 * Prints the worst error against float64 (relative to the fp32 bound), then OK and exits 0 when
 * every check held.
 */
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#define __device__
#define __forceinline__ inline
#define __noinline__

struct float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct mk_thread_index { unsigned x; };
static thread_local mk_thread_index threadIdx;

#include "../../megak/device/instr.h"

typedef unsigned char mk_u8;

/* ---- the block --------------------------------------------------------------------------- */
static const int OP_PAGES = MK_STREAM_PAGES;
static const mk_u8 OP_IDX[OP_PAGES] = {1, 3, 0};   /* physical page 2 is nobody's */
static const int RING0 = 4;                        /* ring slot i: physical page 4 + i */
static int g_phys;
static unsigned char* g_smem;
static std::barrier<>* g_sync;
static std::barrier<>* g_warp_sync[MK_THREADS / 32];
static float g_exchange[MK_THREADS];
static bool g_late;
static std::atomic<bool> g_failed{false};

static void fail(const char* what)
{
    if (!g_failed.exchange(true))
        std::fprintf(stderr, "FAIL: %s\n", what);
}

static inline mk_u32 mk_smem_addr(const void* p)
{
    return (mk_u32)(static_cast<const unsigned char*>(p) - g_smem);
}

static void check_smem(mk_u32 addr, const char* what)
{
    if (addr % 16 || addr + 16 > (mk_u32)(g_phys * MK_PAGE_BYTES))
        fail(what);
}

static inline float4 mk_lds_f4(mk_u32 smem)
{
    check_smem(smem, "a shared load outside the pages or off 16 B");
    float4 v;
    std::memcpy(&v, g_smem + smem, 16);
    return v;
}

static inline void mk_sts_f4(mk_u32 smem, float4 v)
{
    check_smem(smem, "a shared store outside the pages or off 16 B");
    std::memcpy(g_smem + smem, &v, 16);
}

/* ---- cp.async (tests/host_run/cp_async.h) ---------------------------------------------- */
static inline mk_u32 smem_bytes() { return (mk_u32)(g_phys * MK_PAGE_BYTES); }

#include "cp_async.h"

/* ---- warps and the block --------------------------------------------------------------------- */
static thread_local std::mt19937 t_rng;

static void jitter()
{
    if (t_rng() % 8 == 0)   /* some threads come late */
        std::this_thread::sleep_for(std::chrono::microseconds(t_rng() % 30));
}

static inline void __syncwarp()
{
    jitter();
    g_warp_sync[threadIdx.x >> 5]->arrive_and_wait();
}

static inline float __shfl_sync(unsigned, float v, int src)
{
    const unsigned base = threadIdx.x & ~31u;
    g_exchange[threadIdx.x] = v;
    __syncwarp();
    const float got = g_exchange[base + (unsigned)src];
    __syncwarp();
    return got;
}

static inline bool __all_sync(unsigned, bool pred)
{
    const unsigned base = threadIdx.x & ~31u;
    g_exchange[threadIdx.x] = pred ? 1.f : 0.f;
    __syncwarp();
    bool all = true;
    for (unsigned l = 0; l < 32; ++l)
        all = all && g_exchange[base + l] != 0.f;
    __syncwarp();
    return all;
}

static inline void mk_compute_sync()
{
    jitter();
    g_sync->arrive_and_wait();
}

/* ---- the ring ------------------------------------------------------------------------------ */

struct mk_control {
    mk_params params;
    mk_u64 ring_empty[MK_STREAM_MAX_RING];
};
static mk_control g_ctl;
static inline mk_control& mk_ctl() { return g_ctl; }

static std::atomic<mk_u32> g_landed[MK_STREAM_MAX_RING];   /* pos + 1 of the stage there */
static std::atomic<mk_u32> g_handed[MK_STREAM_MAX_RING];   /* readers' arrivals, all phases */

static inline unsigned char* mk_ring_page(const mk_params&, mk_u32 slot)
{
    return g_smem + (size_t)(RING0 + slot) * MK_PAGE_BYTES;
}

/* ring_issued == pos and the full phase: here, the stage at pos has landed in the slot */
static inline bool mk_stream_wait_full(mk_control&, mk_u32 slot, mk_u32 pos, mk_u32)
{
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (g_landed[slot].load(std::memory_order_acquire) != pos + 1) {
        if (std::chrono::steady_clock::now() > deadline) {
            fail("a reader waited for a stage that never landed");
            return false;
        }
        std::this_thread::yield();
    }
    return true;
}

static inline void mk_ring_hand_back(mk_u64* empty, mk_u32 readers, int lane)
{
    __syncwarp();   /* every lane's reads of the page before lane 0's arrival */
    if (lane == 0)
        g_handed[empty - g_ctl.ring_empty].fetch_add(readers, std::memory_order_release);
}

/* ---- the op's pages (pages.cuh's mk_pages, the fields the loop reads) ---------------------- */
struct mk_pages {
    unsigned char* base;
    const mk_u8* idx;
    mk_u32 stream_pos;

    float* operator[](int i) const
    {
        return reinterpret_cast<float*>(base + (mk_u32)idx[i] * (mk_u32)MK_PAGE_BYTES);
    }
};

/* gemm_stream.cuh's, around the loop */
enum { MK_STREAM_WARPS = MK_THREADS / 32, MK_STREAM_A_CHUNK = 4096 };

static inline mk_u32 mk_stream_chunk_at(mk_u32 buf, int r, int u, int pitch)
{
    return buf + (mk_u32)(r * pitch) + ((mk_u32)(u ^ (r & 7)) << 4);
}

static inline mk_u32 mk_stream_a_buffer(const mk_pages& pages, int warp)
{
    return mk_smem_addr(pages[warp >> 2]) + (mk_u32)(warp & 3) * MK_STREAM_A_CHUNK;
}

/* ---- the device source -------------------------------------------------------------------- */
#include "../../megak/device/ops/gemm_stream_f32.cuh"

/* ---- the run --------------------------------------------------------------------------------- */
static float* tensor(std::vector<float>& store, int rows, int ld)
{
    store.assign((size_t)rows * ld + 16, NAN);
    float* p = store.data();
    while (reinterpret_cast<std::uintptr_t>(p) % 16)
        ++p;
    return p;
}

int main(int argc, char** argv)
{
    if (argc != 10) {
        std::fprintf(stderr, "usage: %s ROWS COLS KLEN K0 LDA LDB R LATE SEED\n", argv[0]);
        return 2;
    }
    int a_[9];
    for (int i = 0; i < 9; ++i)
        a_[i] = std::atoi(argv[i + 1]);
    const int rows = a_[0], cols = a_[1], klen = a_[2], k0 = a_[3], lda = a_[4], ldb = a_[5];
    const int R = a_[6], seed = a_[8];
    g_late = a_[7] != 0;
    const int row0 = 2, col0 = 64;                 /* the band inside larger tensors */
    const int M = row0 + rows + 3, K = k0 + klen, N = col0 + cols + 5;
    if (lda < K + 3 || ldb < N || rows > 16 || cols > MK_STREAM_F32_COLS ||
        R > MK_STREAM_MAX_RING) {
        std::fprintf(stderr, "LDA >= %d, LDB >= %d, ROWS <= 16, COLS <= 32, R <= %d\n", K + 3,
                     N, MK_STREAM_MAX_RING);
        return 2;
    }
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<float> sa, sb;
    float* A = tensor(sa, M, lda);                 /* NaN outside the record's operands */
    float* B = tensor(sb, K, ldb);
    for (int i = row0; i < row0 + rows; ++i)
        for (int k = k0; k < k0 + klen; ++k)
            A[(size_t)i * lda + k] = uni(rng);
    for (int k = k0; k < K; ++k)
        for (int j = col0; j < col0 + cols; ++j)
            B[(size_t)k * ldb + j] = uni(rng);

    mk_tensor op[MK_MAX_TENSORS] = {};
    op[MK_ARG_A] = {reinterpret_cast<mk_u64>(A), (mk_u32)M, (mk_u32)K, (mk_u32)lda, MK_DTYPE_F32};
    op[MK_ARG_B] = {reinterpret_cast<mk_u64>(B), (mk_u32)K, (mk_u32)N, (mk_u32)ldb, MK_DTYPE_F32};
    mk_instr in = {};
    in.opcode = MK_OP_GEMM;
    in.pages = MK_STREAM_PAGES;
    in.row0 = row0;
    in.col0 = col0;
    in.rows = rows;
    in.cols = cols;
    in.k0 = k0;
    in.klen = klen;
    in.param = (1u << 16) | 0u;
    in.flags = MK_FLAG_STREAM | MK_FLAG_STREAM_F32 | MK_FLAG_B_READY;

    g_phys = RING0 + R;
    std::vector<float> smem_store((size_t)g_phys * MK_PAGE_BYTES / 4 + 256, NAN);
    g_smem = reinterpret_cast<unsigned char*>(smem_store.data());
    while (reinterpret_cast<std::uintptr_t>(g_smem) % 1024)
        g_smem += 4;
    const mk_pages pages = {g_smem, OP_IDX, 0u};
    g_ctl.params.stream_pages = (mk_u32)R;
    const int nst = (klen + MK_STREAM_BOX_ROWS - 1) / MK_STREAM_BOX_ROWS;

    std::thread streamer;
    if (R > 0)
        streamer = std::thread([&] {
            std::mt19937 srng((unsigned)seed * 31u);
            for (int pos = 0; pos < nst; ++pos) {
                const int slot = pos % R;
                const mk_u32 want = 2u * (mk_u32)(pos / R);   /* both readers of pos - R */
                const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                while (g_handed[slot].load(std::memory_order_acquire) < want) {
                    if (std::chrono::steady_clock::now() > deadline) {
                        fail("a stage was never handed back");
                        return;
                    }
                    std::this_thread::yield();
                }
                float* page = reinterpret_cast<float*>(mk_ring_page(g_ctl.params, slot));
                for (int i = 0; i < MK_PAGE_BYTES / 4; ++i)
                    page[i] = NAN;
                if (srng() % 2)
                    std::this_thread::sleep_for(std::chrono::microseconds(srng() % 40));
                for (int r = 0; r < MK_STREAM_BOX_ROWS; ++r)
                    for (int c = 0; c < 8; ++c)
                        for (int e = 0; e < 4; ++e) {
                            const int k = k0 + MK_STREAM_BOX_ROWS * pos + r;
                            const int j = col0 + 4 * c + e;
                            page[(128 * r + 16 * (c ^ (r & 7))) / 4 + e] =
                                k < K && j < N ? B[(size_t)k * ldb + j] : 0.f;
                        }
                g_landed[slot].store((mk_u32)pos + 1u, std::memory_order_release);
            }
        });

    std::barrier<> sync(MK_THREADS);
    g_sync = &sync;
    for (int w = 0; w < MK_THREADS / 32; ++w)
        g_warp_sync[w] = new std::barrier<>(32);
    static float acc_all[MK_THREADS][8][4];
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < (unsigned)MK_THREADS; ++t)
        threads.emplace_back([&, t] {
            threadIdx.x = t;
            t_rng.seed((unsigned)seed * 7919u + t);
            float acc[2][8][4] = {};
            mk_stream_kloop_f32(in, op, pages, acc, R > 0);
            if (!t_copies.open.empty() || !t_copies.groups.empty())
                fail("a copy issued and never waited for");
            for (int n8 = 0; n8 < 8; ++n8)
                for (int e = 0; e < 4; ++e) {
                    acc_all[t][n8][e] = acc[0][n8][e];
                    if (acc[1][n8][e] != 0.f || (n8 >= 4 && acc[0][n8][e] != 0.f))
                        fail("a sum outside the band's 4 n8 tiles of one m16 tile");
                }
        });
    for (std::thread& th : threads)
        th.join();
    if (streamer.joinable())
        streamer.join();
    if (R > 0)
        for (int s = 0; s < R && s < nst; ++s)
            if (g_handed[s].load() != 2u * (mk_u32)((nst - 1 - s) / R + 1))
                fail("a stage handed back other than twice");

    /* the page that is neither the op's nor the ring's: untouched */
    const float* spare = reinterpret_cast<const float*>(g_smem + 2 * MK_PAGE_BYTES);
    for (int i = 0; i < MK_PAGE_BYTES / 4; ++i)
        if (!std::isnan(spare[i])) {
            fail("a write to a page that is not the op's");
            break;
        }

    /* the 8 warps' sums, in the MMA layout: lane (g, t) holds row g + 8h, column
     * 8 n8 + 2t + e in acc[n8][2h + e] */
    double worst = 0.0;
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < cols; ++c) {
            const int g = r & 7, h = r >> 3, n8 = c >> 3, t = (c & 7) >> 1, e = c & 1;
            double sum = 0.0;
            for (int w = 0; w < MK_THREADS / 32; ++w)
                sum += acc_all[32 * w + 4 * g + t][n8][2 * h + e];
            if (r >= rows) {
                if (sum != 0.0)
                    fail("a row past the record's is not zero");
                continue;
            }
            double ref = 0.0, mag = 0.0;
            for (int k = k0; k < k0 + klen; ++k) {
                const double x = A[(size_t)(row0 + r) * lda + k];
                const double y = B[(size_t)k * ldb + col0 + c];
                ref += x * y;
                mag += std::fabs(x * y);
            }
            const double bound = 2.0 * (klen + 8) * 5.96e-8 * mag + 1e-30;
            const double err = std::fabs(sum - ref) / bound;
            if (!(err <= 1.0)) {
                std::fprintf(stderr, "row %d col %d: %.9g against %.9g\n", r, c, sum, ref);
                fail("a sum outside its fp32 bound");
            }
            worst = err > worst ? err : worst;
        }
    for (int w = 0; w < MK_THREADS / 32; ++w)
        delete g_warp_sync[w];
    std::printf("worst error %.3f of the bound\n", worst);
    if (g_failed)
        return 1;
    std::printf("OK\n");
    return 0;
}
