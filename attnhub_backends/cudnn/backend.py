"""The ``cudnn`` backend's contract with the core: what it serves, why it declines, and forward /
backward run as cuDNN graphs (:mod:`attnhub_backends.cudnn.graphs`), with torch autograd wired by
the core's glue (``forward_for_grad``/``backward``, as the cuda and triton backends do).

Certified in full on the H200 (cuDNN 9.19, frontend 1.32; docs/backends/cudnn.md has what the GPU
runs measured).
"""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

from attnhub.backend import Backend
from attnhub.request import Request
from attnhub_backends.cudnn import graphs, scope

#: Oldest frontend whose ``sdpa`` takes every argument used here (``generate_stats`` came with
#: v1.13/1.14, ``diagonal_alignment``/``diagonal_band_right_bound`` with v1.10; git history of
#: python/pygraph/sdpa.cpp). Only 1.32's sources were read against this code.
MIN_FRONTEND = (1, 14)
#: Oldest cuDNN runtime taken: 9.6.0 lifts the "bottom right causal mask is only supported with
#: s_q and s_kv multiples of 64" limit (sdpa_support_surface.h).
MIN_CUDNN = 90600
#: Runtimes the frontend itself refuses for fp16/bf16 SDPA ("known bugs").
BROKEN_CUDNN = {91000: "9.10.0", 91001: "9.10.1"}

#: Plain calls from this many FLOPs take longer on the GPU than this backend's call on the host
#: (~37 us against SDPA's ~17 us, H200, tools/dev/cudnn_execute_cost.py): 2e10 FLOPs is ~40 us at
#: 500 TFLOP/s.
HEAVY_CALL_FLOPS = 2e10

_INSTALL = "pip install 'attnhub[cudnn]' (the nvidia-cudnn-frontend package)"


def runtime_reason(cudnn: Any) -> str | None:
    """None when the imported ``cudnn`` module and the cuDNN library it loaded are recent enough,
    else why not (a separate function so that tests can hand it a stand-in module)."""
    version = str(getattr(cudnn, "__version__", "0"))
    try:
        parts = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        parts = (0, 0)
    if parts < MIN_FRONTEND:
        want = ".".join(map(str, MIN_FRONTEND))
        return f"nvidia-cudnn-frontend {version} is too old (needs >= {want}): {_INSTALL}"
    try:
        runtime = int(cudnn.backend_version())
    except Exception as exc:
        return f"the cuDNN library could not be loaded ({type(exc).__name__}: {exc}); install cuDNN 9 (nvidia-cudnn-cu12 or -cu13)"
    if runtime < MIN_CUDNN:
        return f"cuDNN {_dotted(runtime)} is too old: the cudnn backend needs cuDNN >= {_dotted(MIN_CUDNN)}"
    if runtime in BROKEN_CUDNN:
        return f"cuDNN {BROKEN_CUDNN[runtime]} has known SDPA bugs (its frontend refuses fp16/bf16 SDPA there); upgrade cuDNN"
    return None


def _dotted(v: int) -> str:
    """90600 -> "9.6.0" (cuDNN 9 encodes major*10000 + minor*100 + patch)."""
    return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


def _device_index(req: Request) -> int:
    """The CUDA device index of ``req`` ("cuda:N", or the current device for "cuda")."""
    _, _, index = req.device.partition(":")
    if index:
        return int(index)
    import torch

    return torch.cuda.current_device()


def _dense(x: Any) -> Any:
    """``x`` as the graphs declare it: exactly the row-major strides of (B, H, S, D), 16-byte
    aligned (a copy otherwise; the caller's tensor is never written).

    ``is_contiguous()`` is not enough: torch calls a tensor contiguous whatever the stride of a
    size-1 dim (a bshd view with Lq = 1 or H = 1 is), while the graph declares the row-major one.
    cuDNN's own engines read only the pointer, but frontend 1.32's variant pack describes a torch
    tensor by its own strides (cudnn/_pygraph.py, ``_describe``: "A buffer with the declared extents
    but its own strides ... keeps its own description; the engine decides"), so a frontend (python)
    engine would see a layout the graph never declared."""
    import torch

    if x.stride() == graphs.row_major(tuple(x.shape)) and x.data_ptr() % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


class Cudnn(Backend):
    """Dense scaled-dot-product attention through cuDNN's SDPA graphs (fp16/bf16, torch CUDA)."""

    name: ClassVar[str] = "cudnn"
    # Above sdpa-cudnn (42): the same library with its own engine choice, measured 1.0-1.09x
    # torch's cuDNN path on the H200 bf16 grid (benchmarks/auto_dispatch.py, 2026-11-28). Its call
    # costs ~20 us more host time (the frontend's execute), so below HEAVY_CALL_FLOPS the prior
    # tries the sdpa backends first (Backend.heavy_calls_from).
    priority: ClassVar[int] = 43
    heavy_calls_from: ClassVar[float] = HEAVY_CALL_FLOPS
    vendor: ClassVar[bool] = True
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    dtypes: ClassVar[tuple[str, ...]] = ("float16", "bfloat16")
    features: ClassVar[frozenset[str]] = frozenset(
        {"1d", "full", "causal", "local", "gqa", "lse", "backward"}
    )
    max_head_dim: ClassVar[int | None] = scope.MAX_HEAD_DIM
    requires: ClassVar[tuple[str, ...]] = ("torch", "nvidia-cudnn-frontend")
    builds_per_shape: ClassVar[bool] = True  # one cuDNN graph per request signature (graphs.py)

    def availability(self) -> str | None:
        # find_spec first: neither torch nor cudnn is imported to say that one is missing.
        if importlib.util.find_spec("torch") is None:
            return f"needs torch with CUDA and the cuDNN frontend: {_INSTALL}"
        if importlib.util.find_spec("cudnn") is None:
            return f"needs NVIDIA's cuDNN frontend (import name cudnn): {_INSTALL}"
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU is visible to torch"
        try:
            import cudnn
        except Exception as exc:
            return (
                f"the cudnn package failed to import ({type(exc).__name__}: {exc}); reinstall it: {_INSTALL}"
            )
        return runtime_reason(cudnn)

    def version(self) -> str | None:
        try:
            import cudnn

            return f"cudnn-frontend {cudnn.__version__}, cuDNN {graphs.version_string()}"
        except Exception:  # pragma: no cover - shown by availability()
            return None

    def extra_reasons(self, req: Request) -> list[str]:
        return scope.reasons(req)

    def late_reasons(self, req: Request) -> list[str]:
        """cuDNN's own verdict on the request's graph(s), built now and cached for the call that
        follows: milliseconds for each new shape, so dispatch asks it only when about to choose
        cudnn (:meth:`Backend.late_reasons`).

        Never for an empty request (B, H, Lq or Dv = 0, or Lk = 0), which the core answers without
        calling the backend (SPEC §7) and whose graph would have zero extents; the static reasons
        (:meth:`Backend.check`, with :func:`scope.reasons`) come first, so no graph is built for a
        head dim over 256 or another framework's arrays."""
        if req.is_empty or self.availability():
            return []
        return self._cudnn_reasons(req)

    def _cudnn_reasons(self, req: Request) -> list[str]:
        import torch

        device = _device_index(req)
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            return [
                f"cuDNN's fp16/bf16 SDPA needs compute capability 8.0 or newer, {req.device} has {major}.{minor}"
            ]
        # cuDNN's own verdict for this exact graph (built now and cached for the call that follows).
        for kind in ("fwd", "bwd") if req.needs_grad else ("fwd",):
            got = graphs.for_request(req, kind, req.return_lse or req.needs_grad, device)
            if isinstance(got, str):
                return [f"{got}; {scope.ELSEWHERE}"]
        return []

    def note(self, req: Request) -> str | None:
        align = scope.alignment(req)
        rule = type(req.rule).__name__.lower()
        parts = [
            f"{rule} {align.replace('_', '-')}" if align else "",
            "GQA" if req.heads_q != req.heads_kv else "",
        ]
        return ", ".join(p for p in parts if p) or None

    def bind(self, req: Request) -> Any:
        """``fn(q, k, v, mask) -> (out, None)`` for a forward that needs no gradient and no lse,
        with the graph, device and output shape decided once (the core's fast path for plain
        requests, attnhub/fastpath.py): per call only the strides are checked and out allocated."""
        if req.needs_grad or req.return_lse or req.scale < 0:
            return None
        import torch

        device = _device_index(req)
        built = _built(req, "fwd", False, device)
        b, hq, hkv, nq, nk = req.batch, req.heads_q, req.heads_kv, req.nq, req.nk
        shape = (b, hq, nq, req.dim_v)
        # The row-major strides the graph declares: a call whose tensors have them (and 16-byte
        # aligned bases) is bound as it is, any other goes through _dense (a copy).
        want = (graphs.row_major((b, hq, nq, req.dim_qk)), graphs.row_major((b, hkv, nk, req.dim_qk)),
                graphs.row_major((b, hkv, nk, req.dim_v)))  # fmt: skip
        execute, empty = graphs.execute, torch.empty

        def fn(q: Any, k: Any, v: Any, mask: Any) -> tuple[Any, Any]:
            if (q.stride(), k.stride(), v.stride()) != want or (
                q.data_ptr() | k.data_ptr() | v.data_ptr()
            ) % 16:
                q, k, v = _dense(q), _dense(k), _dense(v)
            out = empty(shape, dtype=q.dtype, device=q.device)
            execute(built, (q, k, v, out), device)
            return out, None

        # out is allocated here with the plan's shape, dtype and device: checked on the first call.
        fn.fixed_result = True  # type: ignore[attr-defined]
        return fn

    def forward(
        self, q: Any, k: Any, v: Any, req: Request, mask: Any = None, operands: Any = None
    ) -> tuple[Any, Any]:
        """(out, lse): lse (B, Hq, Nq) float32 when the request returns it or will differentiate
        (the backward reads it), else None (the core never hands it out then)."""
        import torch

        stats = req.return_lse or req.needs_grad
        device = _device_index(req)
        built = _built(req, "fwd", stats, device)
        qx = _dense(torch.neg(q) if req.scale < 0 else q)  # -q · k with -scale: the same logits
        b, hq, nq = req.batch, req.heads_q, req.nq
        out = torch.empty((b, hq, nq, req.dim_v), dtype=q.dtype, device=q.device)
        if not stats:
            graphs.execute(built, (qx, _dense(k), _dense(v), out), device)
            return out, None
        lse = torch.empty((b, hq, nq, 1), dtype=torch.float32, device=q.device)
        graphs.execute(built, (qx, _dense(k), _dense(v), out, lse), device)
        return out, lse.view(b, hq, nq)

    def backward(
        self,
        q: Any,
        k: Any,
        v: Any,
        out: Any,
        lse: Any,
        dout: Any,
        req: Request,
        mask: Any = None,
        operands: Any = None,
        dlse: Any = None,
    ) -> tuple[Any, Any, Any]:
        """(dq, dk, dv) from cuDNN's SDPA backward graph, which reads the forward's O (in the input
        dtype) and Stats; GQA's dk, dv come back summed over each kv head's query heads."""
        import torch

        if lse is None:
            raise RuntimeError("cudnn backward needs the forward's lse (Stats), which was not kept")
        device = _device_index(req)
        built = _built(req, "bwd", True, device)
        negate = req.scale < 0
        qx = _dense(torch.neg(q) if negate else q)
        o = out if out.dtype == q.dtype else out.to(q.dtype)  # a float32 copy from torch.compile's op
        b, hq, nq = req.batch, req.heads_q, req.nq
        stats = lse.reshape(b, hq, nq, 1)
        dq = torch.empty(qx.shape, dtype=q.dtype, device=q.device)
        dk = torch.empty(tuple(k.shape), dtype=k.dtype, device=k.device)
        dv = torch.empty(tuple(v.shape), dtype=v.dtype, device=v.device)
        buffers = (qx, _dense(k), _dense(v), _dense(o), _dense(dout), _dense(stats.float()), dq, dk, dv)
        graphs.execute(built, buffers, device)  # in graphs.BWD_NAMES order
        return (dq.neg_() if negate else dq), dk, dv


def _built(req: Request, kind: str, stats: bool, device: int) -> graphs.Built:
    got = graphs.for_request(req, kind, stats, device)
    if isinstance(got, str):  # check() would have declined; a direct call reaches here
        raise RuntimeError(got)
    return got
