#!/usr/bin/env bash
# The checks a change to device, runtime or op code needs on a GPU machine, as one command:
#
#   tools/gpu_checks.sh [tier] [sanitize] [report BASELINE.json] [probes] [callpath] [fence]
#                       [fencecp]
#                       [pageleak] [l2stream] [issuers] [epilogue] [tailcode] [achunks]
#                       [aregs] [modload] [tests] [ab]
#
# (no argument: tier sanitize), from the checkout root of the GPU machine. The wheels megak
# needs there and its image lacks (cffi, ml_dtypes) are installed from .whl/ when present
# (../shared/tools/gpu-prep stages them; carry .whl to the machine). Logs and results go
# under $OUT (default ./gpu-checks):
#
#   tier      tools/prebuild_bodies.py (the tier's builds, in parallel), then pytest -m gpu
#             over tests/ and benchmarks/test_gpu_benchmarks.py      -> prebuild-bodies.log,
#                                                                       tier.log
#   sanitize  tools/sanitize.sh: memcheck, racecheck, synccheck               -> san/
#   report B  python -m benchmarks.report --baseline B (a results JSON)        -> bench/
#             (the JSON records $MEGAK_COMMIT as the revision measured, where it is set:
#             `MEGAK_COMMIT=$rev tools/gpu_checks.sh ...`; a copied tree's .git can be stale)
#   probes    the weight stream's probes: tools/probe_stream_stages.py (as built, with the
#             copies in flight capped, without A, with A rotated; 1024 x 16 in 1 and 8
#             parts) and tools/probe_weight_stream.py --shapes                 -> probes.log
#   callpath  tools/probe_run_steps.py: a repeated run() call's time, step by step
#             (the W7 workloads)                                               -> callpath.log
#   fence     tools/probe_fence_load.py: a gpu-scope publish (fences, a counter hop, stamped
#             words, A chunks) with 0-10 bulk copies in flight per SM  -> fence.log, fence.json
#   fencecp   the same probe's round trips and fences beside 16-B cp.async copies (the short fp32
#             tile's), 0-10 slots of 16 KiB in flight             -> fencecp.log, fencecp.json
#   pageleak  tools/probe_page_leak.py --rounds 3: the W7 workloads, with what each SM holds
#             when its loader reports MK_ERR_PAGE_LEAK, and the takes whose pages came after
#             their phase                                                 -> pageleak.log
#   l2stream  tools/probe_l2_stream.py: L2-resident reads beside the HBM weight stream
#                                                                         -> l2stream.log
#   issuers   tools/probe_issuers.py: an SM's read rate with 1, 2 or 4 lanes issuing its
#             bulk copies                                                 -> issuers.log
#   epilogue  tools/probe_stream_stages.py, variants asbuilt epiloop noepi on 4096 x 8 and
#             1024 x 16: a streamed band's epilogue split at its first store, run twice by
#             one loop (the second pass on fetched code), and left out (its fixed 1.28 us,
#             benchmarks/ANALYSIS.md)                                     -> epilogue.log
#   tailcode  tools/probe_icache.py (how much code an SM keeps, what a block past it costs
#             beside a bulk-copy stream)                                  -> tailcode.log
#   achunks   tools/probe_a_chunks.py: a warp's A chunk by cp.async, bulk copies or loads,
#             idle and beside a bulk-copy stream                          -> achunks.log
#   aregs     tools/probe_stream_stages.py, variants asbuilt Aregs holdA Aregs-holdA on every
#             case: the next stage's A chunk loaded into registers during this stage; the
#             hold kept until the next layer's first A chunk landed        -> aregs.log
#   modload   tools/probe_module_load.py: whether a module's load waits for a kernel that
#             holds every SM, with lazy and eager module loading          -> modload.log
#   tests     pytest -m gpu over $GPU_TESTS (paths or node ids: a change's own GPU tests,
#             before its A/B), their builds prebuilt first                 -> tests.log
#   ab        tools/ab_trees.py run: the W2 rows (or $AB_ROWS) of the trees
#             `tools/ab_trees.py prepare` wrote under ab/ (carry "ab"), timed in turn, two
#             rounds (or $AB_ROUNDS)                                       -> ab.log, ab.json
#
# Each step runs under its own timeout; steps run in the order given. The exit status is
# non-zero when any step failed. At the end (also when a TERM from an outer timeout stops it)
# $OUT is packed to the 8 files a GPU machine gives back: the report's JSON, chart and
# RESULTS.md, then the step logs, in that order, and everything else in rest.tar.gz (the
# sanitizer's per-tool logs, probe builds). Give the steps room: the tier alone takes ~250 s
# while other builds share the cores. NVRTC builds are cached under $XDG_CACHE_HOME (default
# ./scratch/cache); build/cubins.tar.xz, where carried, is unpacked into it first: the builds
# `tools/gpu_cache.py fill` compiled on the CPU machine under this image's NVRTC (the key
# holds the NVRTC version and flags, so a cache filled under another NVRTC misses here).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-$PWD/gpu-checks}
mkdir -p "$OUT"
# What a GPU machine gives back: at most 8 files. Keeps the 7 that matter most where they
# are and puts every other file under $OUT into rest.tar.gz.
pack_out() {
    (
        cd "$OUT" || exit 0
        mapfile -t all < <(find . -type f ! -name rest.tar.gz | sed 's|^\./||' | sort)
        [ ${#all[@]} -le 8 ] && exit 0
        keep=()
        for f in bench/results/*.json bench/results/*.png bench/RESULTS.md tier.log \
                 sanitize.log report.log probes.log callpath.log fence.log fence.json \
                 fencecp.log fencecp.json \
                 pageleak.log l2stream.log issuers.log epilogue.log tailcode.log \
                 achunks.log aregs.log modload.log tests.log ab.log ab.json; do
            [ -f "$f" ] && [ ${#keep[@]} -lt 7 ] && keep+=("$f")
        done
        rest=()
        for f in "${all[@]}"; do
            [[ " ${keep[*]} " == *" $f "* ]] || rest+=("$f")
        done
        tar czf rest.tar.gz "${rest[@]}" && rm -f "${rest[@]}"
        find . -mindepth 1 -type d -empty -delete
    )
}
trap 'pack_out; exit 124' TERM

# One probe as a step: `logged LOG SECONDS CMD...` runs CMD under its own timeout into
# $OUT/LOG, shows the log's last lines and returns CMD's status.
logged() {
    local log=$1 limit=$2
    shift 2
    timeout "$limit" "$@" > "$OUT/$log" 2>&1
    local status=$?
    tail -n 3 "$OUT/$log"
    return $status
}

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        2>/dev/null
fi
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export CUDA_PYTHON_DISABLE_VERSION_CHECK=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/scratch/cache}
if [ -f build/cubins.tar.xz ]; then
    mkdir -p "$XDG_CACHE_HOME/megak" &&
        tar -xJf build/cubins.tar.xz -C "$XDG_CACHE_HOME/megak" &&
        echo "== gpu_checks: $(tar -tJf build/cubins.tar.xz | grep -c '\.cubin$') cubins" \
             "from build/cubins.tar.xz in the cache"
fi

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tier sanitize)

# The probes' builds, started now on the spare cores: the cache key holds the NVRTC version,
# so a cache filled on a machine with another NVRTC misses here, and each build takes a minute.
prebuilds=()
# prebuild TAG VARIANT... [-- PROBE ARGS]: the stage probe's builds of each variant, in the
# background, logs under $OUT/prebuild/TAG-VARIANT.log
prebuild() {
    local tag=$1 variants=()
    shift
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
        variants+=("$1")
        shift
    done
    [ $# -gt 0 ] && shift
    mkdir -p "$OUT/prebuild"
    for v in "${variants[@]}"; do
        timeout 400 python3 tools/probe_stream_stages.py --compile-only --variant "$v" "$@" \
            > "$OUT/prebuild/$tag-$v.log" 2>&1 &
        prebuilds+=($!)
    done
}
[[ " ${steps[*]} " == *" probes "* ]] && prebuild probes asbuilt cap2 cap4 cap6 noA Arot
[[ " ${steps[*]} " == *" aregs "* ]] && prebuild aregs asbuilt Aregs holdA Aregs-holdA
[[ " ${steps[*]} " == *" epilogue "* ]] &&
    prebuild epilogue asbuilt epiloop noepi -- --cases 4096x8-b16 1024x16-b16
failed=()
i=0
while [ $i -lt ${#steps[@]} ]; do
    step=${steps[$i]}
    i=$((i + 1))
    echo "== gpu_checks: $step ($(date -u +%H:%M:%S))"
    case "$step" in
        tier)
            # the tier's builds (one per program's op bodies) compiled first, on every core
            timeout 240 python3 tools/prebuild_bodies.py --jobs "$(nproc)" \
                > "$OUT/prebuild-bodies.log" 2>&1
            grep "^prebuild_bodies" "$OUT/prebuild-bodies.log"
            timeout --kill-after=20 400 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
                --durations=15 tests benchmarks/test_gpu_benchmarks.py --benchmark-disable \
                > "$OUT/tier.log" 2>&1
            rc=$?
            grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tier.log" | tail -n 12
            ;;
        sanitize)
            LOGDIR="$OUT/san" SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-110} timeout 400 \
                tools/sanitize.sh > "$OUT/sanitize.log" 2>&1
            rc=$?
            tail -n 6 "$OUT/sanitize.log"
            ;;
        report)
            baseline=${steps[$i]:-}
            i=$((i + 1))
            if [ -z "$baseline" ] || [ ! -f "$baseline" ]; then
                echo "gpu_checks: report needs a baseline results JSON, got '$baseline'"
                rc=2
            else
                timeout 500 python3 -m benchmarks.report --baseline "$baseline" \
                    --out-dir "$OUT/bench" > "$OUT/report.log" 2>&1
                rc=$?
                tail -n 3 "$OUT/report.log"
            fi
            ;;
        probes)
            [ ${#prebuilds[@]} -gt 0 ] && wait "${prebuilds[@]}"
            {
                timeout 300 python3 tools/probe_stream_stages.py \
                    --variant asbuilt cap2 cap4 cap6 noA Arot &&
                timeout 120 python3 tools/probe_stream_stages.py --cases 1024x16-b16 \
                    --parts 1 8 &&
                timeout 200 python3 tools/probe_weight_stream.py --shapes
            } > "$OUT/probes.log" 2>&1
            rc=$?
            tail -n 5 "$OUT/probes.log"
            ;;
        callpath)
            logged callpath.log 200 python3 tools/probe_run_steps.py
            rc=$?
            ;;
        fence)
            logged fence.log 200 python3 tools/probe_fence_load.py --out "$OUT/fence.json"
            rc=$?
            ;;
        fencecp)
            logged fencecp.log 200 python3 tools/probe_fence_load.py --copies cpasync \
                --mech acquire,fence,red_release,chunk16 --out "$OUT/fencecp.json"
            rc=$?
            ;;
        pageleak)
            logged pageleak.log 300 python3 tools/probe_page_leak.py --rounds 3
            rc=$?
            ;;
        l2stream)
            logged l2stream.log 200 python3 tools/probe_l2_stream.py
            rc=$?
            ;;
        issuers)
            logged issuers.log 200 python3 tools/probe_issuers.py
            rc=$?
            ;;
        epilogue)
            [ ${#prebuilds[@]} -gt 0 ] && wait "${prebuilds[@]}"
            {
                timeout 240 python3 tools/probe_stream_stages.py --variant asbuilt epiloop \
                    noepi --cases 4096x8-b16 1024x16-b16
            } > "$OUT/epilogue.log" 2>&1
            rc=$?
            grep -v "per us" "$OUT/epilogue.log" | tail -n 12
            ;;
        tailcode)
            logged tailcode.log 100 python3 tools/probe_icache.py
            rc=$?
            ;;
        aregs)
            [ ${#prebuilds[@]} -gt 0 ] && wait "${prebuilds[@]}"
            timeout 400 python3 tools/probe_stream_stages.py --variant asbuilt Aregs holdA \
                Aregs-holdA > "$OUT/aregs.log" 2>&1
            rc=$?
            grep -v "per us" "$OUT/aregs.log" | tail -n 16 | cut -c1-300
            ;;
        achunks)
            logged achunks.log 150 python3 tools/probe_a_chunks.py
            rc=$?
            ;;
        modload)
            logged modload.log 120 python3 tools/probe_module_load.py
            rc=$?
            ;;
        tests)
            if [ -z "${GPU_TESTS:-}" ]; then
                echo "gpu_checks: the tests step runs \$GPU_TESTS: name the tests there"
                rc=2
            else
                # shellcheck disable=SC2086  # a list of paths and node ids
                timeout 200 python3 tools/prebuild_bodies.py --jobs "$(nproc)" $GPU_TESTS \
                    > "$OUT/prebuild-tests.log" 2>&1
                grep "^prebuild_bodies" "$OUT/prebuild-tests.log"
                # shellcheck disable=SC2086
                timeout --kill-after=20 400 python3 -m pytest -q -m gpu -p no:cacheprovider \
                    -rfE --benchmark-disable $GPU_TESTS > "$OUT/tests.log" 2>&1
                rc=$?
                grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -n 12
            fi
            ;;
        ab)
            # shellcheck disable=SC2086  # $AB_ROWS: a list of rows
            logged ab.log 500 python3 tools/ab_trees.py run --json "$OUT/ab.json" \
                --rounds "${AB_ROUNDS:-2}" ${AB_ROWS:+--rows $AB_ROWS} > /dev/null
            rc=$?
            grep '^|' "$OUT/ab.log"   # the table
            ;;
        *)
            echo "gpu_checks: unknown step '$step' (tier, sanitize, report BASELINE, probes," \
                 "callpath, fence, fencecp, pageleak, l2stream, issuers, epilogue, tailcode," \
                 "achunks, aregs, modload, tests, ab)"
            rc=2
            ;;
    esac
    [ "$rc" -ne 0 ] && failed+=("$step")
done
pack_out
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_checks: FAILED: ${failed[*]} (logs in $OUT)"
    exit 1
fi
echo "gpu_checks: PASS (logs in $OUT)"
