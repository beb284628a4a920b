"""benchmarks/hop.py: its CUDA source compiles to an sm_90a cubin (NVRTC only, no GPU), and on a
GPU both variants carry the chain's payload through every hop. No assertion on time."""
import pytest

from benchmarks import hop

ARCH = "sm_90a"


def test_expected_payload_depends_on_every_hop_and_the_epoch():
    a = hop.expected_payload(1, 1000)
    assert a == hop.mix(hop.expected_payload(1, 999), 999)
    assert a != hop.expected_payload(2, 1000)
    assert a != hop.expected_payload(1, 999)
    assert all(0 <= hop.mix(x, i) <= 0xFFFFFFFF for x in (0, 1, 0xFFFFFFFF) for i in (0, 7))


def test_source_compiles_to_an_sm90a_cubin(tmp_path):
    compiler = pytest.importorskip("megak.runtime.compiler")
    pytest.importorskip("cuda.core")
    k = hop.compile_hop(ARCH, cache_dir=tmp_path)
    assert k.cubin[:4] == b"\x7fELF", "not a cubin"
    assert k.arch == ARCH and not k.from_cache
    for v in hop.VARIANTS:
        info = compiler.parse_ptxas_log(k.log, f"hop_{v}")
        assert f"hop_{v}".encode() in k.cubin
        assert info["registers"] is not None, k.log
        assert info["spill_stores"] == info["spill_loads"] == 0, k.log


@pytest.mark.gpu
@pytest.mark.parametrize("n_hops", [2, 5, 300])   # fewer hops than SMs too: idle blocks
def test_both_variants_carry_the_payload_through_every_hop(n_hops):
    r = hop.measure(n_hops=n_hops, reps=3, warmup=1)   # raises on any wrong launch
    assert r["sm_count"] > 0 and r["device"]
    assert r["last_epoch"] == 4
    assert r["expected_payload"] == hop.expected_payload(4, n_hops)
    for v in hop.VARIANTS:
        assert r["final_payload"][v] == r["expected_payload"], v
        assert r[f"{v}_us"] > 0 and r[f"{v}_launch_us"] > 0
