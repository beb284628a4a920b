"""Misuse of run(out=...) is a GraphError before anything runs, and nothing is written."""
import numpy as np
import pytest

import megak
from megak import GraphError


def three_outputs(backend="sim"):
    g = megak.Graph()
    a = g.input("a", (4, 4), "float32")
    g.output(g.copy(a), "first")
    g.output(g.transpose(a), "second")
    g.output(g.gemm(a, a), "third")
    return megak.compile(g, backend=backend, **({"n_sm": 2} if backend == "sim" else {}))


def poisoned():
    return np.full((4, 4), np.nan, np.float32)


def inputs(rng):
    return {"a": rng.standard_normal((4, 4)).astype(np.float32)}


def test_out_must_be_a_dict(rng):
    with pytest.raises(GraphError, match="takes a dict of output name -> array"):
        three_outputs().run(out=poisoned(), **inputs(rng))


def read_only():
    arr = poisoned()
    arr.flags.writeable = False
    return arr


BAD_TARGETS = {
    "read-only": (read_only, "read-only"),
    "none": (lambda: None, "'second' is None"),
    "list": (lambda: [[0.0] * 4] * 4, "output 'second'.*got list"),
}


@pytest.mark.parametrize("case", BAD_TARGETS)
def test_a_bad_target_writes_nothing(backend, rng, case):
    make, message = BAD_TARGETS[case]
    with three_outputs(backend) as prog:
        first, third = poisoned(), poisoned()
        with pytest.raises(GraphError, match=message):
            prog.run(out={"first": first, "second": make(), "third": third}, **inputs(rng))
    assert np.isnan(first).all() and np.isnan(third).all()


def test_one_array_for_two_outputs_writes_nothing(backend, rng):
    with three_outputs(backend) as prog:
        shared, third = poisoned(), poisoned()
        with pytest.raises(GraphError, match="'first' and 'second'"):
            prog.run(out={"first": shared, "second": shared, "third": third}, **inputs(rng))
    assert np.isnan(shared).all() and np.isnan(third).all()


def test_overlapping_views_are_refused_and_disjoint_ones_written(backend, rng):
    with three_outputs(backend) as prog:
        wide = np.full((4, 6), np.nan, np.float32)
        with pytest.raises(GraphError, match="'first' and 'second'.*overlapping"):
            prog.run(out={"first": wide[:, :4], "second": wide[:, 2:]}, **inputs(rng))
        assert np.isnan(wide).all()

        x = inputs(rng)
        stacked = np.full((2, 4, 4), np.nan, np.float32)
        got = prog.run(out={"first": stacked[0], "second": stacked[1]}, **x)
    assert np.shares_memory(got["first"], stacked)
    np.testing.assert_array_equal(stacked[0], x["a"])
    np.testing.assert_array_equal(stacked[1], x["a"].T)


@pytest.mark.gpu
def test_one_gpu_tensor_for_two_outputs_writes_nothing(rng):
    torch = pytest.importorskip("torch")
    with three_outputs("cuda") as prog:
        shared = torch.full((4, 4), float("nan"), device="cuda")
        third = torch.full((4, 4), float("nan"), device="cuda")
        a = torch.from_numpy(inputs(rng)["a"]).cuda()
        with pytest.raises(GraphError, match="'first' and 'second'"):
            prog.run(out={"first": shared, "second": shared.view(4, 4), "third": third}, a=a)
    assert shared.isnan().all() and third.isnan().all()
