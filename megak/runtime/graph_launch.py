"""A synchronous bound run's launch as the replay of a one-node CUDA graph.

Why: the host's share of a small ``run()`` is mostly the driver's enqueue of the launch. On
the H200's host (tools/probe_call_path.py) ``cuLaunchCooperativeKernel`` through cuda.bindings
took 4.9 us, ``cuGraphLaunch`` of a graph holding that one cooperative kernel node 2.0 us,
and ``cuGraphExecKernelNodeSetParams`` on its node 0.9 us. The ticket changes with every
launch, so every replay first sets the node's parameters: the driver reads the arguments
from the executor's argument array at that call, as a launch does, and a replay already
enqueued keeps the arguments it was given.

Only the executor's ``run_bound`` (Program.run's bound case) launches this way. It waits for
its run before it returns, so no replay is in flight when the next one's parameters are set,
and a graph's one-replay-at-a-time rule orders nothing that the wait does not. ``launch()``
keeps the plain cooperative launch, which a user's stream capture records as a kernel node.

One graph per kernel function (the general build, the MK_WGMMA_ONLY one), built at its first
use: a kernel node with the cooperative attribute, so a replay keeps the launch's guarantee
that every block is resident at once (the blocks wait on each other). Where the driver
refuses any step of the build, ``error`` says why and the executor launches directly.
"""
from __future__ import annotations

from .driver import _bindings, check


class GraphLauncher:
    """Replays of one cooperative kernel node: ``grid`` blocks of ``block`` threads with
    ``smem_bytes`` of dynamic shared memory, arguments from the void** array at
    ``argv_addr`` as they are when ``launch`` is called (set before the first launch: the
    owner creates the launcher before its argument array, so that its finalizer holds it)."""

    def __init__(self, grid: int, block: int, smem_bytes: int, argv_addr: int = 0):
        self.grid, self.block, self.smem_bytes = grid, block, smem_bytes
        self.argv_addr = argv_addr
        self.error: str | None = None    # why the build failed: launch directly
        # id(func) -> (func, graph, node, exe, params, set_params, replay): the two driver
        # entry points held, so a replay looks nothing up
        self._graphs: dict[int, tuple] = {}

    def launch(self, func, stream):
        """Replay `func`'s graph on `stream` with the arguments as they are now. Returns the
        driver's result (the caller names the failure), or None where no graph could be
        built (self.error says why: launch directly)."""
        entry = self._graphs.get(id(func))
        if entry is None:
            if self.error is not None:
                return None
            entry = self._build(func)
            if entry is None:
                return None
        _, _, node, exe, params, set_params, replay = entry
        ret = set_params(exe, node, params)
        err = ret[0] if isinstance(ret, tuple) else ret
        if int(err) != 0:
            return ret
        return replay(exe, stream)

    def _build(self, func):
        drv = _bindings()
        graph = None
        try:
            params = drv.CUDA_KERNEL_NODE_PARAMS()
            params.func = func
            params.gridDimX, params.gridDimY, params.gridDimZ = self.grid, 1, 1
            params.blockDimX, params.blockDimY, params.blockDimZ = self.block, 1, 1
            params.sharedMemBytes = self.smem_bytes
            params.kernelParams = self.argv_addr
            graph = check(drv.cuGraphCreate(0), "cuGraphCreate")
            node = check(drv.cuGraphAddKernelNode(graph, None, 0, params),
                         "cuGraphAddKernelNode")
            value = drv.CUkernelNodeAttrValue()
            value.cooperative = 1
            check(drv.cuGraphKernelNodeSetAttribute(
                node, drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, value),
                "cuGraphKernelNodeSetAttribute(cooperative)")
            exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except Exception as exc:   # a driver or bindings that refuse: launch directly
            self.error = str(exc)
            if graph is not None:
                drv.cuGraphDestroy(graph)
            return None
        entry = (func, graph, node, exe, params, drv.cuGraphExecKernelNodeSetParams,
                 drv.cuGraphLaunch)
        self._graphs[id(func)] = entry
        return entry

    def close(self) -> None:
        """Destroy every graph (a replay still running finishes first: the driver's rule)."""
        drv = _bindings()
        graphs, self._graphs = self._graphs, {}
        for _, graph, _, exe, *_ in graphs.values():
            drv.cuGraphExecDestroy(exe)
            drv.cuGraphDestroy(graph)
