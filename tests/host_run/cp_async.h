/* The cp.async stand-ins of the host harnesses (tests/host_run/*.cpp): a 16-B copy lands when
 * issued, or, with g_late, only at the wait that covers its group, so that a read of a stage
 * before its wait, or a copy into a stage still being read, gives wrong sums. Each copy is
 * checked: inside the pages, 16-B aligned at both ends, at most 16 bytes read. A harness
 * defines first: g_smem (its pages), g_late, fail(const char*) and smem_bytes() (the pages'
 * size); it includes this after instr.h. */
#ifndef MEGAK_HOST_CP_ASYNC_H
#define MEGAK_HOST_CP_ASYNC_H

#include <cstdint>
#include <cstring>
#include <vector>

struct mk_copy { mk_u32 dst; const float* src; mk_u32 bytes; };
struct mk_thread_copies { std::vector<std::vector<mk_copy>> groups; std::vector<mk_copy> open; };
static thread_local mk_thread_copies t_copies;

static void land(const mk_copy& c)
{
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (c.bytes)
        std::memcpy(v, c.src, c.bytes);
    std::memcpy(g_smem + c.dst, v, 16);
}

static inline void mk_cp_async_f4z(mk_u32 smem, const float* gmem, mk_u32 src_bytes)
{
    if (smem % 16 || smem + 16 > smem_bytes() || src_bytes > 16 || src_bytes % 4 ||
        reinterpret_cast<std::uintptr_t>(gmem) % 16)
        fail("a cp.async outside the pages, misaligned, or of more than 16 bytes");
    const mk_copy c = {smem, gmem, src_bytes};
    if (g_late)
        t_copies.open.push_back(c);
    else
        land(c);
}

static inline void mk_cp_async_f4z_policy(mk_u32 smem, const float* gmem, mk_u32 src_bytes,
                                          mk_u64)
{
    mk_cp_async_f4z(smem, gmem, src_bytes);
}

static inline void mk_cp_async_commit()
{
    t_copies.groups.push_back(t_copies.open);
    t_copies.open.clear();
}

/* land every group but the newest `keep` (cp.async.wait_group keep) */
static void wait_groups(int keep)
{
    while ((int)t_copies.groups.size() > keep) {
        for (const mk_copy& c : t_copies.groups.front())
            land(c);
        t_copies.groups.erase(t_copies.groups.begin());
    }
}

template <int N>
static inline void mk_cp_async_wait_group()
{
    wait_groups(N);
}

static inline void mk_cp_async_wait_all() { wait_groups(0); }

static inline mk_u64 mk_policy_evict_first() { return 1; }
static inline mk_u64 mk_policy_evict_normal() { return 2; }

#endif /* MEGAK_HOST_CP_ASYNC_H */
