"""First-call latency of new request signatures on the triton backend, each scenario in a fresh process.

Per scenario: a fresh Python process with an empty Triton cache directory (cold: everything
compiles), then the same scenario in another fresh process reusing that directory (warm disk cache:
what a second run, or a run after ``attnhub warmup``, pays). Printed per call: seconds (from the call
to the synchronised result, so a compile counts) and the kernels compiled in the process so far.

Scenarios (bfloat16, D = 128, B = 1, H = 16; forward, as a user's first call):
  dense    causal L = 4096
  lk-move  causal Lq = 1777: Lk = 1001, then Lk = 1777 (the second call should compile nothing)
  lq-move  full Lk = 1777: Lq = 1, then Lq = 300 (decode, then prefill: two kernels by design),
           then Lq = 1000 (prefill again: nothing new)

    python tools/dev/first_call.py [--scenarios dense,lk-move,lq-move] [--grad]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SCENARIOS = {
    "dense": [("causal", 4096, 4096)],
    "lk-move": [("causal", 1777, 1001), ("causal", 1777, 1777)],
    "lq-move": [("full", 1, 1777), ("full", 300, 1777), ("full", 1000, 1777)],
}


def child(name: str, grad: bool) -> None:
    t0 = time.perf_counter()
    import torch

    import attnhub
    from attnhub_backends.triton import loader

    mod = loader.kernels(interpret=False)
    kernels = [
        getattr(mod, n)
        for n in ("fwd_kernel", "combine_kernel", "bwd_prep_kernel", "dkdv_kernel", "dq_kernel")
    ]

    def compiled() -> int:
        return sum(len(c[0]) for k in kernels for c in k.device_caches.values())

    torch.zeros(1, device="cuda")  # CUDA context outside the timings
    rows = [{"import_s": round(time.perf_counter() - t0, 3)}]
    for rule, nq, nk in SCENARIOS[name]:
        q = torch.randn(1, 16, nq, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        k = torch.randn(1, 16, nk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        v = torch.randn(1, 16, nk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        mask = attnhub.Causal() if rule == "causal" else None
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = attnhub.attention(q, k, v, mask=mask, backend="triton")
        if grad:
            out.sum().backward()
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        t = time.perf_counter()
        attnhub.attention(q, k, v, mask=mask, backend="triton")
        torch.cuda.synchronize()
        rows.append(
            {"call": f"{rule} Lq={nq} Lk={nk}", "first_s": round(first, 3),
             "second_s": round(time.perf_counter() - t, 4), "compiled_so_far": compiled()}
        )  # fmt: skip
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--grad", action="store_true", help="forward and backward")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.grad)
        return
    for name in args.scenarios.split(","):
        with tempfile.TemporaryDirectory() as cache:
            for state in ("cold", "warm"):
                env = dict(os.environ, TRITON_CACHE_DIR=cache)
                cmd = [sys.executable, __file__, "--child", name] + (["--grad"] if args.grad else [])
                t = time.perf_counter()
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                wall = time.perf_counter() - t
                if done.returncode:
                    print(f"{name} {state}: failed\n{done.stderr[-3000:]}")
                    continue
                rows = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{name} {state} (process {wall:.1f} s, imports {rows[0]['import_s']} s)")
                for r in rows[1:]:
                    print(f"  {r['call']:<24} first {r['first_s']:7.3f} s  second {r['second_s'] * 1e3:7.2f} ms  "
                          f"kernels compiled so far {r['compiled_so_far']}")  # fmt: skip


if __name__ == "__main__":
    main()
