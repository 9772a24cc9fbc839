#!/bin/bash
# A/B of kernel-source variants on the device: for each file named (a full copy of
# backends/triton/kernels.py), swap it in, check the window configs against the float64 reference
# and time them with FlexAttention in the same process (probe_fwd checkwin win; PROBE_WIN picks
# the cases and configs). The shipped kernels.py is restored at the end.
# Usage: bash scripts/device_variants.sh scratch/base.py scratch/v2.py ...
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:-gpu-out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
date -u +"start %Y-%m-%d %H:%M:%S UTC"
cp backends/triton/kernels.py "$OUT/kernels.shipped.py"
for f in "$@"; do
  name=$(basename "$f" .py)
  cp "$f" backends/triton/kernels.py
  t0=$(date +%s)
  timeout 280 python3 -m attnhub_backends.triton.probe_fwd ${PROBE_STEPS:-checkwin win} > "$OUT/var-$name.log" 2>&1
  echo "== $name rc=$? $(( $(date +%s) - t0 ))s"
  grep -E "^(RES|CHECK)" "$OUT/var-$name.log" | sed "s/^/$name /"
done
cp "$OUT/kernels.shipped.py" backends/triton/kernels.py
rm "$OUT/kernels.shipped.py"
date -u +"end %H:%M:%S UTC"
