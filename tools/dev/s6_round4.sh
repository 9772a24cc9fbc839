#!/bin/bash
# Session 6, round 4 (H100): the padding case's backward through the mask kernels (tile sweep)
# against the lengths (ragged) kernels, profiled.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r4
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 300 python3 tools/dev/probe_s6.py --part padlen --dkdv "64,64,4,2 128,64,8,2 32,128,4,2 64,128,8,3 128,128,8,2" \
  --dq "128,64,8,2 64,128,8,2 128,32,4,2 64,64,4,3" > "$OUT/padlen.log" 2>&1
echo "padlen rc=$?"; grep -v -i warn "$OUT/padlen.log"
