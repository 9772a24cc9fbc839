#!/bin/bash
# Why was the compile-latency branch's backward slower? Trees under .ab/ (git archive + setup.py):
#   A = before the branch (call-time tuning), A0 = A with ATTNHUB_TRITON_TUNE=0 (defaults only),
#   B = the branch (lengths unspecialised, no call-time tuning), C = B with Nq/Nk specialised again.
# Dense triton fwd+bwd against cuDNN (drift reference), then first-call latency on B and C.
# Runs each tree from /tmp so that the repository root's attnhub/ is not imported instead.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
export PYTHONUNBUFFERED=1
OUT="${OUT:-$ROOT/gpu-out}"; mkdir -p "$OUT"
run() {  # run TAG TREE [ENV...]
  tag=$1; tree=$2; shift 2
  python3 -m pip install -q --no-deps --no-build-isolation -e "$ROOT/$tree" >> "$OUT/install.log" 2>&1 || echo "install $tag failed"
  (cd /tmp && env "$@" timeout 115 python3 -m attnhub.cli bench --backends triton --peers sdpa-cudnn --family dense \
    --direction fwd,bwd --lengths 4096,16384 --out "/tmp/bench-$tag" > "$OUT/$tag.log" 2>&1)
  echo "== $tag rc=$?"; grep -E "^\|" "$OUT/$tag.log" | head -40
}
run A .ab/A
run A0 .ab/A ATTNHUB_TRITON_TUNE=0
run B .ab/B
run C .ab/C
for t in B C; do
  python3 -m pip install -q --no-deps --no-build-isolation -e "$ROOT/.ab/$t" >> "$OUT/install.log" 2>&1
  echo "== first_call $t"; (cd /tmp && timeout 50 python3 "$ROOT/.ab/$t/tools/dev/first_call.py" --scenarios dense,lk-move,lq-move 2>&1 | tail -20)
done
python3 -m pip install -q --no-deps --no-build-isolation -e "$ROOT" >> "$OUT/install.log" 2>&1
