#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CUDA_PYTHON_DISABLE_VERSION_CHECK=1 XDG_CACHE_HOME=$PWD/build/xdg
timeout 200 python3 -m pytest -q -m gpu -x tests/runtime/test_packed_weights.py tests/ops/test_gemm_stream.py -p no:cacheprovider > $OUT/tests.log 2>&1
echo "tests rc $?" >> $OUT/tests.log
tail -2 $OUT/tests.log
timeout 380 python3 tools/ab_trees.py run --names main x --rounds 2 --rows W2-4096x8-bf16 W2-4096x8-bf16-b64 W2-8192x8-bf16 W2-1024x16-bf16 W2-4096x8-bf16+const W2-4096x8-bf16-b64+const W2-8192x8-bf16+const --json $OUT/ab.json > $OUT/ab.log 2>&1
echo "ab rc $?"
tail -12 $OUT/ab.log
