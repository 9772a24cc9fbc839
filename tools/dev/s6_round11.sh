#!/bin/bash
# Session 6, round 11 (H100): the softcap bench family against FlexAttention at the final tree, and
# the GPU tests of the triton kernels, CUDA graphs, compile counts, host path, SDPA backends and the
# tiny Hugging Face models.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r11
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 150 python3 -m attnhub.cli bench --backends triton --peers flex --family softcap --direction fwd,bwd \
  --out /tmp/bench-sc > "$OUT/bench_sc.log" 2>&1
echo "bench rc=$?"; grep -v -i warn "$OUT/bench_sc.log" | grep -A9 "^case"
timeout 330 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_triton_gpu.py tests/test_triton_ragged_gpu.py \
  tests/test_cuda_graphs.py tests/test_triton_compile.py tests/test_host_path_gpu.py tests/test_transformers_gpu.py \
  tests/test_patch_sdpa_llama.py tests/test_triton_modifiers_gpu.py tests/test_triton_mask_forms.py tests/test_fast_path.py \
  tests/test_sdpa_backends.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests.log" | tail -12
