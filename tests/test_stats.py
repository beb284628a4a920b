"""prog.stats prints as a short summary and still works as the scheduler's dict."""
import megak
from megak import scheduler
from megak.stats import Stats


def program():
    g = megak.Graph()
    a = g.input("a", (300, 200), "float32")
    g.output(g.copy(g.transpose(g.gemm(a, g.transpose(a)))), "y")
    return megak.compile(g, backend="sim")


def test_stats_print_as_a_few_short_lines():
    prog = program()
    text = repr(prog.stats)
    assert text == prog.stats.summary() == str(prog.stats)
    lines = text.splitlines()
    assert 3 <= len(lines) <= 8 and max(map(len, lines)) <= 100, text
    st = prog.stats
    assert f"{st['instructions']} instructions" in text
    for opcode, n in st["instructions_per_opcode"].items():
        assert f"{opcode} {n}" in text
    used = sum(1 for n in st["queue_lengths"] if n > 0)
    assert f"on {used} of 132 SMs" in text
    q = sorted(st["queue_lengths"])
    assert f"min {q[0]}," in text and f"max {q[-1]}" in text
    assert f"counters: {st['counters']}" in text
    assert f"pages per SM: 13 (peak in use on one SM: {max(st['peak_pages_per_sm'])})" in text
    assert ("dropped ops" in text) == ("dropped_ops" in st)
    # still the scheduler's dict, for code that reads its numbers
    assert isinstance(prog.stats, dict)
    assert dict(prog.stats) == scheduler.stats(prog.plan)
    assert len(prog.stats["queue_lengths"]) == 132


def test_dropped_ops_are_counted_and_named():
    st = Stats(scheduler.stats(program().plan))
    st["dropped_ops"] = ["gemm #4 (t0, t0 -> t5)", "copy #5", "copy #6", "copy #7"]
    text = st.summary()
    assert "dropped ops: 4 (no output depends on them): gemm #4 (t0, t0 -> t5), copy #5, " \
           "copy #6, ... 1 more" in text
    st["dropped_ops"] = []
    assert "dropped ops: none" in st.summary()


def test_the_weight_rings_pages_are_counted_and_shown():
    """A streamed bf16 layer (weights a graph input, batch <= 64) keeps a ring of pages on every
    SM: stats name it (the benchmarks' bytes in flight per SM read it), the summary says so."""
    g = megak.Graph()
    x = g.input("x", (16, 1024), "bfloat16")
    g.output(g.gemm(x, g.input("w", (1024, 1024), "bfloat16")), "y")
    st = megak.compile(g, backend="sim").stats
    assert st["stream_pages"] == st["pages_per_sm"] - max(st["peak_pages_per_sm"]) > 0
    assert f"({st['stream_pages']} for the weight stream's ring, " in repr(st)
    plain = program().stats
    assert plain["stream_pages"] == 0 and "ring" not in repr(plain)
