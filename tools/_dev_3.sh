#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CUDA_PYTHON_DISABLE_VERSION_CHECK=1 XDG_CACHE_HOME=$PWD/build/xdg
OUT=$OUT MEGAK_COMMIT=$1 timeout 330 tools/gpu_checks.sh tier > $OUT/gpu_checks.log 2>&1
echo "tier rc $?"
tail -4 $OUT/tier.log 2>/dev/null
grep -E "passed|failed" $OUT/gpu_checks.log | tail -3
