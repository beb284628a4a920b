/* The copy's device source (megak/device/ops/copy.cuh, mk_copy_run) run on the CPU, so that
 * its index math is checked as written, not as restated: the scalar head, the float4 body
 * (one unit a thread, or the rolling register pipeline with its walkers), the scalar tail, and
 * the all-scalar path where A and OUT disagree on the 16-B phase; and the takers
 * (MK_FLAG_COPY_TAKE), whose hand-out, broadcast words and bands run as written
 * (megak/runtime/take_model.py models the protocol; this runs the code).
 *
 *   - 256 std::threads are the compute threads (threadIdx.x each), all running one record;
 *   - with takers, each taker is a block: its 256 threads, its own control block, and for each
 *     of its warps an exchange (__shfl_sync: the source lane's word, a std::barrier of the 32
 *     lanes before and after its read, lanes delayed at random before each); the takers run at
 *     once on one counter (atomicAdd: an atomic_ref, the taking lane delayed at random before
 *     a take), run after run from a given epoch, as a program's launches would: each run must
 *     take the counter from epoch * (bands + 8 takers) to (epoch + 1) * (bands + 8 takers).
 *     Built with -fsanitize=thread too (test_device_copy_host.py); a shuffle that not every
 *     lane of the warp reaches never ends (the run's deadline fails it);
 *   - A is NaN outside the copied region and OUT everywhere before each run, with fresh values
 *     inside: a unit never copied, a read outside the region or a write outside it shows, and
 *     every access is checked to lie inside its operand's region, a float4 one 16-B aligned
 *     (the GPU would fault, or read another tensor).
 * The headers the body includes are replaced by the stand-ins below (their include guards
 * defined first), everything else is the device source itself.
 *
 *   copy ROWS COLS ROW0 COL0 LDA LDO OFFA OFFO RUNS SEED [TAKERS EPOCH0]
 *
 * OFFA / OFFO: A's and OUT's origins that many floats past a 16-B boundary (0-3). TAKERS: 0
 * (the default) one dealt-out record, else that many takers sharing the region, from epoch
 * EPOCH0. Prints what failed, and exits 0 when every check holds (4 when a run never ends).
 */
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#define __device__
#define __forceinline__ inline

struct float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct mk_thread_index { unsigned x; };
static thread_local mk_thread_index threadIdx;

#include "../../megak/device/instr.h"

/* ---- stand-ins for sync.cuh, pages.cuh, tensor.cuh, flag.cuh -------------------------------- */
#define MEGAK_SYNC_CUH
#define MEGAK_PAGES_CUH
#define MEGAK_TENSOR_CUH
#define MEGAK_FLAG_CUH

static std::atomic<bool> g_failed{false};
static std::mutex g_print;

static void fail(const char* what)
{
    std::lock_guard<std::mutex> hold(g_print);
    if (!g_failed.exchange(true))
        std::fprintf(stderr, "FAIL: %s\n", what);
}

struct mk_pages {};
struct mk_control {            /* the fields of pages.cuh's the takers read */
    mk_params params;
};
/* one warp's __shfl_sync: the source lane's word, read by every lane between two barriers of
 * the warp (the second keeps the next exchange's write after every read of this one) */
struct warp_exchange {
    std::barrier<> lanes{32};
    mk_u32 word = 0;
};
static thread_local mk_control* t_ctl;
static thread_local warp_exchange* t_warp;
static thread_local std::mt19937 t_rng;

static inline mk_control& mk_ctl() { return *t_ctl; }

static inline void late_at_times()
{
    if (t_rng() % 8 == 0)   /* some lanes come late */
        std::this_thread::sleep_for(std::chrono::microseconds(t_rng() % 40));
}

static inline mk_u32 __shfl_sync(unsigned mask, mk_u32 v, int src)
{
    if (mask != 0xffffffffu)
        fail("a shuffle of part of the warp");
    late_at_times();
    if ((int)(threadIdx.x & 31u) == src)
        t_warp->word = v;
    t_warp->lanes.arrive_and_wait();
    const mk_u32 got = t_warp->word;
    late_at_times();
    t_warp->lanes.arrive_and_wait();
    return got;
}

static inline mk_u32 atomicAdd(mk_u32* p, mk_u32 v)
{
    if (t_rng() % 4 == 0)   /* the takers' adds in every order */
        std::this_thread::sleep_for(std::chrono::microseconds(t_rng() % 60));
    return std::atomic_ref<mk_u32>(*p).fetch_add(v);
}

/* the copied region of each operand: every access must fall inside it */
struct region { std::uintptr_t base; mk_u32 ld, row0, rows, col0, cols; };
static region g_src, g_dst;

static void check_access(const region& g, const float* p, int n, const char* what)
{
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(p);
    if (a < g.base || (a - g.base) % 4) {
        fail(what);
        return;
    }
    const std::uintptr_t e = (a - g.base) / 4;
    const std::uintptr_t r = e / g.ld, c = e % g.ld;
    if (r < g.row0 || r >= g.row0 + g.rows || c < g.col0 || c + n > g.col0 + g.cols)
        fail(what);
    if (n == 4 && a % 16)
        fail("a float4 access off 16 B (a GPU would fault)");
}

static inline float mk_ld_f(const float* p)
{
    check_access(g_src, p, 1, "a load outside the copied region");
    return *p;
}

static inline float4 mk_ld_f4(const float* p)
{
    check_access(g_src, p, 4, "a float4 load outside the copied region");
    return make_float4(p[0], p[1], p[2], p[3]);
}

static inline void mk_st_f(float* p, float v)
{
    check_access(g_dst, p, 1, "a store outside the copied region");
    *p = v;
}

static inline void mk_st_f4(float* p, float4 v)
{
    check_access(g_dst, p, 4, "a float4 store outside the copied region");
    p[0] = v.x;
    p[1] = v.y;
    p[2] = v.z;
    p[3] = v.w;
}

static inline bool mk_flag_any(const mk_tensor*, bool) { return false; }   /* plain fp32 */
template <bool B>
static inline void mk_flag_elementwise(const mk_instr&, const mk_tensor*)
{
    fail("the flagged path taken for plain tensors");
}
static inline bool mk_f32_region_ok(const mk_tensor&, long long, long long, long long, long long)
{
    return true;
}
static inline bool mk_flag_region_ok(const mk_tensor&, long long, long long, long long, long long)
{
    return false;
}

/* ---- the device source -------------------------------------------------------------------- */
#include "../../megak/device/ops/copy.cuh"

/* ---- the run --------------------------------------------------------------------------------- */
static float* tensor(std::vector<float>& store, int rows, int ld, int offset_floats)
{
    store.assign((size_t)rows * ld + 8, NAN);
    float* p = store.data();
    while (reinterpret_cast<std::uintptr_t>(p) % 16)
        ++p;
    return p + offset_floats;
}

/* Fresh values inside A's region, NaN around them; OUT all NaN. */
static void poison(float* A, std::vector<float>& out_store, int M, int lda, int row0, int rows,
                   int col0, int cols, std::mt19937& rng)
{
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < lda; ++j) {
            const bool inside = i >= row0 && i < row0 + rows && j >= col0 && j < col0 + cols;
            A[(size_t)i * lda + j] = inside ? uni(rng) : NAN;
        }
    std::fill(out_store.begin(), out_store.end(), NAN);
}

/* OUT's region bit for bit A's, NaN everywhere else. */
static void check_out(const float* A, const float* O, int M, int lda, int ldo, int row0,
                      int rows, int col0, int cols, int run)
{
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < ldo; ++j) {
            const float got = O[(size_t)i * ldo + j];
            const bool inside = i >= row0 && i < row0 + rows && j >= col0 && j < col0 + cols;
            if (inside ? std::memcmp(&got, &A[(size_t)i * lda + j], 4) != 0 : !std::isnan(got)) {
                std::lock_guard<std::mutex> hold(g_print);
                std::fprintf(stderr, "run %d: OUT[%d, %d] = %g (%s)\n", run, i, j, got,
                             inside ? "not copied" : "written outside the region");
                g_failed = true;
                return;
            }
        }
}

int main(int argc, char** argv)
{
    if (argc != 11 && argc != 13) {
        std::fprintf(stderr, "usage: %s ROWS COLS ROW0 COL0 LDA LDO OFFA OFFO RUNS SEED "
                             "[TAKERS EPOCH0]\n", argv[0]);
        return 2;
    }
    int a_[12] = {};
    for (int i = 0; i < argc - 1; ++i)
        a_[i] = std::atoi(argv[i + 1]);
    const int rows = a_[0], cols = a_[1], row0 = a_[2], col0 = a_[3], lda = a_[4], ldo = a_[5];
    const int offa = a_[6], offo = a_[7], runs = a_[8], seed = a_[9], takers = a_[10];
    const int epoch0 = a_[11];
    const int M = row0 + rows + 2;
    if (lda < col0 + cols || ldo < col0 + cols || offa < 0 || offa > 3 || offo < 0 ||
        offo > 3 || takers < 0 || epoch0 < 0) {
        std::fprintf(stderr, "LDA and LDO must be >= %d, OFFA and OFFO 0-3\n", col0 + cols);
        return 2;
    }
    std::thread([] {   /* a run that never ends is a failure, not a hung test */
        std::this_thread::sleep_for(std::chrono::seconds(30));
        std::fprintf(stderr, "FAIL: the run did not end in 30 s\n");
        std::fflush(stderr);
        std::quick_exit(4);
    }).detach();

    std::mt19937 rng(seed);
    std::vector<float> sa, so;
    float* A = tensor(sa, M, lda, offa);
    float* O = tensor(so, M, ldo, offo);
    g_src = {reinterpret_cast<std::uintptr_t>(A), (mk_u32)lda, (mk_u32)row0, (mk_u32)rows,
             (mk_u32)col0, (mk_u32)cols};
    g_dst = {reinterpret_cast<std::uintptr_t>(O), (mk_u32)ldo, (mk_u32)row0, (mk_u32)rows,
             (mk_u32)col0, (mk_u32)cols};
    mk_tensor op[MK_MAX_TENSORS] = {};
    op[MK_ARG_A] = {reinterpret_cast<mk_u64>(A), (mk_u32)M, (mk_u32)lda, (mk_u32)lda,
                    MK_DTYPE_F32};
    op[MK_ARG_OUT] = {reinterpret_cast<mk_u64>(O), (mk_u32)M, (mk_u32)ldo, (mk_u32)ldo,
                      MK_DTYPE_F32};
    /* one block per taker (one for a dealt-out record), each its record and control block */
    const int blocks = takers > 0 ? takers : 1;
    std::vector<mk_instr> ins(blocks);
    for (int k = 0; k < blocks; ++k) {
        mk_instr& in = ins[k];
        in = {};
        in.opcode = MK_OP_COPY;
        in.row0 = row0;
        in.col0 = col0;
        in.rows = rows;
        in.cols = cols;
        if (takers > 0) {
            in.flags = MK_FLAG_COPY_TAKE;
            in.k0 = takers;
            in.param = (mk_u32)k;
            in.out_row0 = 0;      /* counter 0 */
        }
        if (!mk_copy_check(in))
            fail("mk_copy_check refused the record");
    }
    const mk_u32 units = (mk_u32)rows * (mk_u32)(cols / 4);
    const mk_u32 per_run = (units + MK_COPY_TAKE_UNITS - 1) / MK_COPY_TAKE_UNITS +
                           (mk_u32)MK_COPY_TAKE_WARPS * (mk_u32)takers;
    mk_u32 counter = (mk_u32)epoch0 * per_run;   /* what the runs before left */

    for (int run = 0; run < runs && !g_failed; ++run) {
        poison(A, so, M, lda, row0, rows, col0, cols, rng);
        const mk_u32 epoch = (mk_u32)(epoch0 + run);
        std::vector<mk_control> ctl(blocks);
        std::vector<std::unique_ptr<warp_exchange>> warps;
        for (int k = 0; k < blocks; ++k) {
            ctl[k].params.counters = reinterpret_cast<mk_u64>(&counter);
            ctl[k].params.epoch = epoch;
            for (int w = 0; w < MK_THREADS / 32; ++w)
                warps.push_back(std::make_unique<warp_exchange>());
        }
        std::vector<std::thread> threads;
        for (int k = 0; k < blocks; ++k)
            for (unsigned t = 0; t < (unsigned)MK_THREADS; ++t)
                threads.emplace_back([&, k, t] {
                    threadIdx.x = t;
                    t_ctl = &ctl[k];
                    t_warp = warps[k * (MK_THREADS / 32) + t / 32].get();
                    t_rng.seed((unsigned)seed * 7919u + (unsigned)run * 131u + k * 257u + t);
                    mk_pages pages;
                    mk_copy_run(ins[k], op, pages);
                });
        for (std::thread& th : threads)
            th.join();
        check_out(A, O, M, lda, ldo, row0, rows, col0, cols, run);
        if (takers > 0 && counter != (epoch + 1u) * per_run) {
            std::fprintf(stderr, "run %d: the counter ends at %u, not %u\n", run, counter,
                         (epoch + 1u) * per_run);
            g_failed = true;
        }
    }
    std::printf("%d x %d at (%d, %d), %d takers, %d runs: %s\n", rows, cols, row0, col0, takers,
                runs, g_failed ? "FAIL" : "OK");
    return g_failed ? 1 : 0;
}
