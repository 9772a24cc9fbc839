"""cuDNN SDPA graphs: built once per request signature, cached, and executed on torch's stream.

The API used is the cuDNN frontend's "classic" Python graph API, as its samples use it
(samples/python/50_sdpa_forward.ipynb, 51_sdpa_backward.ipynb) and as frontend 1.32's pure-Python
``cudnn.pygraph`` keeps it (cudnn/_pygraph.py: "classic pybind constructor, POSITIONALLY
IDENTICAL"): ``pygraph(io_data_type=, intermediate_data_type=, compute_data_type=, handle=)``,
``graph.tensor(name=, dim=, stride=, data_type=)``, ``graph.sdpa(q, k, v, attn_scale=,
generate_stats=, diagonal_alignment=, diagonal_band_left_bound=, diagonal_band_right_bound=)``
-> ``[O, Stats]``,
``graph.sdpa_backward(q, k, v, o, dO, stats, ...)`` -> ``[dQ, dK, dV]``, then ``validate``,
``build_operation_graph``, ``create_execution_plans([heur_mode.A, heur_mode.FALLBACK])``,
``check_support``, ``build_plans``, ``get_workspace_size`` and ``execute(buffers, workspace,
handle=, tensor_uids=)`` (the ordered binding). Run and certified on the H200: docs/backends/cudnn.md.

Every graph takes dense row-major (B, H, S, D) tensors (the backend copies other strides first),
so its key is the request's shapes, dtype, device, band (alignment and bounds), scale and whether
Stats is written. Graphs live in a bounded LRU dict; a request cuDNN refuses is cached as its reason, so a
second check does not rebuild it. One workspace buffer per (device, stream) is kept and grown to
the largest size a graph has asked for, so steady-state calls allocate nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from attnhub.request import Request
from attnhub_backends.cudnn import scope

#: Graphs kept (forward and backward count separately); the least recently used goes first.
MAX_GRAPHS = 128

_LOCK = threading.RLock()
_GRAPHS: OrderedDict[GraphKey, Built | str] = OrderedDict()
_HANDLES: dict[int, Any] = {}
_WORKSPACES: dict[tuple[int, int], Any] = {}
#: Counters for tests and ``attnhub info``-style reports: graphs built, cache hits, refusals.
STATS = {"builds": 0, "hits": 0, "refused": 0}


@dataclass(frozen=True)
class GraphKey:
    """Everything a built graph depends on (strides follow from the shapes: dense bhsd)."""

    kind: str  # "fwd" or "bwd"
    device: int
    dtype: str  # "float16" / "bfloat16"
    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_k: int
    dim_qk: int
    dim_v: int
    align: str | None  # None (Full), "top_left", "bottom_right"
    left: int | None  # the band's left bound (None: unbounded), see scope.band
    right: int | None  # its right bound (None: unbounded; Causal: 0)
    scale: float  # >= 0: a negative scale runs as (-q, -scale), see backend.py
    stats: bool  # forward: whether Stats (lse) is written; backward: always True


@dataclass
class Built:
    """A graph ready to execute, its tensors by name, and its workspace size in bytes.

    ``names`` is the order :func:`execute` takes its buffers in and ``uids`` their cuDNN uids: the
    frontend's ordered binding (``execute(buffers, tensor_uids=)``), whose per-call cost is the
    lowest of the bindings timed (tools/dev/cudnn_execute_cost.py)."""

    graph: Any
    tensors: dict[str, Any]
    workspace: int
    plan: str = field(default="")
    names: tuple[str, ...] = ()
    uids: tuple[int, ...] = ()


#: Buffer order of each graph kind (forward without and with Stats, backward).
FWD_NAMES = ("q", "k", "v", "o")
FWD_STATS_NAMES = (*FWD_NAMES, "stats")
BWD_NAMES = ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV")


def key_for(req: Request, kind: str, stats: bool, device: int) -> GraphKey:
    left, right = scope.band(req)
    return GraphKey(
        kind=kind, device=device, dtype=req.dtype, batch=req.batch, heads_q=req.heads_q,
        heads_kv=req.heads_kv, seq_q=req.nq, seq_k=req.nk, dim_qk=req.dim_qk, dim_v=req.dim_v,
        align=scope.alignment(req), left=left, right=right,
        scale=abs(float(req.scale)), stats=stats or kind == "bwd",
    )  # fmt: skip


#: Built graphs by (request, kind, stats, device): a repeated call's lookup skips building the
#: GraphKey (the request is hashable and its fields decide the key). Forgotten with :func:`clear`
#: and when it outgrows twice :data:`MAX_GRAPHS`.
_BY_REQUEST: dict[tuple[Any, ...], Built | str] = {}


def for_request(req: Request, kind: str, stats: bool, device: int) -> Built | str:
    """:func:`get` for ``req``'s graph of ``kind``, through a per-request memo."""
    memo = (req, kind, stats, device)
    found = _BY_REQUEST.get(memo)
    if found is None:
        found = get(key_for(req, kind, stats, device))
        with _LOCK:
            if len(_BY_REQUEST) >= 2 * MAX_GRAPHS:
                _BY_REQUEST.clear()
            _BY_REQUEST[memo] = found
    return found


def cached_count() -> int:
    with _LOCK:
        return sum(1 for v in _GRAPHS.values() if not isinstance(v, str))


def clear() -> None:
    """Forget every graph (and refusal); handles and workspaces stay."""
    with _LOCK:
        _GRAPHS.clear()
        _BY_REQUEST.clear()


def get(key: GraphKey) -> Built | str:
    """The built graph for ``key``, or why cuDNN refused it; built on first request."""
    with _LOCK:
        found = _GRAPHS.get(key)
        if found is not None:
            _GRAPHS.move_to_end(key)
            STATS["hits"] += 1
            return found
        try:
            built: Built | str = _build(key)
            STATS["builds"] += 1
        except Exception as exc:  # refusals: cudnnGraphNotSupportedError, ValueError, RuntimeError
            if not _is_refusal(exc):
                raise
            STATS["refused"] += 1
            built = f"cuDNN {version_string()} does not build this graph ({type(exc).__name__}: {exc})"
        _GRAPHS[key] = built
        while len(_GRAPHS) > MAX_GRAPHS:
            _GRAPHS.popitem(last=False)
        return built


def _is_refusal(exc: Exception) -> bool:
    """True for the errors the frontend raises for a graph it cannot serve (GRAPH_NOT_SUPPORTED
    maps to ``cudnn.cudnnGraphNotSupportedError``, ATTRIBUTE_NOT_SET / INVALID_VALUE to ValueError,
    per cudnn/_sdpa_validate.py); anything else is a bug and propagates."""
    import cudnn

    refused = getattr(cudnn, "cudnnGraphNotSupportedError", None)
    return (refused is not None and isinstance(exc, refused)) or isinstance(
        exc, (ValueError, NotImplementedError)
    )


def version_string() -> str:
    import cudnn

    try:
        return str(cudnn.backend_version_string())
    except Exception:  # pragma: no cover - older frontends
        return str(cudnn.backend_version())


def handle(device: int) -> Any:
    """The cuDNN handle of ``device`` (created with that device current, as cuDNN binds it)."""
    import cudnn
    import torch

    with _LOCK:
        h = _HANDLES.get(device)
        if h is None:
            with torch.cuda.device(device):
                h = cudnn.create_handle()
            _HANDLES[device] = h
        return h


def workspace(device: int, stream: Any, size: int) -> Any:
    """A uint8 buffer of at least ``size`` bytes for ``stream``, reused until a graph needs more.

    Keyed by stream as well as device: two streams running graphs at once must not share one.
    (torch's caching allocator is stream-ordered, so replacing the buffer on its own stream is safe.)
    """
    import torch

    key = (device, stream.cuda_stream)
    with _LOCK:
        buf = _WORKSPACES.get(key)
        if buf is None or buf.numel() < size:
            buf = torch.empty(max(size, 1), dtype=torch.uint8, device=torch.device("cuda", device))
            _WORKSPACES[key] = buf
        return buf


def _dtypes() -> dict[str, Any]:
    import cudnn

    return {"float16": cudnn.data_type.HALF, "bfloat16": cudnn.data_type.BFLOAT16}


def row_major(dims: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The strides of a dense row-major tensor of extents ``dims`` (what every graph declares)."""
    strides, acc = [], 1
    for d in reversed(dims):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def _mask_kwargs(key: GraphKey) -> dict[str, Any]:
    """cuDNN's "preferred masking args": a diagonal band (Causal: right bound 0; Local(w): left
    bound w, right bound w - 1 or 0) aligned top-left or bottom-right (pybind docstring of sdpa in
    python/pygraph/sdpa.cpp)."""
    import cudnn

    kw: dict[str, Any] = {}
    if key.align is not None:
        kw["diagonal_alignment"] = (
            cudnn.diagonal_alignment.TOP_LEFT
            if key.align == "top_left"
            else cudnn.diagonal_alignment.BOTTOM_RIGHT
        )
        if key.left is not None:
            kw["diagonal_band_left_bound"] = key.left
        if key.right is not None:
            kw["diagonal_band_right_bound"] = key.right
    return kw


def _graph(key: GraphKey) -> Any:
    import cudnn

    io = _dtypes()[key.dtype]
    return cudnn.pygraph(
        io_data_type=io,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle(key.device),
    )


def _io(g: Any, name: str, dims: list[int], dtype: Any) -> Any:
    return g.tensor(name=name, dim=dims, stride=list(row_major(dims)), data_type=dtype)


def _output(t: Any, name: str, dims: list[int], dtype: Any) -> None:
    t.set_output(True).set_name(name).set_dim(dims).set_stride(list(row_major(dims))).set_data_type(dtype)


def _shapes(key: GraphKey) -> dict[str, list[int]]:
    b, hq, hkv, sq, sk = key.batch, key.heads_q, key.heads_kv, key.seq_q, key.seq_k
    return {
        "q": [b, hq, sq, key.dim_qk],
        "k": [b, hkv, sk, key.dim_qk],
        "v": [b, hkv, sk, key.dim_v],
        "o": [b, hq, sq, key.dim_v],
        # Stats: (B, H, S, 1) float32, the natural-log logsumexp of the scaled logits per row
        # (max + log(sum exp(s - max)): compute_ref in test/python/sdpa/fp16_ref.py).
        "stats": [b, hq, sq, 1],
    }


def _build(key: GraphKey) -> Built:
    import cudnn
    import torch

    io = _dtypes()[key.dtype]
    f32 = cudnn.data_type.FLOAT
    s = _shapes(key)
    with torch.cuda.device(key.device):
        g = _graph(key)
        t = {n: _io(g, n, s[n], io) for n in ("q", "k", "v")}
        mask = _mask_kwargs(key)
        if key.kind == "fwd":
            o, stats = g.sdpa(
                t["q"], t["k"], t["v"], name="sdpa", attn_scale=float(key.scale),
                generate_stats=key.stats, **mask,
            )  # fmt: skip
            _output(o, "o", s["o"], io)
            t["o"] = o
            if key.stats:
                _output(stats, "stats", s["stats"], f32)
                t["stats"] = stats
        else:
            t["o"] = _io(g, "o", s["o"], io)
            t["dO"] = _io(g, "dO", s["o"], io)
            t["stats"] = _io(g, "stats", s["stats"], f32)
            dq, dk, dv = g.sdpa_backward(
                t["q"], t["k"], t["v"], t["o"], t["dO"], t["stats"], name="sdpa_backward",
                attn_scale=float(key.scale), **mask,
            )  # fmt: skip
            for name, out, like in (("dQ", dq, "q"), ("dK", dk, "k"), ("dV", dv, "v")):
                _output(out, name, s[like], io)
                t[name] = out
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        size = int(g.get_workspace_size())
    names = BWD_NAMES if key.kind == "bwd" else FWD_STATS_NAMES if key.stats else FWD_NAMES
    uids = tuple(int(t[n].get_uid()) for n in names)
    return Built(graph=g, tensors=t, workspace=size, plan=_plan_name(g), names=names, uids=uids)


def _plan_name(g: Any) -> str:
    """The selected plan's name where the frontend says (1.32: python engine or cuDNN engine)."""
    try:
        engine = getattr(g, "selected_engine", None)
        if engine is not None:
            return f"frontend engine {getattr(engine, 'name', type(engine).__name__)}"
        index = getattr(g, "_plan_index", 0)
        return str(g.get_plan_name_at_index(index))
    except Exception:
        return ""


def execute(built: Built, buffers: tuple[Any, ...], device: int) -> None:
    """Run ``built`` on torch's current stream of ``device``, ``buffers`` in ``built.names`` order.

    Under the lock: the handle's stream is set per call and the handle is shared by threads
    (launches are asynchronous, so this serialises enqueueing only). The device is made current
    only when it is not already (a context switch costs microseconds per call)."""
    import cudnn
    import torch

    stream = torch.cuda.current_stream(device)
    with _LOCK:
        h = _HANDLES.get(device)
        if h is None:
            h = handle(device)
        cudnn.set_stream(h, stream.cuda_stream)
        ws = workspace(device, stream, built.workspace)
        if torch.cuda.current_device() == device:
            built.graph.execute(buffers, ws, handle=h, tensor_uids=built.uids)
        else:
            with torch.cuda.device(device):
                built.graph.execute(buffers, ws, handle=h, tensor_uids=built.uids)
