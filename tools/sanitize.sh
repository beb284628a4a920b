#!/usr/bin/env bash
# Run tools/sanitize_graph.py (a small gemm -> transpose -> copy graph, checked against
# float64) under compute-sanitizer: memcheck (+ leak check), racecheck, synccheck.
#
#   tools/sanitize.sh [sanitize_graph.py args...]
#
# Environment: PYTHON (python3), COMPUTE_SANITIZER (found on PATH or in /usr/local/cuda/bin),
# TOOLS ("memcheck racecheck synccheck"; initcheck works too), SANITIZE_TIMEOUT (seconds per
# tool, 900), LOGDIR (a fresh temp dir), STRICT=1 (racecheck warnings fail too).
#
# Exits non-zero when the plain run or any tool reports an error, times out, or does not
# finish with its summary line and the script's PASS.
set -uo pipefail  # no -e: every tool runs, the verdict comes at the end
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer \
    || echo /usr/local/cuda/bin/compute-sanitizer)}
TOOLS=${TOOLS:-"memcheck racecheck synccheck"}
LIMIT=${SANITIZE_TIMEOUT:-900}
LOGDIR=${LOGDIR:-$(mktemp -d -t megak-sanitize.XXXXXX)}
STRICT=${STRICT:-0}
SAN_ERROR=86  # --error-exitcode: distinct from the script's own 1 (mismatch) and 2 (failure)
export CUDA_PYTHON_DISABLE_VERSION_CHECK=1
mkdir -p "$LOGDIR"

if [ ! -x "$SAN" ]; then
    echo "sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2
    exit 2
fi
echo "sanitize: $("$SAN" --version | tail -n 1); logs in $LOGDIR"
failed=()

# 0. a plain run: correctness first, and it leaves the cubin in the compile cache so the
#    sanitized runs do not spend their time in NVRTC
timeout --kill-after=30 "$LIMIT" "$PY" tools/sanitize_graph.py "$@" 2>&1 | tee "$LOGDIR/plain.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ] || ! grep -q "^sanitize_graph: PASS" "$LOGDIR/plain.log"; then
    echo "sanitize: plain run FAILED (exit $rc)"
    failed+=(plain)
fi

# wgmma checks exist only in newer sanitizers: ask for them where they are known
wgmma=()
if "$SAN" --help 2>/dev/null | grep -q -- "--check-warpgroup-mma"; then
    wgmma=(--check-warpgroup-mma yes)
fi

summaries=()
for tool in $TOOLS; do
    log="$LOGDIR/$tool.log"
    # --report-api-errors no: cuda-bindings probes the driver for entry points a 13.0 driver
    # lacks (cuGetProcAddress -> CUDA_ERROR_INVALID_VALUE); those host-side probes are not
    # memory or synchronisation errors of the megakernel, and every real API failure is
    # already raised by the runtime itself.
    flags=(--tool "$tool" --error-exitcode "$SAN_ERROR" --print-limit 100
           --report-api-errors no)
    case "$tool" in
        memcheck) flags+=(--leak-check full ${wgmma[@]+"${wgmma[@]}"}) ;;
        racecheck) flags+=(--racecheck-report all) ;;
        synccheck) flags+=(${wgmma[@]+"${wgmma[@]}"}) ;;
    esac
    echo "sanitize: $SAN ${flags[*]} $PY tools/sanitize_graph.py $*"
    timeout --kill-after=30 "$LIMIT" "$SAN" "${flags[@]}" "$PY" tools/sanitize_graph.py "$@" \
        >"$log" 2>&1
    rc=$?
    # the sanitizer's own verdict lines, e.g.
    #   ========= ERROR SUMMARY: 0 errors
    #   ========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
    summary=$(grep -E "(ERROR|RACECHECK|LEAK) SUMMARY" "$log" | sed 's/^=* *//' | paste -sd ';' -)
    errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$log" | grep -oE "[0-9]+" | tail -n 1)
    race_errors=$(grep -oE "RACECHECK SUMMARY: .*\(([0-9]+) errors?" "$log" \
        | grep -oE "\(([0-9]+) error" | grep -oE "[0-9]+" | tail -n 1)
    race_warnings=$(grep -oE "[0-9]+ warnings?\)" "$log" | grep -oE "[0-9]+" | tail -n 1)
    verdict=ok
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        verdict="TIMEOUT after ${LIMIT}s"
    elif [ "$rc" -eq "$SAN_ERROR" ]; then
        verdict="ERRORS reported"
    elif [ "$rc" -ne 0 ]; then
        verdict="FAILED (exit $rc)"
    elif [ -z "$summary" ]; then
        verdict="FAILED (no summary line)"
    elif [ "${errors:-0}" -ne 0 ] || [ "${race_errors:-0}" -ne 0 ]; then
        verdict="ERRORS reported"
    elif [ "$STRICT" = 1 ] && [ "${race_warnings:-0}" -ne 0 ]; then
        verdict="WARNINGS reported (STRICT=1)"
    elif ! grep -q "^sanitize_graph: PASS" "$log"; then
        verdict="FAILED (no PASS from sanitize_graph.py)"
    fi
    line="$tool: $verdict: ${summary:-no summary}"
    summaries+=("$line")
    echo "sanitize: $line"
    if [ "$verdict" != ok ]; then
        failed+=("$tool")
        grep -E "^=========" "$log" | head -n 60
    fi
done

echo "sanitize: ---- summary ----"
for line in ${summaries[@]+"${summaries[@]}"}; do echo "  $line"; done
if [ "${#failed[@]}" -ne 0 ]; then
    echo "sanitize: FAILED: ${failed[*]} (logs in $LOGDIR)"
    exit 1
fi
echo "sanitize: PASS"
