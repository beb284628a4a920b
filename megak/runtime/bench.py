"""Timing on the GPU, for benchmarks/: the megakernel, and the same ops as separate launches
(plain or captured in a CUDA graph), all on a CudaExecutor's buffers so every variant computes
the same thing from the same memory.

    prog = megak.compile(g, backend="cuda")
    b = Bench(prog)                 # inputs uploaded once with b.upload(**inputs)
    us = b.time_megakernel(reps=50) # CUDA events around each launch, L2 flushed before each
    out = b.outputs()               # outputs of the last timed launch, to check them

"separate" launches one kernel per graph op: grid = that op's instructions, one block each,
built from the same device op code as the megakernel (entry point megak_op, no waits or
signals: stream order is the dependency), with the shared memory the op's pages need.
"graph" captures those launches in a CUDA graph and replays it; "graph_pdl"
(``time_separate(graph=True, pdl=True)``) captures them with programmatic dependent launch:
every launch that follows a launch carries the programmatic stream serialization attribute
(a programmatic edge in the graph), so its blocks start while the op before runs and wait in
megak_op's griddepcontrol.wait until it has completed.
"""
from __future__ import annotations

import numpy as np

from .. import abi, pages
from ..errors import MegakernelError
from . import memory as mem
from .driver import _bindings, check

L2_FLUSH_BYTES = 256 << 20   # several times the H200's 60 MB L2


def op_launch_configs(op_ranges) -> list[tuple]:
    """Per (op, first, count, pages) range: (plain config, PDL config) of its launch: grid =
    its instructions, the shared memory its pages need. The PDL one sets the launch attribute
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1 (cuda.core >= 1.2's
    programmatic_stream_serialization; built without a GPU)."""
    from cuda.core import LaunchConfig
    return [tuple(LaunchConfig(grid=count, block=abi.THREADS, shmem_size=pages.smem_bytes(need),
                               programmatic_stream_serialization=pdl) for pdl in (False, True))
            for _, _, count, need in op_ranges]


class Bench:
    def __init__(self, prog):
        if prog.backend != "cuda":
            raise ValueError("Bench times the cuda backend")
        self.prog = prog
        self.ex = ex = prog._executor
        self.plan = plan = prog.plan
        ex._dev.set_current()
        self._memory = ex._memory
        self._stream = ex._stream
        self._h = ex._h
        self._flush = self._memory.device(L2_FLUSH_BYTES, "L2 flush")
        # one kernel launch per op, in graph order: instructions regrouped by op
        order = np.argsort(plan.instrs["op_index"], kind="stable")
        self._op_instrs = plan.instrs[order]
        ops = self._op_instrs["op_index"]
        self._op_ranges = []
        for op in np.unique(ops):
            idx = np.nonzero(ops == op)[0]
            need = int(self._op_instrs["pages"][idx].max())
            self._op_ranges.append((int(op), int(idx[0]), len(idx), need))
        counting = abi.own_counter(self._op_instrs)
        self._counting_ops = set(np.unique(ops[counting]).astype(int).tolist())
        self._op_kernel = None
        self._graphs = {}   # pdl (bool) -> (CUgraph, CUgraphExec): graph and graph_pdl

    # -- data ---------------------------------------------------------------------------------
    def upload(self, **inputs) -> None:
        """Put the inputs in the executor's device buffers (once, untimed)."""
        plan = self.plan
        arrays = {plan.inputs[k]: np.ascontiguousarray(v) for k, v in inputs.items()}
        # a normal run uploads and checks everything; its outputs are discarded
        self.ex.run(arrays, [])

    def poison(self) -> None:
        """Fill every tensor the graph writes with NaN, so a variant that skips work shows."""
        for tb in self.ex._tensors.values():
            if tb.slot.kind != "input":
                mem.memset32(tb.buf.ptr, tb.poison, tb.buf.nbytes // 4, self._h)
        self._sync()

    def outputs(self) -> dict[str, np.ndarray]:
        """Outputs as the last launch left them in device memory."""
        ex = self.ex
        out = {}
        for name, slot in self.plan.outputs.items():
            tb = ex._tensors[slot]
            nbytes = tb.slot.rows * tb.ld * tb.np_dtype.itemsize
            st = ex._stage(slot)
            mem.dtoh(st.ptr, tb.buf.ptr, nbytes, self._h)
            self._sync()
            out[name] = st.array(tb.np_dtype, tb.padded_shape)[:, :tb.slot.cols].copy()
        return out

    # -- timing -------------------------------------------------------------------------------
    def time_megakernel(self, reps: int = 50, warmup: int = 5, flush_l2: bool = True,
                        trace: bool = False) -> np.ndarray:
        """Microseconds of each of `reps` megakernel launches (after `warmup`): the same
        launch a run makes (the device advances its own epoch), on megak's buffers."""
        ex = self.ex
        n = reps + warmup
        if trace:
            tdev, _ = ex._trace_buffers()
            ex._write_params(trace_ptr=tdev.ptr)
        try:
            tickets = []
            times = self._time(lambda i: tickets.append(ex._launch(None, self._h, trace)),
                               n, warmup, flush_l2)
            ex._raise_pending()
            if not ex.done(tickets[-1]):
                raise MegakernelError("benchmark launches: the last launch never reported")
        finally:
            if trace:
                ex._write_params()
            self._sync()
        return times

    def time_separate(self, reps: int = 50, warmup: int = 5, flush_l2: bool = True,
                      graph: bool = False, pdl: bool = False) -> np.ndarray:
        """Microseconds of each run of the graph as one kernel launch per op (optionally
        replayed from a CUDA graph of those launches; with `pdl`, a graph whose launches
        are joined by programmatic dependent launch: the graph_pdl variant)."""
        if pdl and not graph:
            raise ValueError("pdl=True times the graph_pdl variant: it needs graph=True")
        self._prepare_separate()
        if graph:
            exec_ = self._capture_graph(pdl)
            drv = _bindings()

            def one(i):
                check(drv.cuGraphLaunch(exec_, self._h), "cuGraphLaunch")
        else:
            one = self._launch_ops
        times = self._time(one, reps + warmup, warmup, flush_l2)
        self._check_status(expect_blocks=None)
        return times

    # -- internals ----------------------------------------------------------------------------
    def _prepare_separate(self) -> None:
        if self._op_kernel is not None:
            return
        ex = self.ex
        drv = _bindings()
        code = ex._variant(trace=False)[1]
        kernel = code.get_kernel("megak_op")
        handle = kernel.handle
        if not isinstance(handle, drv.CUkernel):
            handle = drv.CUkernel(int(handle))
        most = max((r[3] for r in self._op_ranges), default=0)
        check(drv.cuKernelSetAttribute(
            drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            pages.smem_bytes(most), handle, ex._cu_dev), "cuKernelSetAttribute(megak_op)")
        self._op_kernel = kernel
        # the regrouped records, and params pointing at them (no counters, epoch unused)
        data = abi.encode(self._op_instrs)
        self._op_dev = self._memory.device(max(len(data), 1), "separate: instrs")
        host = self._memory.pinned(max(len(data), 1) + abi.PARAMS_DTYPE.itemsize,
                                   "separate (host)")
        host.array(np.uint8, (len(data),))[:] = np.frombuffer(data, np.uint8)
        p = ex._params_host[0].copy()
        p["instrs"] = self._op_dev.ptr
        p["tensors"] = ex._dev_buf["tensors"].ptr
        p["trace"] = 0
        if self._counting_ops:
            # counters of their own (the parts of a streamed band, a copy's takers:
            # _launch_ops zeroes them every run), so the megakernel's keep its run state: a
            # later run of the program waits on them with its epoch's targets
            self._op_counters = self._memory.device(4 * max(ex.plan.n_counters, 1),
                                                    "separate: counters")
            p["counters"] = self._op_counters.ptr
        pbuf = host.array(np.uint8, (len(data) + abi.PARAMS_DTYPE.itemsize,))[len(data):]
        pbuf[:] = np.frombuffer(p.tobytes(), np.uint8)
        self._op_params = self._memory.device(abi.PARAMS_DTYPE.itemsize, "separate: params")
        mem.htod(self._op_dev.ptr, host.ptr, len(data), self._h)
        mem.htod(self._op_params.ptr, host.ptr + len(data), abi.PARAMS_DTYPE.itemsize, self._h)
        mem.memset32(ex._dev_buf["status"].ptr, 0, abi.STATUS_DTYPE.itemsize // 4, self._h)
        self._sync()
        self._memory.free(host)
        self._op_configs = op_launch_configs(self._op_ranges)

    def _launch_ops(self, i=None, pdl: bool = False) -> None:
        """Enqueue one run: a launch per op in graph order. With `pdl`, every launch after
        the first carries the programmatic stream serialization attribute."""
        from cuda.core import launch
        if self._counting_ops:
            # the parts of a streamed band meet on a counter, a copy's takers take bands from
            # one, that starts from zero in every run here (epoch 0: no run state between
            # separate launches); each op has its own counters, so one memset before the run
            # serves them all
            mem.memset32(self._op_counters.ptr, 0, max(self.ex.plan.n_counters, 1), self._h)
        for k, ((op, first, count, need), cfgs) in enumerate(zip(self._op_ranges,
                                                                  self._op_configs)):
            cfg = cfgs[1] if pdl and k > 0 else cfgs[0]
            launch(self._stream, cfg, self._op_kernel, self._op_params.ptr, np.uint32(first))

    def _capture_graph(self, pdl: bool = False):
        """The CUDA graph of one run's launches (`_launch_ops(pdl=pdl)`), captured and
        instantiated once per kind: graph and graph_pdl each keep their own exec."""
        if pdl in self._graphs:
            return self._graphs[pdl][1]
        drv = _bindings()
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        check(drv.cuStreamBeginCapture(self._h, mode), "cuStreamBeginCapture")
        try:
            self._launch_ops(pdl=pdl)
        finally:
            graph = check(drv.cuStreamEndCapture(self._h), "cuStreamEndCapture")
        try:
            exec_ = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except BaseException:
            drv.cuGraphDestroy(graph)
            raise
        self._graphs[pdl] = (graph, exec_)
        return exec_

    def _time(self, one, n: int, warmup: int, flush_l2: bool) -> np.ndarray:
        drv = _bindings()
        flags = drv.CUevent_flags.CU_EVENT_DEFAULT
        starts = [check(drv.cuEventCreate(flags), "cuEventCreate") for _ in range(n)]
        ends = [check(drv.cuEventCreate(flags), "cuEventCreate") for _ in range(n)]
        try:
            for i in range(n):
                if flush_l2:
                    mem.memset32(self._flush.ptr, i, L2_FLUSH_BYTES // 4, self._h)
                check(drv.cuEventRecord(starts[i], self._h), "cuEventRecord")
                one(i)
                check(drv.cuEventRecord(ends[i], self._h), "cuEventRecord")
            self._sync()
            ms = [check(drv.cuEventElapsedTime(starts[i], ends[i]), "cuEventElapsedTime")
                  for i in range(warmup, n)]
        finally:
            for e in starts + ends:
                drv.cuEventDestroy(e)
        return np.asarray(ms, dtype=np.float64) * 1e3

    def _sync(self) -> None:
        check(_bindings().cuStreamSynchronize(self._h), "cuStreamSynchronize")

    def _check_status(self, expect_blocks: int | None) -> None:
        ex = self.ex
        st = np.zeros(1, dtype=abi.STATUS_DTYPE)
        host = self._memory.pinned(st.nbytes, "bench status")
        try:
            mem.dtoh(host.ptr, ex._dev_buf["status"].ptr, st.nbytes, self._h)
            self._sync()
            st[:] = host.array(abi.STATUS_DTYPE, (1,))
        finally:
            self._memory.free(host)
        if int(st[0]["error"]) != 0:
            raise MegakernelError(f"benchmark launches failed: status {st[0]}")
        if expect_blocks is not None and int(st[0]["finished_blocks"]) != expect_blocks:
            raise MegakernelError(f"benchmark launches: {int(st[0]['finished_blocks'])} blocks "
                                  f"finished, expected {expect_blocks}")

    def close(self) -> None:
        drv = _bindings()
        for graph, exec_ in self._graphs.values():   # graph and graph_pdl
            drv.cuGraphExecDestroy(exec_)
            drv.cuGraphDestroy(graph)
        self._graphs.clear()
        for name in ("_flush", "_op_dev", "_op_params", "_op_counters"):
            buf = getattr(self, name, None)
            if buf is not None:
                self._memory.free(buf)
                setattr(self, name, None)
