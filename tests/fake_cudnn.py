"""A CPU stand-in for the ``cudnn`` module of nvidia-cudnn-frontend 1.32.0, for the cudnn backend's
CPU tests (tests/test_cudnn_backend.py installs it as ``sys.modules["cudnn"]``).

It mirrors only what the backend calls, with the signatures of the 1.32.0 wheel (read from its
sources; cp312 manylinux wheel, 2026-11-28):

- ``create_handle()`` returns a ``Handle``; ``set_stream(handle, stream)`` takes that Handle (a
  TypeError otherwise) and an int stream (it reaches ``_raw_set_stream(int, int)``):
  cudnn/__init__.py, cudnn/_handle.py.
- ``pygraph.__init__``, ``pygraph.tensor``: the parameter lists of cudnn/_pygraph.py ("classic
  pybind constructor, POSITIONALLY IDENTICAL").
- ``pygraph.sdpa`` / ``sdpa_backward``: the generic builders of _pygraph.py's ``_CAPTURED_OPS``
  (tensors positionally as ``("q", "k", "v")`` / ``("q", "k", "v", "o", "dO", "stats")``, every
  other kwarg forwarded verbatim to the C++ ``backend_graph.sdpa`` at lowering, where nanobind
  rejects an unknown name with a TypeError). The names accepted are those of the C++ bindings'
  docstrings in _compiled_module (``SDPA_KWARGS``, ``SDPA_BWD_KWARGS`` below). Both return a LIST,
  full arity, ``Stats`` None without stats (``_stats_expected``); one of ``generate_stats`` /
  ``is_inference`` must be set.
- Outputs are virtual until ``set_output(True)``; the setters chain (cudnn/graph_types.py).
  ``validate`` rejects a Stats output that is not FLOAT and an O whose dim and stride are not
  declared together (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h).
- ``create_execution_plans`` is one-shot (a RuntimeError on a second call), ``get_workspace_size``
  raises before the plans are built, ``execute(tensor_dict, workspace=None, handle=None, ...)``
  is keyed by Tensor / name / uid (or, with ``tensor_uids=``, takes a sequence of buffers, one uid
  each) and raises ValueError for a missing buffer (``_normalize``).

What it computes is cuDNN's reference (test/python/sdpa/fp16_ref.py in NVIDIA/cudnn-frontend):
logits ``attn_scale * q k^T``; GQA by expanding each kv head over consecutive query heads; the
diagonal band ``triu(1 + right)`` top-left or ``triu(s_kv - s_q + 1 + right)`` bottom-right (and,
with a left bound, ``tril(-left)`` or ``tril(s_kv - s_q - left)``);
Stats = max + log(sum exp(s - max)) per row, natural log, (B, H, S_q, 1) float32. The backward
recomputes from q, k, v and checks that the Stats it is handed are the forward's.
"""

from __future__ import annotations

import enum
import itertools

import torch

__version__ = "1.32.0"


class data_type(enum.Enum):  # noqa: N801 - the frontend's spelling
    NOT_SET = 0
    FLOAT = 1
    HALF = 2
    BFLOAT16 = 3


class heur_mode(enum.Enum):  # noqa: N801
    A = 0
    B = 1
    FALLBACK = 2


class diagonal_alignment(enum.Enum):  # noqa: N801
    TOP_LEFT = 0
    BOTTOM_RIGHT = 1


class cudnnGraphNotSupportedError(Exception):  # noqa: N818 - the frontend's name
    pass


#: Keyword names of the C++ ``backend_graph.sdpa`` (1.32 docstring, "Perform scaled dot product
#: attention.": Args, Preferred/Deprecated masking Args), plus the tensors q, k, v.
SDPA_KWARGS = frozenset(
    [
        "q",
        "k",
        "v",
        "attn_scale",
        "bias",
        "use_alibi_mask",
        "use_padding_mask",
        "seq_len_q",
        "seq_len_kv",
        "dropout",
        "rng_dump",
        "paged_attention_k_table",
        "paged_attention_v_table",
        "paged_attention_max_seq_len_kv",
        "max_total_seq_len_q",
        "max_total_seq_len_kv",
        "compute_data_type",
        "name",
        "generate_stats",
        "implementation",
        "score_max",
        "score_sum_exp",
        "sink_token",
        "unfuse_fma",
        "cu_seq_len_q",
        "cu_seq_len_kv",
        "stats_use_log2",
        "block_mask",
        "score_mod",
        "diagonal_alignment",
        "diagonal_band_left_bound",
        "diagonal_band_right_bound",
        "sliding_window_length",
        "use_causal_mask",
        "use_causal_mask_bottom_right",
        "is_inference",
    ]
)
#: Keyword names of the C++ ``backend_graph.sdpa_backward`` (1.32 docstring, "Compute the key,
#: query, value gradients of scaled dot product attention.").
SDPA_BWD_KWARGS = frozenset(
    [
        "q",
        "k",
        "v",
        "o",
        "dO",
        "stats",
        "attn_scale",
        "bias",
        "dBias",
        "use_alibi_mask",
        "use_padding_mask",
        "seq_len_q",
        "seq_len_kv",
        "max_total_seq_len_q",
        "max_total_seq_len_kv",
        "dropout",
        "rng_dump",
        "use_deterministic_algorithm",
        "compute_data_type",
        "name",
        "score_mod",
        "score_mod_bprop",
        "sink_token",
        "dSink_token",
        "diagonal_alignment",
        "diagonal_band_left_bound",
        "diagonal_band_right_bound",
        "sliding_window_length",
        "use_causal_mask",
        "use_causal_mask_bottom_right",
    ]
)

_TORCH = {data_type.HALF: torch.float16, data_type.BFLOAT16: torch.bfloat16, data_type.FLOAT: torch.float32}
_ids = itertools.count(1)

#: Every graph built and every call made, for the tests to inspect; :func:`reset` empties them.
GRAPHS: list[pygraph] = []
CALLS: list[tuple] = []
#: Set to a message to make ``check_support`` refuse every graph (GRAPH_NOT_SUPPORTED).
REFUSE: list[str] = []
RUNTIME = 91900


def reset() -> None:
    GRAPHS.clear()
    CALLS.clear()
    REFUSE.clear()


def backend_version() -> int:
    return RUNTIME


def backend_version_string() -> str:
    return f"{RUNTIME // 10000}.{RUNTIME % 10000 // 100}.{RUNTIME % 100}"


class Handle:
    def __init__(self, backend_handle, ordinal=None, stream=None):
        self.backend_handle = None if backend_handle is None else int(backend_handle)
        self._ordinal = ordinal
        self.stream = stream


def create_handle():
    CALLS.append(("create_handle",))
    return Handle(next(_ids), 0, 0)


def set_stream(handle, stream):
    if not isinstance(handle, Handle):
        raise TypeError(
            f"cudnn.set_stream expects a cudnn.Handle (from cudnn.create_handle()), got {type(handle).__name__}"
        )
    if type(stream) is not int:  # _raw_set_stream(int backend_handle, int stream) under nanobind
        raise TypeError(f"set_stream: the stream must be an int (cudaStream_t), got {type(stream).__name__}")
    CALLS.append(("set_stream", handle, stream))
    handle.stream = stream


class Tensor:
    def __init__(self, graph, name, dim=None, stride=None, dtype=None, virtual=False):
        self.graph, self.name, self.uid = graph, name, next(_ids)
        self.dim, self.stride, self.data_type, self.is_virtual = dim, stride, dtype, virtual

    def _guard(self):
        if self.graph._planned:
            raise RuntimeError(
                "cannot mutate a tensor attribute after lowering/planning — the graph is frozen"
            )

    def set_output(self, value):
        self._guard()
        self.is_virtual = not value
        return self

    def set_name(self, name):
        self._guard()
        self.name = name
        return self

    def set_dim(self, dim):
        self._guard()
        self.dim = list(dim)
        return self

    def set_stride(self, stride):
        self._guard()
        self.stride = list(stride)
        return self

    def set_data_type(self, dtype):
        self._guard()
        self.data_type = dtype
        return self

    def get_uid(self):
        return self.uid


class pygraph:  # noqa: N801
    def __init__(
        self,
        name="test_graph",
        io_data_type=None,
        intermediate_data_type=None,
        compute_data_type=None,
        handle=None,
        sm_count=None,
        sm_version=None,
        kernel_cache=None,
        device_property=None,
        is_dynamic_shape_enabled=False,
        is_override_shape_enabled=False,
        cuda_graph_retention=None,
        *,
        is_cuda_graph_replay_expected=False,
        **kwargs,
    ):
        if handle is not None and not isinstance(handle, Handle):
            raise TypeError(
                f"expected a cudnn.Handle (from cudnn.create_handle()) or None, got {type(handle).__name__}"
            )
        self.init = dict(
            io_data_type=io_data_type, intermediate_data_type=intermediate_data_type,
            compute_data_type=compute_data_type, handle=handle,
        )  # fmt: skip
        self.tensors: list[Tensor] = []
        self.node: dict | None = None
        self.steps: list[str] = []
        self._planned = False
        self._built = False
        GRAPHS.append(self)

    def tensor(
        self,
        dim,
        stride=None,
        data_type=None,
        is_virtual=False,
        is_pass_by_value=False,
        ragged_offset=None,
        reordering_type=None,
        name="",
        uid=None,
        ragged_offset_multiplier=1,
        alignment_value=1,
        **kwargs,
    ):
        dim = list(dim)
        t = Tensor(self, name or f"tensor_{len(self.tensors)}", dim, list(stride) if stride else _row_major(dim),
                   data_type or self.init["io_data_type"], is_virtual)  # fmt: skip
        self.tensors.append(t)
        return t

    def _node(self, op, pos, allowed, args, name, compute_data_type, kwargs):
        if self.node is not None:
            raise NotImplementedError("the fake holds one SDPA node per graph")
        if len(args) > len(pos):
            raise TypeError(f"{op}() takes at most {len(pos)} positional arguments {pos}")
        for k, v in zip(pos, args):
            if k in kwargs:
                raise TypeError(f"{op}() got multiple values for {k!r}")
            kwargs[k] = v
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise TypeError(f"{op}(): incompatible function arguments (unexpected keyword {unknown})")
        params = {k: v for k, v in kwargs.items() if not isinstance(v, Tensor) and v is not None}
        inputs = {k: v for k, v in kwargs.items() if isinstance(v, Tensor)}
        self.node = dict(op=op, name=name, inputs=inputs, params=params)
        return params

    def sdpa(self, *args, name="", compute_data_type=None, out_dims=None, **kwargs):
        params = self._node("sdpa", ("q", "k", "v"), SDPA_KWARGS, args, name, compute_data_type, kwargs)
        if ("generate_stats" in params) == ("is_inference" in params):
            raise ValueError(
                "Exactly one of {generate_stats, is_inference} must be set (prefer generate_stats)."
            )
        stats = params["generate_stats"] if "generate_stats" in params else not params["is_inference"]
        o = Tensor(self, f"{name}::O", virtual=True)
        s = Tensor(self, f"{name}::Stats", virtual=True) if stats else None
        self.node["outputs"] = {"O": o, "Stats": s}
        return [o, s]

    def sdpa_backward(self, *args, name="", compute_data_type=None, out_dims=None, **kwargs):
        pos = ("q", "k", "v", "o", "dO", "stats")
        self._node("sdpa_backward", pos, SDPA_BWD_KWARGS, args, name, compute_data_type, kwargs)
        outs = {p: Tensor(self, f"{name}::{p}", virtual=True) for p in ("dQ", "dK", "dV")}
        self.node["outputs"] = outs
        return list(outs.values())

    def validate(self):
        self.steps.append("validate")
        node = self.node
        for port in ("q", "k", "v") + (("o", "dO", "stats") if node["op"] == "sdpa_backward" else ()):
            if port not in node["inputs"]:
                raise ValueError(f"{node['name']}: required tensor {port} is missing")
        for port, t in list(node["inputs"].items()) + list(node["outputs"].items()):
            if t is None or t.is_virtual:
                continue
            if not t.dim or len(t.dim) != 4 or not t.stride or len(t.stride) != 4:
                raise ValueError(f"The dim and stride for {port} must be declared together, rank 4")
            if t.stride[3] != 1:
                raise cudnnGraphNotSupportedError(f"The stride for the last dimension should be 1 for {port}")
        stats = node["outputs"].get("Stats")
        if stats is not None and stats.data_type not in (data_type.FLOAT, None):
            raise cudnnGraphNotSupportedError("The Stats output of sdpa must be an FP32 tensor.")

    def build_operation_graph(self):
        self.steps.append("build_operation_graph")

    def create_execution_plans(self, heuristics=None):
        if self._planned:
            raise RuntimeError(
                "create_execution_plans() was already called on this graph; planning is one-shot"
            )
        self.steps.append("create_execution_plans")
        self.heuristics = list(heuristics or [])
        self._planned = True

    def check_support(self):
        self.steps.append("check_support")
        if REFUSE:
            raise cudnnGraphNotSupportedError(REFUSE[0])

    def build_plans(self, *args, ctx=None, **kwargs):
        self.steps.append("build_plans")
        self._built = True

    def get_workspace_size(
        self, handle=None, override_uids=None, override_shapes=None, override_strides=None
    ):
        if not self._built:
            raise RuntimeError("Call build() first")
        self.steps.append("get_workspace_size")
        return 4096

    @property
    def selected_engine(self):
        return None

    def get_plan_name_at_index(self, index):
        return "fake_backend_engine"

    def execute(self, tensor_dict, workspace=None, handle=None, override_uids=None, override_shapes=None,
                override_strides=None, tensor_uids=None):  # fmt: skip
        if not self._built:
            raise RuntimeError("execute() before build_plans()")
        if tensor_uids is not None:  # the ordered form: buffers in a sequence, one uid each
            if len(tensor_uids) != len(tensor_dict) or len(set(tensor_uids)) != len(tensor_uids):
                raise ValueError("tensor_uids must name each buffer once, one uid per buffer")
            by_uid = dict(zip(tensor_uids, tensor_dict))
        else:
            by_uid = {}
            for key, data in tensor_dict.items():
                uid = key.uid if isinstance(key, Tensor) else key
                by_uid[uid] = data
        node = self.node
        bound = {}
        for port, t in list(node["inputs"].items()) + list(node["outputs"].items()):
            if t is None or t.is_virtual:
                continue
            data = by_uid.get(t.uid)
            if data is None:
                raise ValueError(f"the variant pack is missing a buffer for tensor uid {t.uid} ({t.name!r})")
            if list(data.shape) != list(t.dim) or data.dtype != _TORCH[t.data_type]:
                raise ValueError(
                    f"{t.name}: bound {tuple(data.shape)} {data.dtype}, declared {t.dim} {t.data_type}"
                )
            if list(data.stride()) != list(t.stride):
                raise ValueError(f"{t.name}: bound strides {data.stride()}, declared {t.stride}")
            bound[port] = data
        if workspace is None or workspace.numel() < 4096:
            raise ValueError("the workspace is smaller than get_workspace_size()")
        CALLS.append(("execute", self, handle, None if handle is None else handle.stream))
        p = node["params"]
        scale = p.get("attn_scale", 1.0)
        align = p.get("diagonal_alignment", diagonal_alignment.TOP_LEFT)
        right = p.get("diagonal_band_right_bound")
        left = p.get("diagonal_band_left_bound")
        if node["op"] == "sdpa":
            o, stats = _reference(bound["q"], bound["k"], bound["v"], scale, align, right, left)
            bound["O"].copy_(o)
            if "Stats" in bound:
                bound["Stats"].copy_(stats)
            return
        q, k, v = (bound[n].double().requires_grad_(True) for n in ("q", "k", "v"))
        o, stats = _reference(q, k, v, scale, align, right, left)
        if not torch.allclose(bound["stats"].double(), stats, atol=1e-6, equal_nan=False):
            raise AssertionError("the backward's Stats are not the forward's natural-log logsumexp")
        grads = torch.autograd.grad(o, (q, k, v), bound["dO"].double())
        for port, g in zip(("dQ", "dK", "dV"), grads):
            bound[port].copy_(g)


def _row_major(dims):
    strides, acc = [], 1
    for d in reversed(dims):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def _reference(q, k, v, scale, align, right, left=None):
    """(O, Stats (B, H, S_q, 1)) in float64: cuDNN's fp16_ref.compute_ref without its options but
    the diagonal band: key j is masked above the diagonal ``shift + right`` (``triu``) and, with a
    left bound, on or below ``shift - left`` (``tril``), shift 0 top-left, s_kv - s_q bottom-right."""
    q, k, v = q.double(), k.double(), v.double()
    b, hq, sq, _ = q.shape
    hk, skv = k.shape[1], k.shape[2]
    k = k.unsqueeze(2).expand(-1, -1, hq // hk, -1, -1).reshape(b, hq, skv, -1)
    v = v.unsqueeze(2).expand(-1, -1, hq // v.shape[1], -1, -1).reshape(b, hq, skv, -1)
    s = scale * q @ k.transpose(-1, -2)
    shift = 0 if align == diagonal_alignment.TOP_LEFT else skv - sq
    if right is not None:
        masked = torch.ones(sq, skv, dtype=torch.bool).triu(shift + 1 + right)
        s = s.masked_fill(masked, float("-inf"))
    if left is not None:
        masked = torch.ones(sq, skv, dtype=torch.bool).tril(shift - left)
        s = s.masked_fill(masked, float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    return (e / total) @ v, torch.log(total) + m
