#!/bin/bash
# Session 4, round 9 (H100): full certification of the triton backend after this session's kernel
# changes (no-lse forward, TMA ragged forward with in-kernel padded rows, decode short config).
set -u
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s4r9
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/pip.log 2>&1
timeout 560 python3 -m attnhub.cli certify triton --device cuda -j 16 --seed 20261124 --report "$OUT/triton-h100-full" > "$OUT/cert.log" 2>&1
echo "certify rc=$?"; grep -iE "certified|FAIL|cases" "$OUT/cert.log" | tail -5
