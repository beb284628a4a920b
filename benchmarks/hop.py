"""Hop microbenchmark: what one dependent hand-off between SMs costs, two ways.

One block per SM (cooperative launch, so every block is resident and none can wait on a block
that never starts), one working thread each. A chain of ``n_hops`` dependent hops: hop i is
done by block ``i % n_sm``, which waits for hop i-1's result (written by another SM), computes
its own payload from it and publishes that. Two ways to publish:

  word   data as its own flag: one aligned 64-bit word = payload (low half) + this launch's
         epoch (high half); relaxed ``st``/``ld`` at gpu scope, no fence, no counter.
  flag   a separate flag: the payload with a relaxed store, then the flag (= epoch) with
         ``st.release.gpu``; the consumer polls the flag with ``ld.acquire.gpu``, then reads
         the payload.

Figures from an earlier probe on an H200 (1000 hops): word 0.251 us per hop, flag 0.670 us.

Timing: inside the kernel, by ``%globaltimer``, from just before hop 0's store to just after
the last hop's store, divided by ``n_hops - 1``: launch overhead and block start-up skew are
outside it (a grid barrier comes first). The CUDA-event time of each whole launch is reported
beside it. Figures are medians over ``reps`` launches, after warm-up launches.

Checks: payload(hop 0) = mix(epoch, 0), payload(hop i) = mix(payload(hop i-1), i), a hash,
so the last payload is right only if every hop read its predecessor's value. The host
recomputes it for every launch and raises on a mismatch. Every spin loop has a deadline: a
timeout writes an error record and the kernel leaves; the host raises with it.

    python -m benchmarks.hop [--hops 1000] [--reps 20] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

VARIANTS = ("word", "flag")
LABELS = {"word": "data as its own flag (64-bit word)",
          "flag": "separate flag, release/acquire"}
CELL = 256        # bytes per hop: the word (or the flag) in one 128-B line, the payload in
#                   the next, so no two hops (and no flag and its payload) share a line
_M32 = 0xFFFFFFFF

# Error codes the kernel writes (ctl[1]).
ERRORS = {1: "the grid barrier timed out", 2: "the wait for the previous hop timed out"}

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

#define CELL_U32 64           /* 256 B per hop */
#define PAYLOAD_U32 32        /* the flag variant's payload: the second 128-B line of a cell */

__device__ __forceinline__ u64 now_ns()
{ u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ u64 ld_relaxed_u64(const u64* p)
{ u64 v; asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v; }
__device__ __forceinline__ void st_relaxed_u64(u64* p, u64 v)
{ asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" : : "l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ u32 ld_relaxed_u32(const u32* p)
{ u32 v; asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v; }
__device__ __forceinline__ u32 ld_acquire_u32(const u32* p)
{ u32 v; asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v; }
__device__ __forceinline__ void st_relaxed_u32(u32* p, u32 v)
{ asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" : : "l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ void st_release_u32(u32* p, u32 v)
{ asm volatile("st.release.gpu.global.b32 [%0], %1;" : : "l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ void red_release_add(u32* p, u32 v)
{ asm volatile("red.release.gpu.global.add.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory"); }

/* f(previous payload, hop): a hash, so a skipped or stale hop changes the final payload. */
__device__ __forceinline__ u32 mix(u32 x, u32 i)
{
    x ^= i * 0x9E3779B9u;
    x ^= x >> 16; x *= 0x7FEB352Du;
    x ^= x >> 15; x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

/* ctl: [0] barrier arrivals (grows by gridDim.x per launch: no reset), [1] error code,
 * [2] hop, [3] block, [4] value seen, [5] epoch of the failing launch. */
__device__ void fail(u32* ctl, u32 code, u32 hop, u32 seen, u32 epoch)
{
    if (atomicCAS(&ctl[1], 0u, code) == 0u) {
        ctl[2] = hop; ctl[3] = blockIdx.x; ctl[4] = seen; ctl[5] = epoch;
    }
}

/* The slow path of every spin loop, every 256 polls (so the fast path reads no timer): stop
 * when another block has failed, or once timeout_ns have passed since the first check. */
__device__ __forceinline__ bool give_up(u32& spins, u64& deadline, u64 timeout_ns,
                                        const u32* ctl)
{
    if ((++spins & 255u) != 0u) return false;
    if (ld_relaxed_u32(&ctl[1]) != 0u) return true;
    const u64 now = now_ns();
    if (deadline == 0) { deadline = now + timeout_ns; return false; }
    return now > deadline;
}

/* All blocks present before hop 0, so block start-up skew stays out of the timed chain. */
__device__ bool grid_barrier(u32* ctl, u32 epoch, u64 timeout_ns)
{
    red_release_add(&ctl[0], 1u);
    const u32 target = epoch * gridDim.x;
    u32 spins = 0, seen; u64 deadline = 0;
    while ((int)((seen = ld_acquire_u32(&ctl[0])) - target) < 0)
        if (give_up(spins, deadline, timeout_ns, ctl)) {
            fail(ctl, 1, 0, seen, epoch);
            return false;
        }
    return true;
}

/* rec (this launch's): [0] %globaltimer before hop 0's store, [1] after the last hop's
 * store, [2] the last payload. */
template <bool WORD>
__device__ void chain(u32* cells, u32* ctl, u64* rec, u32 n_hops, u32 epoch, u64 timeout_ns)
{
    if (threadIdx.x != 0) return;
    if (!grid_barrier(ctl, epoch, timeout_ns)) return;
    u32 payload = 0;
    for (u32 i = blockIdx.x; i < n_hops; i += gridDim.x) {
        if (i == 0) {
            rec[0] = now_ns();
            payload = mix(epoch, 0);
        } else {
            u32* prev = cells + (size_t)(i - 1) * CELL_U32;
            u32 spins = 0, seen; u64 deadline = 0;
            if (WORD) {
                /* An aligned 64-bit access is single-copy atomic, so the load sees the whole
                 * word of one store: the epoch half matching vouches for the payload half. */
                u64 w;
                while ((seen = (u32)((w = ld_relaxed_u64((const u64*)prev)) >> 32)) != epoch)
                    if (give_up(spins, deadline, timeout_ns, ctl)) {
                        fail(ctl, 2, i, seen, epoch);
                        return;
                    }
                payload = mix((u32)w, i);
            } else {
                /* The acquire orders the flag's load before the payload's load; it pairs with
                 * the producer's release below. */
                while ((seen = ld_acquire_u32(prev)) != epoch)
                    if (give_up(spins, deadline, timeout_ns, ctl)) {
                        fail(ctl, 2, i, seen, epoch);
                        return;
                    }
                payload = mix(ld_relaxed_u32(prev + PAYLOAD_U32), i);
            }
        }
        u32* cell = cells + (size_t)i * CELL_U32;
        if (WORD) {
            st_relaxed_u64((u64*)cell, ((u64)epoch << 32) | payload);
        } else {
            /* Two locations: without the release, the flag could be seen before the payload. */
            st_relaxed_u32(cell + PAYLOAD_U32, payload);
            st_release_u32(cell, epoch);
        }
        if (i == n_hops - 1) { rec[1] = now_ns(); rec[2] = payload; }
    }
}

extern "C" __global__ void hop_word(u32* cells, u32* ctl, u64* rec, u32 n_hops, u32 epoch,
                                    u64 timeout_ns)
{ chain<true>(cells, ctl, rec, n_hops, epoch, timeout_ns); }

extern "C" __global__ void hop_flag(u32* cells, u32* ctl, u64* rec, u32 n_hops, u32 epoch,
                                    u64 timeout_ns)
{ chain<false>(cells, ctl, rec, n_hops, epoch, timeout_ns); }
"""


def mix(x: int, i: int) -> int:
    """The kernel's ``mix`` in Python (uint32 arithmetic)."""
    x = (x ^ (i * 0x9E3779B9)) & _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def expected_payload(epoch: int, n_hops: int) -> int:
    """The last hop's payload of a correct chain of `n_hops` in the launch with `epoch`."""
    x = mix(epoch, 0)
    for i in range(1, n_hops):
        x = mix(x, i)
    return x


def compile_hop(arch: str = "sm_90a", cache_dir=None):
    """Both kernels as one cubin for `arch` (NVRTC, no GPU needed; megak's disk cache)."""
    from megak.runtime.compiler import compile_source
    return compile_source(SOURCE, arch=arch, cache_dir=cache_dir, entry="hop_word",
                          name="hop.cu")


def measure(n_hops: int = 1000, reps: int = 20, warmup: int = 3, timeout_s: float = 1.0,
            device: int = 0) -> dict:
    """Run both variants `warmup + reps` times each (interleaved), check every launch's last
    payload, and return medians over the last `reps`.

    Keys: ``device``, ``sm_count``, ``n_hops``, ``reps``, ``word_us`` / ``flag_us`` (us per hop,
    in-kernel), ``ratio`` (flag / word), ``word_launch_us`` / ``flag_launch_us`` (CUDA events
    around each launch), ``final_payload`` (variant -> the last launch's), ``last_epoch`` and
    ``expected_payload`` (= expected_payload(last_epoch, n_hops)).
    """
    if n_hops < 2 or n_hops >= 1 << 31:
        raise ValueError(f"n_hops must be in [2, 2^31), got {n_hops}")
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be >= 1 and warmup >= 0, got {reps}, {warmup}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from megak.errors import MegakernelError
    from megak.runtime import memory as mem
    from megak.runtime.driver import _bindings, check, device_info

    info = device_info(device)   # raises without a usable GPU; makes the context current
    if not info["cooperative_launch"]:
        raise MegakernelError(f"{info['name']} cannot launch cooperatively, which the chain "
                              f"needs (every block waits on another)")
    n_sm = info["sm_count"]
    code = ObjectCode.from_cubin(compile_hop(info["arch"]).cubin)
    kernels = {v: code.get_kernel(f"hop_{v}") for v in VARIANTS}
    config = LaunchConfig(grid=n_sm, block=1, is_cooperative=True)
    drv = _bindings()
    total = warmup + reps
    rec_words, ctl_words = 4, 8
    wants = [expected_payload(r + 1, n_hops) for r in range(total)]   # launch r: epoch r + 1
    stream = Device(device).create_stream()
    h = stream.handle
    memory, events = None, []
    try:
        memory = mem.Memory(device)
        cells = {v: memory.device(n_hops * CELL, f"hop cells ({v})") for v in VARIANTS}
        ctl = {v: memory.device(ctl_words * 4, f"hop ctl ({v})") for v in VARIANTS}
        rec = {v: memory.device(total * rec_words * 8, f"hop records ({v})") for v in VARIANTS}
        for v in VARIANTS:   # once: each launch's epoch tells its words from older ones
            mem.memset32(cells[v].ptr, 0, n_hops * CELL // 4, h)
            mem.memset32(ctl[v].ptr, 0, ctl_words, h)
            mem.memset32(rec[v].ptr, 0, total * rec_words * 2, h)
        flags = drv.CUevent_flags.CU_EVENT_DEFAULT
        ev = {v: [(check(drv.cuEventCreate(flags), "cuEventCreate"),
                   check(drv.cuEventCreate(flags), "cuEventCreate")) for _ in range(total)]
              for v in VARIANTS}
        events = [e for pairs in ev.values() for pair in pairs for e in pair]
        timeout_ns = np.uint64(int(timeout_s * 1e9))
        for r in range(total):
            epoch = r + 1
            for v in VARIANTS:
                start, end = ev[v][r]
                check(drv.cuEventRecord(start, h), "cuEventRecord")
                launch(stream, config, kernels[v], np.uint64(cells[v].ptr),
                       np.uint64(ctl[v].ptr), np.uint64(rec[v].ptr + r * rec_words * 8),
                       np.uint32(n_hops), np.uint32(epoch), timeout_ns)
                check(drv.cuEventRecord(end, h), "cuEventRecord")
        check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")

        host_rec = memory.pinned(total * rec_words * 8, "hop records (host)")
        host_ctl = memory.pinned(ctl_words * 4, "hop ctl (host)")
        out: dict = {"device": info["name"], "sm_count": n_sm, "n_hops": n_hops, "reps": reps,
                     "final_payload": {}}
        for v in VARIANTS:
            mem.dtoh(host_rec.ptr, rec[v].ptr, host_rec.nbytes, h)
            mem.dtoh(host_ctl.ptr, ctl[v].ptr, host_ctl.nbytes, h)
            check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")
            recs = host_rec.array(np.uint64, (total, rec_words)).copy()
            err = [int(x) for x in host_ctl.array(np.uint32, (ctl_words,))]
            if err[1]:
                where = (f"({err[4]} arrivals of {err[5] * n_sm})" if err[1] == 1 else
                         f"at hop {err[2]} (hop {err[2] - 1}'s {v} still held epoch {err[4]})")
                raise MegakernelError(
                    f"hop benchmark ({v}): {ERRORS.get(err[1], f'error {err[1]}')} "
                    f"{where} on block {err[3]}, in launch {err[5] - 1} (epoch {err[5]}); "
                    f"each wait's deadline: {timeout_s} s")
            for r, want in enumerate(wants):
                if int(recs[r, 2]) != want or recs[r, 1] <= recs[r, 0]:
                    raise MegakernelError(
                        f"hop benchmark ({v}), launch {r}: last payload {int(recs[r, 2]):#x}, "
                        f"expected {want:#x} (t {int(recs[r, 0])} -> {int(recs[r, 1])})")
            ns = (recs[warmup:, 1] - recs[warmup:, 0]).astype(np.float64)
            ms = [check(drv.cuEventElapsedTime(*ev[v][r]), "cuEventElapsedTime")
                  for r in range(warmup, total)]
            out[f"{v}_us"] = float(statistics.median(ns)) / (n_hops - 1) / 1e3
            out[f"{v}_launch_us"] = float(statistics.median(ms)) * 1e3
            out["final_payload"][v] = int(recs[-1, 2])
        out["ratio"] = out["flag_us"] / out["word_us"]
        out["last_epoch"] = total
        out["expected_payload"] = wants[-1]
        return out
    finally:
        for e in events:
            drv.cuEventDestroy(e)
        if memory is not None:
            memory.close()   # frees only what this call allocated
        stream.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hop", description=__doc__.split("\n")[0])
    p.add_argument("--hops", type=int, default=1000, help="hops in the chain (default 1000)")
    p.add_argument("--reps", type=int, default=20, help="timed launches per variant (default 20)")
    p.add_argument("--timeout", type=float, default=1.0, help="deadline of each wait, s")
    p.add_argument("--json", action="store_true", help="print the result dict as JSON")
    args = p.parse_args(argv)
    from megak.runtime.driver import gpu_unusable_reason, gpu_usable
    if not gpu_usable():
        print(f"benchmarks.hop needs a GPU: {gpu_unusable_reason()}", file=sys.stderr)
        return 1
    r = measure(n_hops=args.hops, reps=args.reps, timeout_s=args.timeout)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{r['device']}, {r['sm_count']} SMs: a chain of {r['n_hops']} hops, one per SM in "
          f"turn; medians of {r['reps']} launches")
    print(f"{'variant':<38} {'ns/hop':>8} {'launch us':>10}")
    for v in VARIANTS:
        print(f"{LABELS[v]:<38} {r[v + '_us'] * 1e3:>8.1f} {r[v + '_launch_us']:>10.1f}")
    print(f"{'ratio (flag / word)':<38} {r['ratio']:>8.2f}")
    print("ns/hop: %globaltimer in the kernel, hop 0's store to the last hop's store, "
          "/ (hops - 1)\nlaunch us: CUDA events around each whole launch (launch, grid "
          "barrier, chain)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
