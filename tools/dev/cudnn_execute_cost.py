"""Host time of one cuDNN SDPA graph execution through nvidia-cudnn-frontend, by way of binding.

    python tools/dev/cudnn_execute_cost.py [--calls 2000]

The cudnn backend's whole call (``attnhub.attention(..., backend="cudnn")``) cost ~60 us of host
time per call on the H200 (benchmarks/host_overhead.py, 2026-11-28) against ~16 us for torch's
own SDPA cuDNN path. This times, on a small causal fp16 graph (1, 8, 128, 128, 64) whose kernel
takes a few us, each way of handing the frontend its buffers: the backend's ``graphs.execute``
(tensor-keyed dict, stream set per call), ``graph.execute`` with a tensor-keyed dict, a uid-keyed
dict of torch tensors, a uid-keyed dict of raw pointers, and the ordered form (``tensor_uids=``)
with tensors and with pointers; plus ``cudnn.set_stream`` and the backend's forward alone.
"""

from __future__ import annotations

import argparse
import time

import cudnn
import torch

import attnhub
from attnhub_backends.cudnn import graphs


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    q, k, v = (torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    attnhub.attention(q, k, v, mask="causal", backend="cudnn")
    (built,) = [b for b in graphs._GRAPHS.values() if not isinstance(b, str)]
    g, t = built.graph, built.tensors
    out = torch.empty_like(q)
    bound = {"q": q, "k": k, "v": v, "o": out}
    h = graphs.handle(0)
    ws = graphs.workspace(0, torch.cuda.current_stream(), built.workspace)
    by_tensor = {t[n]: x for n, x in bound.items()}
    uids = {n: t[n].get_uid() for n in bound}
    by_uid = {uids[n]: x for n, x in bound.items()}
    by_ptr = {uids[n]: x.data_ptr() for n, x in bound.items()}
    order = tuple(uids[n] for n in bound)
    tensors, ptrs = tuple(bound.values()), tuple(x.data_ptr() for x in bound.values())
    stream = torch.cuda.current_stream().cuda_stream
    cases = {
        "attnhub.attention(backend='cudnn')": lambda: attnhub.attention(
            q, k, v, mask="causal", backend="cudnn"
        ),
        "torch SDPA (is_causal)": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True
        ),
        "graphs.execute (backend's binding)": lambda: graphs.execute(built, bound, 0),
        "cudnn.set_stream": lambda: cudnn.set_stream(h, stream),
        "execute({Tensor: torch})": lambda: g.execute(by_tensor, ws, handle=h),
        "execute({uid: torch})": lambda: g.execute(by_uid, ws, handle=h),
        "execute({uid: ptr})": lambda: g.execute(by_ptr, ws, handle=h),
        "execute(tensors, tensor_uids=)": lambda: g.execute(tensors, ws, handle=h, tensor_uids=order),
        "execute(ptrs, tensor_uids=)": lambda: g.execute(ptrs, ws, handle=h, tensor_uids=order),
        "execute(ptrs, ws ptr, tensor_uids=)": lambda: g.execute(
            ptrs, ws.data_ptr(), handle=h, tensor_uids=order
        ),
    }
    print(
        f"{torch.cuda.get_device_name()}, frontend {cudnn.__version__}, cuDNN {cudnn.backend_version()}; plan {built.plan}"
    )
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for name, fn in cases.items():
        try:
            us = per_call_us(fn, args.calls)
        except Exception as exc:  # noqa: BLE001 - a binding this frontend refuses is reported
            print(f"{name:40s} failed: {type(exc).__name__}: {str(exc)[:150]}")
            continue
        err = (out.float() - want.float()).abs().max().item() if name.startswith("execute") else 0.0
        print(f"{name:40s} {us:7.1f} us/call   (out max diff vs SDPA {err:.2e})", flush=True)
        out.zero_()


if __name__ == "__main__":
    main()
