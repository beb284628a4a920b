"""Host-side cost: lowering + scheduling + encoding a graph of ~100,000 instructions.

Run: python -m pytest benchmarks/test_host.py --benchmark-only
Target (issue: foundation): <= 1 s on a 2-core machine. Figures: benchmarks/LOWERING.md.
"""
import megak
from megak import scheduler


def graph_100k() -> megak.Graph:
    """98 chained 4096^2 GEMMs: 98 x 32 x 32 = 100,352 tile instructions."""
    g = megak.Graph()
    x = g.input("x", (4096, 4096), "float32")
    w = g.input("w", (4096, 4096), "float32")
    for _ in range(98):
        x = g.gemm(x, w)
    g.output(x, "y")
    return g


def lower_schedule_encode(g, n_sm=132):
    plan = scheduler.build_plan(g, n_sm=n_sm)
    return plan, plan.encoded()


def test_lower_100k(benchmark):
    g = graph_100k()
    plan, data = benchmark.pedantic(lower_schedule_encode, args=(g,), rounds=7, iterations=1,
                                    warmup_rounds=1)
    assert len(plan.instrs) == 100_352 and len(data) == 100_352 * 128
