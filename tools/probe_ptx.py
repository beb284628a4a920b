"""What the standalone probes share (tools/probe_*.py build their kernels from source strings,
each its own cubin): the mbarrier operations of the weight ring's protocol, as
megak/device/stream.cuh spells them (MBARRIER: needs `u32` defined before it), the prelude
of a protocol probe (PRELUDE: types, the clock, the mbarriers) and of the bulk-copy probes
(BULK_PRELUDE: that, pages, the bulk copy, an L2 policy, a lane streaming HBM as the weight
ring does), the `--compile-only` check, the GPU made current (open_gpu), a cubin's kernels
(kernel_functions), and loading a probe's kernel on the GPU with device memory that is freed
on the way out (on_gpu)."""
import contextlib
import time

MBARRIER = r"""
/* ---- mbarriers (sync.cuh / stream.cuh spellings) ---------------------------------------- */
__device__ __forceinline__ void mbar_init(u32 bar, u32 count)
{ asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory"); }
/* One arrival (release, cta scope). */
__device__ __forceinline__ void mbar_arrive(u32 bar)
{ asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(bar) : "memory"); }
/* The arrival of this phase plus `bytes` of transactions the bulk load will complete. */
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes)
{ asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
               :: "r"(bar), "r"(bytes) : "memory"); }
/* True once the phase of parity `par` completed (acquire, cta scope). */
__device__ __forceinline__ bool mbar_try(u32 bar, u32 par)
{ u32 ok; asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                       "selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(par) : "memory");
  return ok != 0u; }
"""


def compile_only(compile_probe, entry: str) -> int:
    """A probe's --compile-only: build for sm_90a, print the compile report; 1 on a spill."""
    from megak.runtime.compiler import compile_report
    t0 = time.perf_counter()
    compiled = compile_probe("sm_90a")
    lines, problems = compile_report(compiled, (entry,), time.perf_counter() - t0)
    print("\n".join(lines))
    return 1 if problems else 0


def open_gpu(needs: str = ""):
    """GPU 0 made current: (driver bindings, its cuda.core Device, megak's device_info of it).
    `needs`: what of the probe needs sm_90 (bulk copies, clusters); SystemExit on an older
    GPU then."""
    from cuda.core import Device

    from megak.runtime.driver import _bindings, device_info
    dev = Device(0)
    dev.set_current()
    info = device_info(0)
    if needs and info["compute_capability"] < (9, 0):
        cc = "".join(map(str, info["compute_capability"]))
        raise SystemExit(f"{info['name']} is sm_{cc}: {needs} need sm_90")
    return _bindings(), dev, info


def allow_smem(drv, fn, smem: int) -> None:
    """Let kernel `fn` take `smem` bytes of dynamic shared memory."""
    from megak.runtime.driver import check
    check(drv.cuFuncSetAttribute(
        fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
        "cuFuncSetAttribute")


def kernel_functions(drv, cubin: bytes, entries, smem: int = 0) -> dict:
    """entry -> the CUfunction of each of `entries` in a probe's cubin, each allowed `smem`
    bytes of dynamic shared memory where smem is given."""
    from cuda.core import ObjectCode

    from megak.runtime.driver import check
    code = ObjectCode.from_cubin(cubin)
    fns = {e: check(drv.cuKernelGetFunction(code.get_kernel(e).handle), "cuKernelGetFunction")
           for e in entries}
    if smem:
        for fn in fns.values():
            allow_smem(drv, fn, smem)
    return fns


def load_kernel(compile_probe, entry: str, smem: int):
    """Build the probe for this GPU and load its kernel, allowed `smem` bytes of dynamic shared
    memory. Returns (driver bindings, the function, the device info, a cuda.core stream)."""
    drv, dev, info = open_gpu()
    fn = kernel_functions(drv, compile_probe(info["arch"]).cubin, (entry,), smem)[entry]
    return drv, fn, info, dev.create_stream()


@contextlib.contextmanager
def on_gpu(compile_probe, entry: str, smem: int):
    """load_kernel, and a megak Memory for the probe's buffers, closed on the way out. Yields
    (driver bindings, the function, the device info, the stream's handle, the Memory)."""
    from megak.runtime import memory as mem
    drv, fn, info, stream = load_kernel(compile_probe, entry, smem)
    m = mem.Memory(0)
    try:
        yield drv, fn, info, stream.handle, m
    finally:
        m.close()


# The types, a shared-memory address, the clock and the mbarriers: what a probe of the ring's
# protocol starts from (its own `extern __shared__` declaration follows).
PRELUDE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u64 now() { u64 t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
""" + MBARRIER

BULK_PRELUDE = PRELUDE + r"""
#define PAGE 16384u
extern __shared__ __align__(1024) unsigned char smem[];

/* One bulk copy of `bytes` from global memory into shared memory at dst, its bytes completing
 * on the mbarrier at bar, with an L2 policy (the weight ring's copy, stream.cuh). */
__device__ __forceinline__ void bulk_load(unsigned char* dst, const unsigned char* src, u32 bytes,
                                          u64* bar, u64 pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;"
                 :: "r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(bar)), "l"(pol) : "memory");
}

/* An L2 policy for a whole copy: kept (evict-last) or let go first (evict-first). */
__device__ __forceinline__ u64 policy(bool evict_last)
{
    u64 p;
    if (evict_last)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    else
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* One lane pulling its SM's share of HBM as the weight ring does: `ring` bulk copies of PAGE
 * bytes in flight (evict-first) over the `share` bytes at region, wrapping, into the pages
 * at `pages` with one mbarrier each in full[] (initialised, count 1), each page reissued as it
 * lands, until *done is set; then every copy in flight lands (the block's shared memory
 * outlives them). Returns the copies landed, or ~0u past the deadline. */
__device__ __noinline__ u32 stream_lane(const unsigned char* region, u64 share,
                                        unsigned char* pages, u64* full, u32 ring,
                                        const volatile u32* done, u64 deadline)
{
    const u64 pol = policy(false);
    const u32 n = (u32)(share / PAGE);
    u32 issued = 0, landed = 0;
    for (; issued < ring && issued < n; ++issued) {
        mbar_expect_tx(sa(&full[issued]), PAGE);
        bulk_load(pages + issued * PAGE, region + (u64)issued * PAGE, PAGE, &full[issued], pol);
    }
    bool stop = false;
    while (landed < issued) {   /* land in issue order; reissue each slot until told to stop */
        const u32 slot = landed % ring, par = (landed / ring) & 1u;
        while (!mbar_try(sa(&full[slot]), par))
            if (now() > deadline)
                return ~0u;
        ++landed;
        stop = stop || *done != 0u;
        if (!stop) {
            mbar_expect_tx(sa(&full[slot]), PAGE);
            bulk_load(pages + slot * PAGE, region + (u64)(issued % n) * PAGE, PAGE, &full[slot],
                      pol);
            ++issued;
        }
    }
    return landed;
}
"""
