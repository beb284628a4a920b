"""NVRTC compilation of the megakernel to a cubin, with a disk cache.

Always a cubin for the exact arch, never PTX: the GPU machines run an older driver than the
NVRTC wheel, and newer PTX does not load there (docs/ARCHITECTURE.md section 1.5). Nothing in this module
touches the CUDA driver: it works on a machine with no GPU and no libcuda, which is how CI
checks that the megakernel compiles without register spills.

Sources: ``megakernel.cu`` and the ``#include "..."`` headers under ``megak/device`` are
inlined into one text (each header once, with ``#line`` markers so NVRTC errors name the real
file and line). The cache key hashes that text, so it covers every header.

Cache: ``<dir>/<key>.cubin`` + ``<key>.log``, written atomically (temporary file, then
``os.replace``). ``dir`` is the ``cache_dir`` argument, else ``$MEGAK_CACHE_DIR``, else
``$XDG_CACHE_HOME/megak`` (``~/.cache/megak``). The key is the sha256 of the source, the exact
NVRTC option list, the arch and the NVRTC version.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEVICE_DIR = Path(__file__).resolve().parent.parent / "device"
KERNEL_FILE = DEVICE_DIR / "megakernel.cu"
KERNEL_NAME = "megakernel"
DEFAULT_ARCH = "sm_90a"
_CACHE_FORMAT = 1   # bump when the cache layout or what a key means changes

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.MULTILINE)


class CompileError(RuntimeError):
    """NVRTC rejected the source; the message carries the full compiler log."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class CompiledKernel:
    cubin: bytes
    log: str                    # NVRTC + ptxas -v output
    arch: str
    registers: int | None       # per thread, of the kernel entry (None: not in the log)
    spill_bytes: int            # spill stores + spill loads (bytes)
    static_smem: int | None     # bytes of static shared memory
    from_cache: bool
    cache_key: str
    kernel_name: str = KERNEL_NAME


# ---- sources -------------------------------------------------------------------------------

def resolve_includes(text: str, base_dir: Path, search: tuple[Path, ...] = (DEVICE_DIR,),
                     _seen: set[Path] | None = None, name: str = "<source>") -> str:
    """Inline every ``#include "file"`` (relative to the including file, then ``search``),
    each file at most once; angle-bracket includes are left alone."""
    seen = set() if _seen is None else _seen
    out: list[str] = []
    pos = 0
    line_no = 1
    for m in _INCLUDE.finditer(text):
        chunk = text[pos:m.start()]
        out.append(chunk)
        line_no += chunk.count("\n")
        target = m.group(1)
        for root in (base_dir, *search):
            path = (root / target).resolve()
            if path.is_file():
                break
        else:
            raise CompileError(f'{name}:{line_no}: cannot find #include "{target}" '
                               f"(searched {base_dir} and {', '.join(map(str, search))})")
        if path not in seen:
            seen.add(path)
            rel = _display_name(path)
            body = resolve_includes(path.read_text(), path.parent, search, seen, rel)
            out.append(f'#line 1 "{rel}"\n{body}\n#line {line_no + 1} "{name}"')
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def _display_name(path: Path) -> str:
    try:
        return str(path.relative_to(DEVICE_DIR.parent.parent))
    except ValueError:
        return str(path)


def device_source() -> str:
    """The megakernel as one self-contained translation unit (all local headers inlined)."""
    name = _display_name(KERNEL_FILE)
    return f'#line 1 "{name}"\n' + resolve_includes(
        KERNEL_FILE.read_text(), KERNEL_FILE.parent, (DEVICE_DIR,), {KERNEL_FILE.resolve()}, name)


# ---- ptxas log -----------------------------------------------------------------------------

def parse_ptxas_log(log: str, entry: str = KERNEL_NAME) -> dict:
    """Registers, spills, stack and static smem of one entry function from ``ptxas -v``."""
    info: dict = {"registers": None, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0,
                  "static_smem": None}
    start = log.find(f"Compiling entry function '{entry}'")
    if start < 0:
        return info
    nxt = log.find("Compiling entry function", start + 1)
    block = log[start:nxt if nxt >= 0 else len(log)]
    if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      block):
        info["stack_bytes"], info["spill_stores"], info["spill_loads"] = map(int, m.groups())
    if m := re.search(r"Used (\d+) registers", block):
        info["registers"] = int(m.group(1))
        sm = re.search(r"Used \d+ registers[^\n]*?(\d+) bytes smem", block)
        info["static_smem"] = int(sm.group(1)) if sm else 0   # ptxas omits a zero
    return info


def function_spills(log: str, entry: str = KERNEL_NAME) -> dict[str, tuple[int, int]]:
    """(spill store bytes, spill load bytes) of every function ptxas compiled for ``entry``
    (the entry itself and the non-inlined device functions it calls), by mangled name."""
    start = log.find(f"Compiling entry function '{entry}'")
    if start < 0:
        return {}
    nxt = log.find("Compiling entry function", start + 1)
    block = log[start:nxt if nxt >= 0 else len(log)]
    return {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"Function properties for (\S+)\s*\n[^\n]*?\d+ bytes stack frame, (\d+) bytes spill "
        r"stores, (\d+) bytes spill loads", block)}


def compile_report(compiled: "CompiledKernel", entries,
                   seconds: float | None = None) -> tuple[list[str], list[str]]:
    """A compile-only check's report (the probes' --compile-only): the cubin's size, ptxas's
    log, then per entry its registers, spills, stack and static smem and each non-inlined
    function's spills. Returns (lines, problems): an entry missing from the log, or any
    spill."""
    took = f", {seconds:.1f} s" if seconds is not None else ""
    lines = [f"NVRTC -> cubin for {compiled.arch}: {len(compiled.cubin)} bytes{took}"
             f"{' (from cache)' if compiled.from_cache else ''}", "ptxas info:"]
    lines += ["  " + ln.strip() for ln in compiled.log.splitlines() if ln.strip()]
    log = compiled.log
    width = max([len(e) for e in entries] + [5]) + 2
    lines.append(f"{'entry':<{width}}{'regs':>6}{'spill st':>10}{'spill ld':>10}{'stack':>7}"
                 f"{'smem':>7}")
    problems = []
    for e in entries:
        info = parse_ptxas_log(log, e)
        if info["registers"] is None:
            problems.append(f"{e}: not in the ptxas log")
            continue
        lines.append(f"{e:<{width}}{info['registers']:>6}{info['spill_stores']:>10}"
                     f"{info['spill_loads']:>10}{info['stack_bytes']:>7}{info['static_smem']:>7}")
        if info["spill_stores"] or info["spill_loads"]:
            problems.append(f"{e}: spills")
        for fn, (st, ld) in function_spills(log, e).items():
            if fn == e:
                continue
            lines.append(f"  function {fn}: spill stores {st} B, spill loads {ld} B")
            if st or ld:
                problems.append(f"{e}: {fn} spills")
    return lines, problems


# ---- cache ---------------------------------------------------------------------------------

def default_cache_dir() -> Path:
    env = os.environ.get("MEGAK_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "megak"


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def nvrtc_version() -> tuple[int, int]:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"nvrtcVersion failed: {err}")
    return int(major), int(minor)


def _normalize_defines(defines: dict | None) -> list[tuple[str, str]]:
    out = []
    for key, value in sorted((defines or {}).items()):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise ValueError(f"bad macro name {key!r}")
        if value is None or value is True:
            value = "1"
        elif value is False:
            value = "0"
        out.append((str(key), str(value)))
    return out


def _options(arch: str, defines: list[tuple[str, str]], name: str):
    from cuda.core import ProgramOptions
    return ProgramOptions(name=name, arch=arch, std="c++17", ptxas_options=["-v"],
                          define_macro=list(defines) or None)


def _options_and_key(source: str, arch: str, defines: dict | None, entry: str, name: str):
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"arch must name a real GPU (e.g. 'sm_90a'), got {arch!r}: "
                         "megak compiles cubins only")
    options = _options(arch, _normalize_defines(defines), name)
    try:   # the exact flags NVRTC gets; older cuda.core spells this differently
        flags = options.as_bytes("nvrtc", "cubin")
    except (AttributeError, TypeError):
        flags = [repr(options)]
    option_list = [o.decode() if isinstance(o, bytes) else str(o) for o in flags]
    key = hashlib.sha256(json.dumps({
        "format": _CACHE_FORMAT, "source": source, "options": option_list, "arch": arch,
        "nvrtc": list(nvrtc_version()), "entry": entry,
    }, sort_keys=True).encode()).hexdigest()
    return options, key


def cache_key(source: str, arch: str = DEFAULT_ARCH, defines: dict | None = None,
              entry: str = KERNEL_NAME, name: str = "megakernel.cu") -> str:
    """The disk-cache key compile_source would use (no compilation)."""
    return _options_and_key(source, arch, defines, entry, name)[1]


# ---- compile -------------------------------------------------------------------------------

def compile_source(source: str, arch: str = DEFAULT_ARCH, defines: dict | None = None,
                   cache_dir: str | Path | None = None, entry: str = KERNEL_NAME,
                   name: str = "megakernel.cu") -> CompiledKernel:
    """Compile a self-contained CUDA C++ source to a cubin for ``arch`` (cached on disk)."""
    options, key = _options_and_key(source, arch, defines, entry, name)

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cubin_path, log_path = root / f"{key}.cubin", root / f"{key}.log"
    try:
        cubin = cubin_path.read_bytes()
        log = log_path.read_text()
        if cubin:
            return _make(cubin, log, arch, key, entry, from_cache=True)
    except OSError:
        pass   # a miss (or an unreadable entry): compile

    from cuda.core import Program
    sink = io.StringIO()
    try:
        obj = Program(source, "c++", options).compile("cubin", logs=sink)
    except Exception as exc:   # cuda.core raises NVRTCError with the log in its message
        log = (sink.getvalue() + "\n" + str(exc)).strip("\x00\n ")
        raise CompileError(f"NVRTC failed to compile {name} for {arch}:\n{log}", log) from exc
    log = sink.getvalue().replace("\x00", "").strip()
    code = obj.code
    if isinstance(code, str):   # never expected for "cubin"; refuse a path or PTX
        raise CompileError(f"NVRTC returned {type(code).__name__}, not a cubin", log)
    cubin = bytes(code)

    try:
        root.mkdir(parents=True, exist_ok=True)
        _write_atomic(log_path, log.encode())
        _write_atomic(cubin_path, cubin)   # last: a .cubin implies its .log is complete
    except OSError:
        pass   # a read-only cache is not an error: the cubin is in hand
    return _make(cubin, log, arch, key, entry, from_cache=False)


def _make(cubin: bytes, log: str, arch: str, key: str, entry: str,
          from_cache: bool) -> CompiledKernel:
    info = parse_ptxas_log(log, entry)
    return CompiledKernel(cubin=cubin, log=log, arch=arch, registers=info["registers"],
                          spill_bytes=info["spill_stores"] + info["spill_loads"],
                          static_smem=info["static_smem"], from_cache=from_cache,
                          cache_key=key, kernel_name=entry)


def code_sizes(cubin: bytes) -> dict[str, int]:
    """Bytes of SASS per function (kernels and the non-inlined device functions), from the
    cubin's ELF symbol table: what an SM's instruction cache has to hold."""
    import struct
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize)
                for i in range(shnum)]
    sizes = {}
    for _, kind, _, _, off, size, link, _, _, entsize in sections:
        if kind != 2:   # SHT_SYMTAB
            continue
        strtab_off = sections[link][4]
        for o in range(off, off + size, entsize):
            name_at, info, _, _, _, sym_size = struct.unpack_from("<IBBHQQ", cubin, o)
            if info & 0xF == 2 and sym_size:   # STT_FUNC
                end = cubin.index(b"\0", strtab_off + name_at)
                sizes[cubin[strtab_off + name_at:end].decode()] = sym_size
    return sizes


def bodies_defines(bodies: int, resident: bool = False) -> dict:
    """The defines of a build holding the op bodies `bodies` (instr.h, enum mk_bodies), and
    the resident kernel where `resident`."""
    defines = {"MK_BODIES": f"{bodies:#x}u"}
    if resident:
        defines["MK_RESIDENT"] = 1
    return defines


def compile_megakernel(arch: str = DEFAULT_ARCH, defines: dict | None = None,
                       cache_dir: str | Path | None = None) -> CompiledKernel:
    """The megakernel as a cubin for ``arch`` (sm_90a on H100/H200), from the disk cache when
    the source, options, arch and NVRTC version match. Raises CompileError with the log."""
    return compile_source(device_source(), arch=arch, defines=defines, cache_dir=cache_dir)
