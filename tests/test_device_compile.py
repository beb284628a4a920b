"""The megakernel compiles (NVRTC, no GPU needed): an sm_90a cubin, no register spills, the
host/device layout agrees, the disk cache works, and compile errors carry the NVRTC log.

Run with ``-s`` to see the kernel's resource usage. One real compile per distinct source.
"""
from __future__ import annotations

import re

import pytest

from megak import abi

compiler = pytest.importorskip("megak.runtime.compiler")
pytest.importorskip("cuda.core")

ARCH = "sm_90a"
MAX_REGISTERS = 168   # __launch_bounds__(384, 1): 65536 / 384, in units of 8 (setmaxnreg then
#                       moves the compute warps to 224)


def _resources(k) -> str:
    from megak import pages
    return (f"{k.arch}: {k.registers} registers/thread, {k.spill_bytes} B spilled, "
            f"static smem {k.static_smem} B, dynamic smem per block "
            f"{pages.smem_bytes(pages.DEFAULT_PAGES):,} B ({pages.DEFAULT_PAGES} pages on "
            f"H100/H200), cubin {len(k.cubin):,} B")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("megak-cache")


@pytest.fixture(scope="module")
def kernel(cache_dir):
    return compiler.compile_megakernel(ARCH, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def trace_kernel(cache_dir):
    return compiler.compile_megakernel(ARCH, defines={"MK_TRACE": 1}, cache_dir=cache_dir)


def test_device_source_inlines_every_header():
    src = compiler.device_source()
    assert not re.search(r'^\s*#\s*include\s*"', src, re.M), "a local include was left"
    for path in sorted(compiler.DEVICE_DIR.rglob("*.cuh")) + [compiler.DEVICE_DIR / "instr.h"]:
        body = path.read_text()
        first_decl = next(line for line in body.splitlines() if line.startswith("#ifndef"))
        assert first_decl in src, f"{path.name} is not in the device source"


# The control code (mk_compute: the compute warps' loop with the copy op inlined; mk_loader: the
# loader warp, 56 registers after setmaxnreg) may keep a few values in local memory: register
# saves around the calls into the op bodies, once per instruction. The op bodies (GEMM paths,
# reduce, transpose), where the time goes, may save at most a few registers once per call:
# ptxas allocates the functions of one kernel together (what a caller keeps live across a call
# is what its callee may not use), so a change in one body moves a few registers' saves
# between the others. None of them may touch local memory inside an MMA loop
# (tests/test_device_gemm_compile.py checks the SASS).
CONTROL_SPILL_LIMIT = 512
CONTROL_FUNCTIONS = ("megakernel", "mk_compute", "mk_loader")
OP_SAVE_LIMIT = 32   # bytes of spill stores (8 registers) per op body


@pytest.mark.parametrize("variant", ["kernel", "trace_kernel"])
def test_megakernel_compiles_without_spills_in_the_ops(variant, request):
    k = request.getfixturevalue(variant)
    print(f"\nmegakernel ({variant}): {_resources(k)}")
    assert k.cubin[:4] == b"\x7fELF", "not a cubin"
    assert b"megakernel" in k.cubin
    assert k.arch == ARCH
    assert k.registers is not None, f"no ptxas resource line for 'megakernel' in:\n{k.log}"
    spills = compiler.function_spills(k.log)
    assert "megakernel" in spills and any("mk_gemm_bf16" in f for f in spills), k.log
    control = 0
    for fn, (stores, loads) in sorted(spills.items()):
        print(f"  {fn}: {stores} B spill stores, {loads} B spill loads")
        if any(c in fn for c in CONTROL_FUNCTIONS):
            control += stores + loads
        else:
            assert stores <= OP_SAVE_LIMIT and loads <= 2 * OP_SAVE_LIMIT, \
                f"{fn} spills: {_resources(k)}\n{k.log}"
    assert control <= CONTROL_SPILL_LIMIT, f"control code spills {control} B\n{k.log}"
    assert k.registers <= MAX_REGISTERS, _resources(k)
    assert k.static_smem == 0, f"static shared memory eats into the pages: {_resources(k)}"


def test_a_build_holds_its_bodies_only(kernel, cache_dir):
    """MK_BODIES (instr.h): a build of the streamed GEMM holds that body and none of the
    others, no resident kernel, and, that body aside, far less code per SM than the build of
    every body."""
    stream = (1 << abi.OP_NOP) | (1 << abi.OPCODE_OF["gemm"]) | abi.BODY_GEMM_STREAM
    k = compiler.compile_megakernel(ARCH, defines=compiler.bodies_defines(stream),
                                    cache_dir=cache_dir)
    print(f"\nmegakernel (streamed GEMM only): {_resources(k)}")
    assert k.spill_bytes == 0 and k.registers <= MAX_REGISTERS, _resources(k)
    sizes, every = compiler.code_sizes(k.cubin), compiler.code_sizes(kernel.cubin)

    def held(sizes, fn):
        return sum(v for name, v in sizes.items() if f"${fn}" in name or f"{len(fn)}{fn}" in name)

    assert held(sizes, "mk_gemm_stream") > 0 and held(every, "mk_gemm_stream") > 0
    for fn in ("mk_gemm_bf16", "mk_gemm_f32", "mk_gemm_wgmma", "mk_transpose_body",
               "megakernel_resident"):
        assert held(every, fn) > 0, fn
        assert held(sizes, fn) == 0, fn
    # the interpreter (mk_compute) and the loader without the other ops inlined
    for fn in ("mk_compute", "mk_loader"):
        assert 0 < held(sizes, fn) < held(every, fn) / 2, (fn, held(sizes, fn), held(every, fn))
    # apart from the op's own body (the same functions in both builds), the rest of the kernel
    # holds a fraction of the every-body build's rest: the size of the body itself (the fp32
    # band's forms grew it) is not what this build is about
    rest = sizes["megakernel"] - held(sizes, "mk_gemm_stream")
    every_rest = every["megakernel"] - held(every, "mk_gemm_stream")
    assert rest < every_rest / 3, (rest, every_rest)


def test_a_resident_build_holds_its_bodies_and_the_resident_kernel(kernel, cache_dir):
    """MK_RESIDENT: the resident kernel of a copy program's bodies, without a GEMM."""
    bodies = (1 << abi.OP_NOP) | (1 << abi.OPCODE_OF["copy"])
    k = compiler.compile_megakernel(ARCH, defines=compiler.bodies_defines(bodies, True),
                                    cache_dir=cache_dir)
    print(f"\nmegakernel (copy, resident): {_resources(k)}")
    assert k.spill_bytes == 0 and k.registers <= MAX_REGISTERS, _resources(k)
    names = " ".join(compiler.code_sizes(k.cubin))
    assert "megakernel_resident" in names
    assert "mk_gemm" not in names and "mk_transpose" not in names, names
    assert len(k.cubin) < len(kernel.cubin) / 3


def test_only_a_take_build_holds_the_copy_hand_out(cache_dir):
    """MK_BODY_COPY_TAKE: a copy build with it holds the takers' loop (one more atomic add:
    the hand-out) and compiles without spills, launched and resident; one without it has
    no such add (its record check refuses a taker)."""
    from tests.test_device_gemm_compile import _ptx
    copy = (1 << abi.OP_NOP) | (1 << abi.OPCODE_OF["copy"])
    add = re.compile(r"\batom(?:\.\w+)*\.add\.u32\b")
    plain = len(add.findall(_ptx(compiler.bodies_defines(copy))))
    take = len(add.findall(_ptx(compiler.bodies_defines(copy | abi.BODY_COPY_TAKE))))
    assert take > plain, (plain, take)
    for resident in (False, True):
        k = compiler.compile_megakernel(
            ARCH, defines=compiler.bodies_defines(copy | abi.BODY_COPY_TAKE, resident),
            cache_dir=cache_dir)
        print(f"\nmegakernel (copy with takers, resident={resident}): {_resources(k)}")
        assert k.spill_bytes == 0 and k.registers <= MAX_REGISTERS, _resources(k)


def test_layout_asserts_compile(cache_dir):
    """cffi's view of instr.h (sizes, offsets, enum values) holds in NVRTC's view too."""
    src = compiler.resolve_includes(abi.layout_asserts(), compiler.DEVICE_DIR)
    src += 'extern "C" __global__ void layout_probe() {}\n'
    try:
        k = compiler.compile_source(src, ARCH, cache_dir=cache_dir, entry="layout_probe",
                                    name="layout_asserts.cu")
    except compiler.CompileError as exc:
        if "__builtin_offsetof" in exc.log and "static assertion" not in exc.log:
            pytest.skip(f"this NVRTC does not know __builtin_offsetof: {exc.log[:300]}")
        raise
    assert k.cubin[:4] == b"\x7fELF"


def test_cache_round_trip(kernel, cache_dir):
    again = compiler.compile_megakernel(ARCH, cache_dir=cache_dir)
    assert again.from_cache and again.cache_key == kernel.cache_key
    assert again.cubin == kernel.cubin
    assert again.log == kernel.log
    assert (again.registers, again.spill_bytes, again.static_smem) == \
        (kernel.registers, kernel.spill_bytes, kernel.static_smem)
    files = sorted(p.name for p in cache_dir.iterdir() if p.name.startswith(kernel.cache_key))
    assert files == [f"{kernel.cache_key}.cubin", f"{kernel.cache_key}.log"]
    assert not list(cache_dir.glob("*.tmp")), "a temporary file was left behind"


def test_cache_key_covers_defines_arch_and_source(kernel, trace_kernel):
    src = compiler.device_source()
    assert compiler.cache_key(src, ARCH) == kernel.cache_key
    assert trace_kernel.cache_key != kernel.cache_key
    assert compiler.cache_key(src, ARCH, {"MK_TRACE": 2}) != trace_kernel.cache_key
    assert compiler.cache_key(src, "sm_100a") != kernel.cache_key
    assert compiler.cache_key(src + "\n", ARCH) != kernel.cache_key
    assert trace_kernel.cubin != kernel.cubin


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MEGAK_CACHE_DIR", str(tmp_path / "a"))
    assert compiler.default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("MEGAK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compiler.default_cache_dir() == tmp_path / "xdg" / "megak"


def test_compile_error_carries_the_log(tmp_path):
    src = 'extern "C" __global__ void megakernel(float* p) { p[0] = planted_error_here; }\n'
    with pytest.raises(compiler.CompileError) as info:
        compiler.compile_source(src, ARCH, cache_dir=tmp_path)
    assert "planted_error_here" in str(info.value)
    assert "planted_error_here" in info.value.log
    assert not any(tmp_path.iterdir()), "a failed compile must not be cached"


def test_only_cubins():
    with pytest.raises(ValueError, match="cubin"):
        compiler.compile_source("", "compute_90a")


def test_parse_ptxas_log():
    log = ("ptxas info    : Compiling entry function 'other' for 'sm_90a'\n"
           "ptxas info    : Function properties for other\n"
           "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 16 bytes smem\n"
           "ptxas info    : Compiling entry function 'megakernel' for 'sm_90a'\n"
           "ptxas info    : Function properties for megakernel\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers\n")
    info = compiler.parse_ptxas_log(log)
    assert (info["registers"], info["spill_stores"], info["spill_loads"], info["static_smem"]) \
        == (168, 0, 0, 0)
    other = compiler.parse_ptxas_log(log, "other")
    assert (other["registers"], other["spill_stores"] + other["spill_loads"],
            other["static_smem"]) == (40, 8, 16)
    assert compiler.parse_ptxas_log(log, "absent")["registers"] is None
    k = compiler.CompiledKernel(cubin=b"x" * 10, log=log, arch="sm_90a", registers=168,
                                spill_bytes=0, static_smem=0, from_cache=True, cache_key="k")
    lines, problems = compiler.compile_report(k, ["megakernel", "other", "absent"], 0.25)
    assert lines[0] == "NVRTC -> cubin for sm_90a: 10 bytes, 0.2 s (from cache)"
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("entry"))) + 1:]
    assert table[0].split() == ["megakernel", "168", "0", "0", "0", "0"]
    assert table[1].split() == ["other", "40", "4", "4", "8", "16"]
    assert problems == ["other: spills", "absent: not in the ptxas log"]
