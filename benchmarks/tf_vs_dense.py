"""The ``tf`` backend against the dense masked attention a TensorFlow user would write, on the CPU.

Run: ``.venv/bin/python benchmarks/tf_vs_dense.py`` (add ``--json out.json`` to keep the numbers).
Peak memory: one fresh worker process per variant (this same file with ``--worker``), traced first,
then ``VmHWM`` after a reset minus the resident size before the call. Time: one worker builds both
variants and alternates their calls, so that load on the machine hits both alike. Both variants are ``tf.function`` graphs of the same float32 inputs; the dense one gets its boolean
mask as a ready input (not timed, not counted), which favours it. Targets:
peak memory at L=8192 <= 1/4 of dense; causal time at L=4096 <= 1.0x dense; Local(w=128) time at
L=8192 <= 0.25x dense.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

B, H, D = 1, 4, 64
#: --xla: both variants under tf.function(jit_compile=True) (passed to workers through the env)
XLA = os.environ.get("ATTNHUB_BENCH_XLA") == "1"


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _rule(name: str):
    from attnhub import Causal, Full, Local

    return {"full": Full(), "causal": Causal(), "local128": Local(128)}[name]


def _build(impl: str, length: int, rule_name: str, grad: bool):
    """(tf.function, inputs) of one variant."""
    import numpy as np
    import tensorflow as tf

    import attnhub
    from attnhub.positions import dense_rule_mask

    rng = np.random.default_rng(0)
    q, k, v = (tf.constant(rng.standard_normal((B, H, length, D)), tf.float32) for _ in range(3))
    rule = _rule(rule_name)
    if impl == "dense":
        keep = tf.constant(dense_rule_mask(rule, (length,), (length,), "none_front"))

        def attend(q, k, v):
            s = tf.matmul(q, k, transpose_b=True) * (1.0 / D**0.5)
            s = tf.where(keep, s, float("-inf"))
            return tf.matmul(tf.nn.softmax(s, axis=-1), v)

    else:

        def attend(q, k, v):
            return attnhub.attention(q, k, v, mask=rule, backend="tf")

    if not grad:
        return tf.function(attend, jit_compile=XLA), (q, k, v)

    def step(q, k, v):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = attend(q, k, v)
        return out, tape.gradient(out, [q, k, v])

    return tf.function(step, jit_compile=XLA), (q, k, v)


def _call(fn, args) -> None:
    import numpy as np
    import tensorflow as tf

    for x in tf.nest.flatten(fn(*args)):
        np.asarray(x)


def worker_memory(impl: str, length: int, rule_name: str) -> dict:
    """Peak resident memory of one call, traced beforehand (a fresh process per variant)."""
    fn, args = _build(impl, length, rule_name, False)
    fn.get_concrete_function(*args)  # tracing is not part of the call's memory
    base = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:  # reset VmHWM to the current RSS
        fh.write("5")
    _call(fn, args)
    return {"impl": impl, "L": length, "rule": rule_name, "peak_extra_mib": (_rss_kib("VmHWM") - base) / 1024}


def worker_time(length: int, rule_name: str, reps: int, grad: bool) -> dict:
    """Median times of dense and tf, alternating call by call so that load noise hits both."""
    import numpy as np

    fns = {impl: _build(impl, length, rule_name, grad) for impl in ("dense", "tf")}
    for fn, args in fns.values():
        _call(fn, args)
    times: dict[str, list[float]] = {impl: [] for impl in fns}
    for _ in range(reps):
        for impl, (fn, args) in fns.items():
            t0 = time.perf_counter()
            _call(fn, args)
            times[impl].append(time.perf_counter() - t0)
    return {
        "L": length,
        "rule": rule_name,
        "grad": grad,
        **{f"{impl}_median_s": float(np.median(t)) for impl, t in times.items()},
        **{f"{impl}_all_s": t for impl, t in times.items()},
    }


def _worker(*args: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", *args]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=5, help="timed calls per variant (alternating)")
    ap.add_argument("--json", help="write all measurements to this file")
    ap.add_argument("--xla", action="store_true", help="both variants with jit_compile=True (info)")
    args = ap.parse_args()
    if args.xla:
        os.environ["ATTNHUB_BENCH_XLA"] = "1"
    if args.worker:
        kind, *rest = args.worker
        if kind == "mem":
            res = worker_memory(rest[0], int(rest[1]), rest[2])
        else:
            res = worker_time(int(rest[0]), rest[1], int(rest[2]), rest[3] == "grad")
        print(json.dumps(res))
        return
    import platform

    # Under XLA the first call compiles (its memory would count) and later calls reuse the
    # buffers of the first, so --xla measures time only.
    mem = {} if args.xla else {impl: _worker("mem", impl, "8192", "full") for impl in ("dense", "tf")}
    ratio = mem["tf"]["peak_extra_mib"] / mem["dense"]["peak_extra_mib"] if mem else float("nan")
    if mem:
        print(
            f"memory  L=8192 full       dense {mem['dense']['peak_extra_mib']:8.1f} MiB | "
            f"tf {mem['tf']['peak_extra_mib']:8.1f} MiB | {ratio:.3f}x",
            flush=True,
        )
    timed = {}
    for length, rule, mode in [(4096, "causal", "fwd"), (8192, "local128", "fwd"), (4096, "causal", "grad")]:
        r = _worker("time", str(length), rule, str(args.reps), mode)
        timed[(length, rule, mode)] = r
        print(
            f"time    L={length:5d} {rule:9s} {'fwd+bwd' if mode == 'grad' else 'fwd':7s} "
            f"dense {r['dense_median_s'] * 1e3:8.1f} ms | tf {r['tf_median_s'] * 1e3:8.1f} ms | "
            f"{r['tf_median_s'] / r['dense_median_s']:.3f}x",
            flush=True,
        )
    causal, local = timed[(4096, "causal", "fwd")], timed[(8192, "local128", "fwd")]
    checks = {
        **({} if args.xla else {"peak memory at L=8192 <= 1/4 dense": ratio <= 0.25}),
        "causal time at L=4096 <= 1.0x dense": causal["tf_median_s"] <= causal["dense_median_s"],
        "Local(w=128) time at L=8192 <= 0.25x dense": local["tf_median_s"] <= 0.25 * local["dense_median_s"],
    }
    print(
        f"B={B} H={H} D={D} float32, {os.cpu_count()} CPU cores, {platform.machine()}, reps={args.reps}"
        + (", jit_compile=True" if args.xla else "")
    )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        with open(args.json, "w") as fh:
            out = {"memory": mem, "time": [dict(v) for v in timed.values()], "checks": checks}
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
