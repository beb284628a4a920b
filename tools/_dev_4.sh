#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CUDA_PYTHON_DISABLE_VERSION_CHECK=1 XDG_CACHE_HOME=$PWD/build/xdg
OUT=$OUT MEGAK_COMMIT=$1 timeout 570 tools/gpu_checks.sh sanitize report benchmarks/results/in-turn/nvidia-h200-2026-12-04.json > $OUT/gpu_checks.log 2>&1
echo "rc $?"
tail -5 $OUT/sanitize.log 2>/dev/null
grep -E "/megak:|/megak_const:|/torch_graph:|/megak_run:|/megak_resident:" $OUT/report.log | head -40
