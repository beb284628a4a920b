"""tools/probe_stream_phases.py --per-op reads a run saved by --save without a GPU: here a
simulated fp32 chain's trace, saved as the probe saves the GPU's."""
import numpy as np

import megak
from benchmarks.workloads import w2
from tests.tools import load_tool

probe_stream_phases = load_tool("probe_stream_phases")


def test_per_op_reads_a_saved_run(tmp_path, capsys):
    work = w2(1024, 3, 16, "float32")
    prog = megak.compile(work.build(), backend="sim")
    prog.run(**work.make_inputs(np.random.default_rng(0)), trace=True)
    prefix = str(tmp_path / "chain")
    probe_stream_phases.save(prefix, prog)
    probe_stream_phases.per_op(prefix)
    out = capsys.readouterr().out.splitlines()
    ops = np.unique(prog.last_trace.events["op_index"])
    rows = [line for line in out if line.split()[:1] and line.split()[0].isdigit()]
    assert [int(r.split()[0]) for r in rows] == list(ops)   # one row per op, in order
    assert {r.split()[1] for r in rows} == {"gemm"}   # streamed fp32 bands: no reduce
    assert any(line.startswith("layer period: ") for line in out)
    assert sum("past the first two ops" in line for line in out) == 1   # one op kind
