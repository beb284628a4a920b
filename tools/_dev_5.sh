#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CUDA_PYTHON_DISABLE_VERSION_CHECK=1 XDG_CACHE_HOME=$PWD/build/xdg
OUT=$OUT MEGAK_COMMIT=$1 timeout 585 tools/gpu_checks.sh tier sanitize report benchmarks/results/in-turn/nvidia-h200-2026-12-04.json > $OUT/gpu_checks.log 2>&1
echo "rc $?"
grep -E "passed|failed" $OUT/tier.log | tail -2
tail -4 $OUT/sanitize.log 2>/dev/null
grep -E "W2.*/megak:|/megak_const:|W2.*/torch_graph:|W7.*megak_run:|W7.*megak_resident:" $OUT/report.log | head -30
