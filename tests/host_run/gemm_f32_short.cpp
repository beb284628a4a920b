/* The short fp32 tile's device source (megak/device/ops/gemm_f32_short.cuh, with the shared
 * epilogue of ops/gemm_epilogue.cuh and epilogue.cuh) run on the CPU, so that its index math,
 * its ring of stages and its barriers are checked as written, not as restated:
 *
 *   - 256 std::threads are the compute threads (threadIdx.x each), a std::barrier is the
 *     compute barrier (mk_compute_sync), threads are delayed at random before it;
 *   - the loader's preload runs first, lane by lane, and its copies land before the op starts
 *     (the loader waits for them before it hands the slot over);
 *   - a cp.async copy lands when issued ("early": a stage overwritten while a warp still reads
 *     it gives wrong sums) or only at the wait_group that covers it ("late": a stage read
 *     before its copies were waited for and a barrier passed gives wrong sums);
 *   - the op's 4 pages sit at scattered physical pages among 6, every byte poisoned (NaN), so a
 *     read of a stage no copy filled shows, and the two unused pages must stay untouched; the
 *     pages handed back early (pages.release) are poisoned then, and must not change after;
 *   - A and B hold NaN outside the tile's operands, and OUT outside its region: a read or a
 *     write outside them shows.
 * The headers the body includes are replaced by the stand-ins below (their include guards
 * defined first), everything else is the device source itself.
 *
 *   gemm_f32_short ROWS COLS KLEN ROW0 COL0 K0 LDA LDB PRELOAD B_READY LATE BIAS RES ACT SEED
 *
 * PRELOAD 0: no loader (the separate-launch entry); 1: the loader fills what
 * mk_gemm_f32_short_preload_stages says. ACT: the MK_ACT_* code. Prints the worst error
 * against a float64 reference (relative to the fp32 bound) and exits 0 when every check holds.
 */
#include <barrier>
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

struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
struct mk_thread_index { unsigned x; };
static thread_local mk_thread_index threadIdx;

#include "../../megak/device/instr.h"

/* ---- stand-ins for sync.cuh, pages.cuh, tensor.cuh, stream.cuh, gemm_bf16.cuh ------------- */
#define MEGAK_SYNC_CUH
#define MEGAK_PAGES_CUH
#define MEGAK_TENSOR_CUH
#define MEGAK_STREAM_CUH
#define MEGAK_OP_GEMM_BF16_CUH

typedef unsigned char mk_u8;
enum mk_preload_parts { MK_PRELOAD_B = 1, MK_PRELOAD_REST = 2 };   /* pages.cuh's */

static const int N_PHYS = 6;                       /* physical pages; the op holds 4 */
static unsigned char* g_smem;                      /* the block's pages */
static std::barrier<>* g_sync;
static bool g_late;
static bool g_failed;

static void fail(const char* what)
{
    std::fprintf(stderr, "FAIL: %s\n", what);
    g_failed = true;
}

static inline mk_u32 mk_smem_addr(const void* p)
{
    return (mk_u32)(static_cast<const unsigned char*>(p) - g_smem);
}

static inline mk_u32 smem_bytes() { return (mk_u32)(N_PHYS * MK_PAGE_BYTES); }

#include "cp_async.h"

static thread_local std::mt19937 t_rng;

static inline void mk_compute_sync()
{
    if (t_rng() % 8 == 0)   /* some threads come late */
        std::this_thread::sleep_for(std::chrono::microseconds(t_rng() % 50));
    g_sync->arrive_and_wait();
}

static inline void mk_trace_mark(int) {}

static inline int mk_clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

static std::vector<unsigned char> g_released_image;   /* pages handed back, as they were then */
static mk_u32 g_released_bits;

struct mk_pages {
    unsigned char* base;
    const mk_u8* idx;
    mk_u32 preloaded;
    mk_u32* released;
    mk_u32* free_mask;
    mk_u32 stream_pos;
    mk_u32 stream_stages;

    float* operator[](int i) const
    {
        return reinterpret_cast<float*>(base + (mk_u32)idx[i] * (mk_u32)MK_PAGE_BYTES);
    }

    /* called by all compute threads after a barrier; thread 0 hands the pages back, which
     * here poisons them as the next instruction's copies would overwrite them (a read after
     * the hand-back shows) and keeps their image (a write after it shows) */
    void release(mk_u32 first, mk_u32 end) const
    {
        if (threadIdx.x != 0)
            return;
        for (mk_u32 i = first; i < end; ++i) {
            g_released_bits |= 1u << idx[i];
            std::memset(g_smem + (size_t)idx[i] * MK_PAGE_BYTES, 0xff, MK_PAGE_BYTES);
        }
        g_released_image.assign(g_smem, g_smem + N_PHYS * MK_PAGE_BYTES);
    }
};

static inline bool mk_vec4_ok(const mk_tensor& t, mk_u64 off)
{
    return (t.ptr + 4 * off) % 16 == 0 && t.ld % 4 == 0;
}

static inline float4 mk_ld4_any(const mk_tensor& t, mk_u64 off, int n, bool)
{
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    const float* p = reinterpret_cast<const float*>(t.ptr) + off;
    for (int i = 0; i < 4 && i < n; ++i)
        v[i] = p[i];
    return make_float4(v[0], v[1], v[2], v[3]);
}

static inline void mk_st4_any(const mk_tensor& t, mk_u64 off, float4 x, int n, bool)
{
    float* p = reinterpret_cast<float*>(t.ptr) + off;
    const float v[4] = {x.x, x.y, x.z, x.w};
    for (int i = 0; i < 4 && i < n; ++i)
        p[i] = v[i];
}

/* (the record checks of epilogue.cuh call it; the run does not) */
static inline bool mk_tensor_region_ok(const mk_tensor&, long long, long long, long long,
                                       long long)
{
    return true;
}

/* ---- the device source -------------------------------------------------------------------- */
#include "../../megak/device/epilogue.cuh"
#include "../../megak/device/ops/gemm_epilogue.cuh"
#include "../../megak/device/ops/gemm_f32_short.cuh"

/* ---- the run --------------------------------------------------------------------------------- */
static float* tensor(std::vector<float>& store, int rows, int ld)
{
    store.assign((size_t)rows * ld + 16, NAN);
    float* p = store.data();
    while (reinterpret_cast<std::uintptr_t>(p) % 16)
        ++p;
    return p;
}

static double act_ref(double v, int act)
{
    if (act == MK_ACT_RELU)
        return v < 0 ? 0 : v;
    if (act == MK_ACT_GELU)
        return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    if (act == MK_ACT_SILU)
        return v / (1 + std::exp(-v));
    return v;
}

int main(int argc, char** argv)
{
    if (argc != 16) {
        std::fprintf(stderr, "usage: %s ROWS COLS KLEN ROW0 COL0 K0 LDA LDB PRELOAD B_READY "
                             "LATE BIAS RES ACT SEED\n", argv[0]);
        return 2;
    }
    int a_[15];
    for (int i = 0; i < 15; ++i)
        a_[i] = std::atoi(argv[i + 1]);
    const int rows = a_[0], cols = a_[1], klen = a_[2], row0 = a_[3], col0 = a_[4], k0 = a_[5];
    const int lda = a_[6], ldb = a_[7], preload = a_[8], b_ready = a_[9], bias = a_[11];
    const int res = a_[12], act = a_[13], seed = a_[14];
    g_late = a_[10] != 0;
    const int M = row0 + rows + 3, K = k0 + klen + 5, N = col0 + cols + 7;
    if (lda < K || ldb < N) {
        std::fprintf(stderr, "LDA must be >= %d and LDB >= %d\n", K, N);
        return 2;
    }
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<float> sa, sb, so, sbias, sres;
    float* A = tensor(sa, M, lda);
    float* B = tensor(sb, K, ldb);
    float* O = tensor(so, M, N);
    float* BIAS = tensor(sbias, 1, N);
    float* RES = tensor(sres, M, N);
    for (int i = row0; i < row0 + rows; ++i)     /* NaN outside the tile's operands */
        for (int k = k0; k < k0 + klen; ++k)
            A[(size_t)i * lda + k] = uni(rng);
    for (int k = k0; k < k0 + klen; ++k)
        for (int j = col0; j < col0 + cols; ++j)
            B[(size_t)k * ldb + j] = uni(rng);
    for (int j = col0; j < col0 + cols; ++j)
        BIAS[j] = uni(rng);
    for (int i = row0; i < row0 + rows; ++i)
        for (int j = col0; j < col0 + cols; ++j)
            RES[(size_t)i * N + j] = uni(rng);

    mk_tensor op[MK_MAX_TENSORS] = {};
    op[MK_ARG_A] = {reinterpret_cast<mk_u64>(A), (mk_u32)M, (mk_u32)K, (mk_u32)lda, MK_DTYPE_F32};
    op[MK_ARG_B] = {reinterpret_cast<mk_u64>(B), (mk_u32)K, (mk_u32)N, (mk_u32)ldb, MK_DTYPE_F32};
    op[MK_ARG_OUT] = {reinterpret_cast<mk_u64>(O), (mk_u32)M, (mk_u32)N, (mk_u32)N, MK_DTYPE_F32};
    op[MK_ARG_BIAS] = {reinterpret_cast<mk_u64>(BIAS), 1u, (mk_u32)N, (mk_u32)N, MK_DTYPE_F32};
    op[MK_ARG_RESIDUAL] = {reinterpret_cast<mk_u64>(RES), (mk_u32)M, (mk_u32)N, (mk_u32)N,
                           MK_DTYPE_F32};
    mk_instr in = {};
    in.opcode = MK_OP_GEMM;
    in.pages = MK_GEMM_PAGES;
    in.row0 = row0;
    in.col0 = col0;
    in.rows = rows;
    in.cols = cols;
    in.k0 = k0;
    in.klen = klen;
    in.out_row0 = row0;
    in.flags = (b_ready ? MK_FLAG_B_READY : 0u) | (bias ? MK_FLAG_BIAS : 0u) |
               (res ? MK_FLAG_RESIDUAL : 0u) | ((mk_u32)act << MK_FLAG_ACT_SHIFT);
    if (!mk_gemm_f32_short_ok(in, op)) {
        std::printf("not a short tile\n");
        return 3;
    }

    std::vector<unsigned char> smem_store((size_t)N_PHYS * MK_PAGE_BYTES + 1024, 0xff);
    g_smem = smem_store.data();
    while (reinterpret_cast<std::uintptr_t>(g_smem) % 1024)
        ++g_smem;
    const mk_u8 idx[MK_GEMM_PAGES] = {4, 1, 3, 0};   /* pages 2 and 5 are not the op's */
    mk_pages pages = {g_smem, idx, 0u, nullptr, nullptr, 0u, 0u};

    if (preload) {   /* the loader: B early (before its wait) where B is ready, the rest late */
        pages.preloaded = mk_gemm_f32_short_preload_stages(in, op);
        const mk_u32 parts[2] = {b_ready ? (mk_u32)MK_PRELOAD_B : 0u,
                                 b_ready ? (mk_u32)MK_PRELOAD_REST
                                         : (mk_u32)(MK_PRELOAD_B | MK_PRELOAD_REST)};
        for (mk_u32 p : parts)
            for (mk_u32 lane = 0; p && pages.preloaded && lane < 32; ++lane)
                mk_gemm_f32_short_preload(in, op, pages, lane, p);
        mk_cp_async_commit();
        wait_groups(0);   /* the loader's cp.async.wait_all before it hands the slot over */
    }

    std::barrier<> sync(MK_THREADS);
    g_sync = &sync;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < (unsigned)MK_THREADS; ++t)
        threads.emplace_back([&, t] {
            threadIdx.x = t;
            t_rng.seed((unsigned)seed * 7919u + t);
            mk_gemm_f32_short_run(in, op, pages);
            if (!t_copies.open.empty())
                fail("a copy issued and never committed");
            wait_groups(0);
        });
    for (std::thread& th : threads)
        th.join();

    /* the pages that are not the op's, untouched; those handed back, unchanged since */
    for (int p : {2, 5})
        for (int i = 0; i < MK_PAGE_BYTES; ++i)
            if (g_smem[p * MK_PAGE_BYTES + i] != 0xff) {
                fail("a write to a page the op does not hold");
                break;
            }
    if (g_released_bits != ((1u << idx[1]) | (1u << idx[2]) | (1u << idx[3])))
        fail("pages 1-3 were not handed back (or others were)");
    for (int p = 0; p < N_PHYS; ++p)
        if ((g_released_bits >> p) & 1u &&
            std::memcmp(g_released_image.data() + p * MK_PAGE_BYTES, g_smem + p * MK_PAGE_BYTES,
                        MK_PAGE_BYTES) != 0)
            fail("a page written after it was handed back");

    double worst = 0;
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            const float got = O[(size_t)i * N + j];
            const bool inside = i >= row0 && i < row0 + rows && j >= col0 && j < col0 + cols;
            if (!inside) {
                if (!std::isnan(got)) {
                    fail("a write outside the output region");
                    i = M;
                    break;
                }
                continue;
            }
            double v = 0, mag = 0;
            for (int k = k0; k < k0 + klen; ++k) {
                v += (double)A[(size_t)i * lda + k] * B[(size_t)k * ldb + j];
                mag += std::fabs((double)A[(size_t)i * lda + k] * B[(size_t)k * ldb + j]);
            }
            if (bias) {
                v += BIAS[j];
                mag += std::fabs(BIAS[j]);
            }
            v = act_ref(v, act);
            if (res) {
                v += RES[(size_t)i * N + j];
                mag += std::fabs(RES[(size_t)i * N + j]);
            }
            /* fp32 sums of klen products, then the epilogue's few roundings and activation */
            const double bound = (2.0 * klen + 8) * std::ldexp(1.0, -24) * (mag + 1);
            const double err = std::isfinite(got) ? std::fabs(got - v) / bound : INFINITY;
            worst = err > worst ? err : worst;
        }
    if (!(worst <= 1.0))
        fail("an output off its float64 reference (or not written)");
    std::printf("worst error / bound %.3g; %s\n", worst, g_failed ? "FAIL" : "OK");
    return g_failed ? 1 : 0;
}
