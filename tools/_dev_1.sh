#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CUDA_PYTHON_DISABLE_VERSION_CHECK=1 XDG_CACHE_HOME=$PWD/build/xdg
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
timeout 300 python3 -m pytest -q -m gpu -x tests/runtime/test_packed_weights.py tests/ops/test_gemm_stream.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log
tail -3 $OUT/tests.log
timeout 260 python3 -m benchmarks.report --only W2-1024x16-bf16 W2-4096x8-bf16 W2-4096x8-bf16-b1 W2-4096x8-bf16-b64 W2-8192x8-bf16 --out-dir $OUT/bench > $OUT/report.log 2>&1
echo "report rc $?"
grep -E "/megak:|/megak_const:|/torch_graph:" $OUT/report.log
