#!/bin/bash
# Session 6, round 5 (H100): dq added by the dk/dv kernel through TMA reduce-adds (descriptor
# atomic_add into float32) against the dq kernel, dense and real-model backward cases.
set -u
export PYTHONUNBUFFERED=1 ATTNHUB_CACHE_DIR=/tmp/ah-s6r5
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip.log" 2>&1; echo "pip rc=$?"
timeout 400 python3 tools/dev/probe_s6.py --part tmadq --dkdv "default 64,128,8,3 128,128,8,2 128,64,8,2" > "$OUT/tmadq.log" 2>&1
echo "tmadq rc=$?"; grep -v -i warn "$OUT/tmadq.log" | cut -c1-400
