#!/usr/bin/env python3
"""Probe: where one call's device time goes, step by step, for a launched run and for a
resident request, on a (1, 32) copy, on a program with no instruction and on the
W7-call-mlp1024 chain (16 bf16 layers, hidden 1024, batch 16: its instructions on many SMs,
so the step marks are its ends, block 0's entry or the relay's take and the steps of the
last block's finish, and each op's share comes from the per-op marks below).

It compiles the megakernel with %globaltimer marks inserted at fixed points of the path
(block 0's set-up, the loader's steps, the op, the join, each step of mk_finish_invocation,
and the relay's take and publish), keyed by the run's ticket, in a __device__ array read back
with cuModuleGetGlobal; then prints the median time between consecutive marks over 64 calls.
For a graph of several ops (the chain) it also prints each op's share, from per-op marks of
every instruction (its earliest op start, its latest signal): from the run's set-up (a
launch) or block 0's "go seen" (a request) to op 0's first start, op 0, then each op from
the previous one's last signal to its own, then to the status read: where a resident
request of the chain spends the ~5 us more than a launch (benchmarks/ANALYSIS.md).
The marks are inserted by text replacement at anchor lines of megakernel.cu: when the source
changes, an anchor that no longer matches fails loudly (AssertionError naming it).

    python tools/probe_request_marks.py [--workloads copy empty chain]

Figures (H200, 2026-12-01) are in benchmarks/ANALYSIS.md, "The call path, traced"."""
import argparse
import statistics
import time

import numpy as np

import megak
from megak.runtime import compiler
from probe_stream_stages import module_global   # tools/, beside this file


def patch(src):
    """The device source with the marks inserted."""
    def rep(anchor, new, count=1):
        n = src_[0].count(anchor)
        assert n == count, (anchor, n)
        src_[0] = src_[0].replace(anchor, new)
    src_ = [src]
    hdr = ('__device__ unsigned long long mk_probe_marks[64 * 32];\n'
           '#define MKP(i, tk) (mk_probe_marks[((tk) & 63u) * 32u + (i)] = mk_globaltimer())\n'
           # per ticket and graph op (layer; ops past 31 share the last): the earliest op start
           # over its instructions (stored inverted, so that atomicMax keeps the minimum) and
           # the latest signal; RED instructions, nothing waits for them
           '__device__ unsigned long long mk_probe_layer_start[64 * 32];\n'
           '__device__ unsigned long long mk_probe_layer_end[64 * 32];\n'
           '#define MKL(arr, tk, op, v) atomicMax(&arr[((tk) & 63u) * 32u + ((op) < 31u ? (op) : 31u)], '
           '(unsigned long long)(v))\n')
    # after sync.cuh's globaltimer definition: put the header right before mk_stop
    rep('__device__ void mk_stop(const mk_params& p, const mk_stop_info& e)\n',
        hdr + '__device__ void mk_stop(const mk_params& p, const mk_stop_info& e)\n')
    # relay: seq seen, taken+closed, go published
    rep('                        ticket = (mk_u32)w5;\n                        taken = true;\n',
        '                        ticket = (mk_u32)w5;\n                        taken = true;\n                        MKP(0, ticket);\n')
    rep('            if (reason == 0 && params == 0ull)\n                reason = MK_RESIDENT_CLOSED;\n',
        '            if (reason == 0 && params == 0ull)\n                reason = MK_RESIDENT_CLOSED;\n            MKP(1, ticket);\n')
    rep('            mk_st_release(&res->go, s);\n', '            mk_st_release(&res->go, s);\n            MKP(2, ticket);\n')
    # block: go seen (after fence), params read, ready
    rep('    mk_fence_acquire();\n    const volatile mk_request* m = &res->mirror[s % MK_MIRROR_SLOTS];\n',
        '    mk_fence_acquire();\n    const mk_u64 pr_t3 = mk_globaltimer();\n    const volatile mk_request* m = &res->mirror[s % MK_MIRROR_SLOTS];\n')
    rep('    const mk_u32 n_sm = m->n_sm, ticket = m->ticket;\n',
        '    const mk_u32 n_sm = m->n_sm, ticket = m->ticket;\n    if (blockIdx.x == 0) mk_probe_marks[(ticket & 63u) * 32u + 3u] = pr_t3;\n')
    rep('    const bool ok = mk_begin_invocation(reinterpret_cast<const mk_tensor*>(tensors), run,\n',
        '    if (blockIdx.x == 0 && q_begin + run.x + run.y != 0xffffffffu) MKP(4, ticket);\n    const bool ok = mk_begin_invocation(reinterpret_cast<const mk_tensor*>(tensors), run,\n')
    rep('            mk_take_request(a, s);\n            mk_mbar_arrive(&ctl.request_ready);\n',
        '            mk_take_request(a, s);\n            mk_mbar_arrive(&ctl.request_ready);\n            if (blockIdx.x == 0) MKP(5, ctl.ticket);\n')
    # loader: record + operands fetched
    rep('            e = {MK_OK, q, s.ins.opcode, s.ins.op_index, 0, 0, 0};\n',
        '            if (blockIdx.x == 0 && q == 0 && s.ins.opcode != 0xffffu) MKP(6, ctl.ticket);\n            e = {MK_OK, q, s.ins.opcode, s.ins.op_index, 0, 0, 0};\n')
    rep('        __syncwarp();\n        if (lane == 0)\n            mk_mbar_arrive(&ctl.full[mk_slot_of(q)]);\n',
        '        __syncwarp();\n        if (lane == 0 && blockIdx.x == 0 && q == 0) MKP(16, ctl.ticket);\n        if (lane == 0)\n            mk_mbar_arrive(&ctl.full[mk_slot_of(q)]);\n')
    rep('        const bool ready = mk_mbar_wait(&ctl.full[mk_slot_of(q)], mk_slot_parity(q), deadline);\n',
        '        const bool ready = mk_mbar_wait(&ctl.full[mk_slot_of(q)], mk_slot_parity(q), deadline);\n        if (tid == 0 && blockIdx.x == 0 && q == 0) MKP(17, ctl.ticket);\n')
    rep('            if (error == MK_OK && p.debug && !mk_op_check_operands(s.ins, s.operand))\n                error = MK_ERR_BAD_DESCRIPTOR;\n',
        '            if (error == MK_OK && p.debug && !mk_op_check_operands(s.ins, s.operand))\n                error = MK_ERR_BAD_DESCRIPTOR;\n            if (blockIdx.x == 0 && q == 0 && error != 0xffffu) MKP(18, ctl.ticket);\n')
    rep('            s.stream_stages = error == MK_OK ? streamed : 0u;\n            stream_pos += s.stream_stages;\n',
        '            s.stream_stages = error == MK_OK ? streamed : 0u;\n            stream_pos += s.stream_stages;\n            if (blockIdx.x == 0 && q == 0 && s.stream_stages != 0xffffu) MKP(19, ctl.ticket);\n')
    rep('        error = __shfl_sync(0xffffffffu, error, 0);   /* one verdict, lane 0\'s */\n',
        '        error = __shfl_sync(0xffffffffu, error, 0);   /* one verdict, lane 0\'s */\n        if (lane == 0 && blockIdx.x == 0 && q == 0 && error != 0xffffu) MKP(20, ctl.ticket);\n')
    # compute: op start, op signalled
    rep('        mk_op_run(s.ins, s.operand, pages);\n        /* C3 */\n',
        '        if (tid == 0 && blockIdx.x == 0 && q == 0) MKP(7, ctl.ticket);\n'
        '        if (tid == 0) MKL(mk_probe_layer_start, ctl.ticket, (mk_u32)s.ins.op_index, ~mk_globaltimer());\n'
        '        mk_op_run(s.ins, s.operand, pages);\n        /* C3 */\n')
    rep('        if (tid == 0)\n            mk_compute_signal(q);\n',
        '        if (tid == 0) {\n            mk_compute_signal(q);\n            if (blockIdx.x == 0 && q == 0) MKP(8, ctl.ticket);\n'
        '            MKL(mk_probe_layer_end, ctl.ticket, (mk_u32)s.ins.op_index, mk_globaltimer());\n        }\n')
    # joined
    rep('        if (what != MK_REQUEST_SKIP)\n            mk_finish_invocation(ctl.params, ctl.ticket, res, s);\n',
        '        if (blockIdx.x == 0) MKP(9, ctl.ticket);\n        if (what != MK_REQUEST_SKIP)\n            mk_finish_invocation(ctl.params, ctl.ticket, res, s);\n')
    rep('    mk_join_roles();\n    if (tid == 0)\n        mk_finish_invocation(ctl.params, ctl.ticket, nullptr, 0u);\n',
        '    mk_join_roles();\n    if (tid == 0 && sm == 0) MKP(9, ticket);\n    if (tid == 0)\n        mk_finish_invocation(ctl.params, ctl.ticket, nullptr, 0u);\n')
    # finish: only the invocation's last block gets past its count (one-block programs:
    # block 0), so these marks are that block's
    rep('    if (error == MK_OK && finished != p.n_active)\n        error = MK_ERR_ABORTED;    /* stopped from outside (the host\'s watchdog) */\n',
        '    if (error == MK_OK && finished != p.n_active)\n        error = MK_ERR_ABORTED;    /* stopped from outside (the host\'s watchdog) */\n    if (done_before != 0xfffffff0u) MKP(10, ticket);\n')
    rep('    __threadfence_system();\n    hv->ticket_done = newest;\n',
        '    MKP(11, ticket);\n    __threadfence_system();\n    hv->ticket_done = newest;\n    MKP(12, ticket);\n')
    rep('        mk_st_release_u64(&res->closed, ((mk_u64)(error != MK_OK) << 32) | request);\n', '        mk_st_release_u64(&res->closed, ((mk_u64)(error != MK_OK) << 32) | request);\n    if (res != nullptr) MKP(13, ticket);\n')
    # launched entry
    rep('    if (tid == 0) {\n        ctl.params = *params;\n        run = mk_run_of_state(run_state);\n    }\n',
        '    if (tid == 0 && sm == 0) MKP(14, ticket);\n    if (tid == 0) {\n        ctl.params = *params;\n        run = mk_run_of_state(run_state);\n    }\n')
    stop_exit = ('    if (__syncthreads_or(stop)) {\n        if (loader)\n'
                 '            mk_cp_async_wait_all();   /* no copy may land after the block is gone */\n'
                 '        if (tid == 0)\n            mk_finish_invocation(ctl.params, ticket, nullptr, 0u);\n'
                 '        return;\n    }\n')
    rep(stop_exit, stop_exit + '    if (tid == 0 && sm == 0) MKP(15, ticket);\n')
    return src_[0]


NAMES = {0: "relay: entry taken", 1: "relay: previous closed", 2: "go published", 3: "blk0 go seen",
         4: "blk0 params/queue/run read", 5: "blk0 ready arrive", 6: "loader rec+ops fetched",
         7: "op start", 8: "op signalled", 9: "roles joined", 10: "finish: status read",
         11: "finish: writes done", 12: "finish: sys fence + host word", 13: "closed released",
         14: "launch: blk0 entry", 15: "launch: set-up done",
         16: "loader: arrive full", 17: "compute: full seen", 18: "loader: validated",
         19: "loader: stages, pages", 20: "loader: waits done"}


def _read(prog, func, name: bytes) -> np.ndarray:
    drv, dptr = module_global(prog, name, func)
    host = np.zeros(64 * 32, dtype=np.uint64)
    drv.cuCtxSynchronize()
    drv.cuMemcpyDtoH(host.ctypes.data, dptr, host.nbytes)
    return host.reshape(64, 32)


def marks_of(prog, func=None):
    """The marks, per ticket (64 x 32), of the launched build or of the module of `func` (the
    resident kernel runs a build of its own: MK_RESIDENT)."""
    return _read(prog, func, b"mk_probe_marks").astype(np.int64)


def layers_of(prog, func=None):
    """Per ticket and graph op (64 x 32): the earliest op start of its instructions and the
    latest signal, 0 where none ran."""
    start = _read(prog, func, b"mk_probe_layer_start")
    start = np.where(start != 0, ~start, 0).astype(np.int64)
    return start, _read(prog, func, b"mk_probe_layer_end").astype(np.int64)


def clear(prog, func=None):
    for name in (b"mk_probe_marks", b"mk_probe_layer_start", b"mk_probe_layer_end"):
        drv, dptr = module_global(prog, name, func)
        drv.cuMemsetD8(dptr, 0, 64 * 32 * 8)
    drv.cuCtxSynchronize()


def report_layers(title, m, layers, anchor, n_ops):
    """The graph's ops one after the other (a chain's layers): from the request's anchor mark
    to op 0's first start, op 0 from its first start to its last signal, each later op from
    the previous one's last signal to its own, then to the status read; medians over the
    calls whose every mark is there (us)."""
    start, end = layers
    ok = [t for t in range(64) if m[t, anchor] and m[t, 10] and start[t, 0]
          and all(end[t, i] for i in range(n_ops))]
    if not ok:
        print(f"  {title}: no complete call")
        return
    def med_us(vals):
        return statistics.median(vals) / 1e3
    steps = [("-> op 0 start", [start[t, 0] - m[t, anchor] for t in ok]),
             ("op 0", [end[t, 0] - start[t, 0] for t in ok])]
    steps += [(f"op {i}", [end[t, i] - end[t, i - 1] for t in ok]) for i in range(1, n_ops)]
    steps.append(("-> status read", [m[t, 10] - end[t, n_ops - 1] for t in ok]))
    print(f"  {title} by op ({len(ok)} calls, us): " +
          "  ".join(f"{name} {med_us(v):.2f}" for name, v in steps))


def report(title, m, order, host_us=None):
    rows = [r for r in m if all(r[i] != 0 for i in order)]
    print(f"\n{title}: {len(rows)} calls" + (f", host per call {host_us:.2f} us" if host_us else ""))
    prev = order[0]
    for i in order[1:]:
        d = [int(r[i]) - int(r[prev]) for r in rows]
        print(f"  {NAMES[prev]:>30s} -> {NAMES[i]:<30s} {statistics.median(d)/1e3:7.3f} us")
        prev = i
    tot = [int(r[order[-1]]) - int(r[order[0]]) for r in rows]
    print(f"  {'total':>30s}    {statistics.median(tot)/1e3:7.3f} us")


def workloads():
    """name -> (graph builder, inputs maker, launch marks, resident marks)."""
    def copy(g):
        g.output(g.copy(g.input("x", (1, 32))), "y")

    def empty(g):
        g.output(g.input("x", (1, 32)), "x_out")

    def chain(g):   # benchmarks' W7-call-mlp1024
        h = g.input("x", (16, 1024), "bfloat16")
        for i in range(16):
            h = g.gemm(h, g.input(f"w{i}", (1024, 1024), "bfloat16"))
            g.output(h, f"y{i}")

    ends = ([14, 15, 10, 11, 12], [0, 1, 2, 3, 10, 11, 12, 13])
    return {"copy": (copy, [14, 15, 6, 18, 19, 20, 16, 17, 7, 8, 9, 10, 11, 12],
                     [0, 1, 2, 3, 4, 5, 6, 18, 19, 20, 16, 17, 7, 8, 9, 10, 11, 12, 13]),
            "empty": (empty, [14, 15, 9, 10, 11, 12], [0, 1, 2, 3, 4, 5, 9, 10, 11, 12, 13]),
            "chain": (chain, *ends)}


def main():
    table = workloads()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=list(table), choices=list(table))
    args = ap.parse_args()
    import torch
    from probe_resident_path import med   # tools/, beside this file
    original = compiler.device_source
    compiler.device_source = lambda: patch(original())
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    for name in args.workloads:
        build, launch_order, resident_order = table[name]
        g = megak.Graph()
        build(g)
        prog = megak.compile(g, backend="cuda")
        ex = prog._executor
        inputs = {k: torch.randn(t.shape, device="cuda", dtype=dtypes[t.dtype]) * 0.03
                  for k, t in g.inputs.items()}
        outs = {k: torch.empty(prog.plan.output_shapes[k], device="cuda",
                               dtype=dtypes[g.outputs[k].dtype])
                for k in prog.plan.outputs if prog._writes_in_place(k)}
        print(f"== {name}: n_sm {prog.plan.n_sm}, instructions {len(prog.plan.instrs)}")
        prog.run(out=outs, **inputs)
        torch.cuda.synchronize()
        clear(prog)
        t = med(lambda: prog.run(out=outs, **inputs), 64)
        m = marks_of(prog)
        report(f"{name}: prog.run (launch)", m, launch_order, t)
        n_ops = int(prog.plan.instrs["op_index"].max()) + 1 if len(prog.plan.instrs) else 0
        if n_ops > 1:
            report_layers("launch", m, layers_of(prog), 15, min(n_ops, 32))
        # back to back launches
        clear(prog)
        t0 = time.perf_counter_ns()
        hs = [prog.launch(out=outs, **inputs) for _ in range(64)]
        for h in hs:
            h.wait()
        per = (time.perf_counter_ns() - t0) / 64 / 1e3
        m = marks_of(prog)
        ent = sorted(int(r[14]) for r in m if r[14])
        end = sorted(int(r[12]) for r in m if r[12])
        gaps = [ent[i + 1] - end[i] for i in range(len(ent) - 1)]
        spans = [int(r[12]) - int(r[14]) for r in m if r[12] and r[14]]
        print(f"  back to back x64: {per:.2f} us per launch; entry->host word {statistics.median(spans)/1e3:.2f} us; "
              f"end -> next entry {statistics.median(gaps)/1e3:.2f} us")
        with megak.resident(prog, idle_s=10) as r:
            k = r._kernel
            r.submit(prog, out=outs, **inputs).wait()
            call, params, table_ptr, _ = prog._prepare_request(inputs, outs)
            clear(prog, k._func)

            def post_spin():
                tk = ex._ticket = (ex._ticket + 1) & 0xFFFFFFFF or 1
                k.post(params, table_ptr, tk, time.monotonic() + 10)
                while not ex.done(tk):
                    pass
            t = med(post_spin, 64)
            m = marks_of(prog, k._func)
            report(f"{name}: resident post+spin", m, resident_order, t)
            if n_ops > 1:
                report_layers("resident", m, layers_of(prog, k._func), 3, min(n_ops, 32))
            t2 = med(lambda: r.submit(prog, out=outs, **inputs).wait(), 200)
            print(f"  submit+wait from Python: {t2:.2f} us")
        prog.close()


if __name__ == "__main__":
    main()
