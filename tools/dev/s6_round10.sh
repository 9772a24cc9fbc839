#!/bin/bash
# Session 6, round 10 (H100): the triton backend certified in full after the softcap forward change.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r10
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 570 python3 -m attnhub.cli certify triton --device cuda -j 16 --seed 20261124 --report "$OUT/triton-h100-full" > "$OUT/cert.log" 2>&1
echo "cert rc=$?"; grep -v -i warn "$OUT/cert.log" | tail -15
