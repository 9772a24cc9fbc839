#!/bin/bash
# Session 5, round 7 (H100): the triton backend certified in full after this session's kernel
# changes (softcap tiles, decode splits, vector bias/mask loads, pointer bias forwards, SWAP_HB).
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s5r7
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 575 python3 -m attnhub.cli certify triton --device cuda -j 16 --seed 20261124 --report "$OUT/triton-h100-full" > "$OUT/cert.log" 2>&1
echo "certify rc=$?"; grep -iE "certified|FAIL|cases" "$OUT/cert.log" | tail -5
