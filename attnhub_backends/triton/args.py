"""The Triton kernels' compile-time switches as named tuples, and their packing from launch keywords.

Each kernel takes its constexprs as a few named tuples (one ``tl.constexpr`` parameter each) instead
of one parameter per switch, so that no signature grows past a few dozen parameters
(tests/test_kernel_signatures.py). A named tuple is one constexpr value to Triton: two launches
compile the same variant exactly when every field is equal, as with separate constexprs. Each
kernel and helper names the fields it uses as local constexprs at its top (``BM: tl.constexpr =
T.BM``): Triton 3.6 reads ``T.BM`` as a plain Python value, which it does not accept in a shape
list (``tl.zeros([T.BM], ...)``) nor, for a string, as another jit function's argument; nor can it
unpack a constexpr tuple (``BM, BN = ...``) or take nested targets (``a, (b, c) = t``).

The host side keeps building one flat dict of keywords per launch (``{"BM": 64, "CAUSAL": True,
..., "num_warps": 4}``, as the configs, rule and modifier helpers make them, and as tests read
them); :func:`pack` turns it into the kernel's keywords once per launch plan. Runtime arguments
that Triton must not specialise (lengths, offsets, windows: the kernels' ``*_LENGTH_ARGS``) stay
separate parameters: Triton specialises every member of a tuple argument, whatever
``do_not_specialize`` says.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from attnhub.positions import axis_affine
from attnhub.request import Request
from attnhub.rules import Causal, Full, Local
from attnhub_backends.triton.modifiers import plan_rule


class TileC(NamedTuple):
    """Head dims (``DQK``, ``DV``), their power-of-two tiles (``BDQK``, ``BDV``), the query and key
    tiles (``BM``, ``BN``), how ``tl.dot`` multiplies (``DOT_PRECISION``, see ``kernels._dot``) and
    the grid's axis order (``SWAP_HB``: (tiles, batch, heads), see ``kernels._head_batch``)."""

    DQK: int
    DV: int
    BDQK: int
    BDV: int
    BM: int
    BN: int
    DOT_PRECISION: str
    SWAP_HB: bool = False


class RuleC(NamedTuple):
    """The rule's constexprs (``args.rule_args``): ``NDIM`` (1 or 2), ``RULE`` ("full", "causal"
    or "local"), ``CAUSAL`` (a causal window too) and ``LOG2_STRIDE`` (a window's dilation)."""

    NDIM: int
    RULE: str
    CAUSAL: bool
    LOG2_STRIDE: int


class ModsC(NamedTuple):
    """SPEC §9 switches of the dense kernels: ``SOFTCAP``, ``HAS_BIAS``, ``HAS_MASK`` (a boolean
    mask), ``HAS_SINKS`` (forward), ``CAP_MAX`` (forward: softcap's bound as every row's max,
    ``shape.cap_max``), ``DBIAS`` (dq kernel: dS stored for the bias gradient) and ``HAS_ALIBI``
    (ALiBi from the rule's positions, ``kernels._alibi_dist``)."""

    SOFTCAP: bool = False
    HAS_BIAS: bool = False
    HAS_MASK: bool = False
    HAS_SINKS: bool = False
    CAP_MAX: bool = False
    DBIAS: bool = False
    HAS_ALIBI: bool = False


class WalkC(NamedTuple):
    """The dense forward's walk (see ``kernels.fwd_kernel``): ``NEG`` (a negative scale), ``PACK``
    (GQA rows packed into one tile), ``TMA`` (K/V tensor descriptors), ``BAND`` (one loop over a
    band of key tiles), ``EVEN_K`` (no bounds masks on the band walk's K/V loads), ``SPLIT``
    (split-KV) and ``NQ1`` (one query row)."""

    NEG: bool
    PACK: bool
    TMA: bool = False
    BAND: bool = False
    EVEN_K: bool = False
    SPLIT: bool = False
    NQ1: bool = False


class EntryC(NamedTuple):
    """How the ragged kernels compute a sequence's table entry (``ragged_kernels._entry``)."""

    HAS_QL: bool
    HAS_KL: bool
    VARLEN: bool
    LEFT: bool
    SYNC: str


class RaggedFwdC(NamedTuple):
    """The ragged forward's switches (see ``ragged_kernels.fwd_kernel``)."""

    PACK: bool
    SPLIT: bool
    PAGED: bool
    BLOCK: int
    SOFTCAP: bool
    SINK: bool
    BR: int = 16
    BSP: int = 1
    WRITE_LSE: bool = True
    TMA: bool = False
    FILL_PADDED: bool = False
    POS_SCALE: bool = False
    HAS_BIAS: bool = False
    HAS_ALIBI: bool = False


#: The constexpr parameters of each kernel: (parameter name, its named tuple), by kernel.
DENSE_FWD = (("T", TileC), ("R", RuleC), ("M", ModsC), ("W", WalkC))
DENSE_BWD = (("T", TileC), ("R", RuleC), ("M", ModsC))
RAGGED_FWD = (("T", TileC), ("R", RuleC), ("E", EntryC), ("F", RaggedFwdC))
RAGGED_BWD = (("T", TileC), ("R", RuleC), ("M", ModsC))

_FIELDS = {cls: frozenset(cls._fields) for cls in (TileC, RuleC, ModsC, WalkC, EntryC, RaggedFwdC)}


def pack(flat: dict[str, Any], groups: tuple[tuple[str, type], ...]) -> dict[str, Any]:
    """The kernel keywords of ``flat``: each group's fields gathered into its named tuple (fields
    left out take the tuple's defaults), every other keyword (runtime arguments passed by name,
    launch options such as ``num_warps``) as it is. A field that no group has is an error."""
    out = dict(flat)
    for name, cls in groups:
        fields = _FIELDS[cls]
        out[name] = cls(**{f: out.pop(f) for f in fields if f in flat})
    stray = [k for k in out if k.isupper() and k not in dict(groups) and not _runtime(k)]
    if stray:
        raise TypeError(f"no kernel constexpr takes {stray}")
    return out


def _runtime(name: str) -> bool:
    """Upper-case runtime arguments passed by name (the dense forward's split count)."""
    return name == "SPLITS"


def flat(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`pack`: every named tuple's fields as keywords of their own."""
    out: dict[str, Any] = {}
    for k, v in kwargs.items():
        if isinstance(v, tuple) and hasattr(v, "_fields") and type(v) in _FIELDS:
            out.update(v._asdict())
        else:
            out[k] = v
    return out


def rule_args(req: Request) -> tuple[dict[str, int], dict[str, Any]]:
    """The rule's kernel arguments: runtime scalars and constexprs, by kernel parameter name.

    Scalars (see kernels.py): each grid's row length (2-d), the affine position maps ``scale *
    index + shift`` per axis (``positions.axis_affine``), the causal order's row length and the
    window per axis. Constexprs: ``NDIM``, ``RULE`` ("full", "causal" or "local"), ``CAUSAL`` and
    ``LOG2_STRIDE``. SPEC §11's offsets (1-d, none_front) add to the shifts; a boolean mask rides
    on the rule Full (``modifiers.plan_rule``).
    """
    rule = plan_rule(req)
    if req.ndim == 2:
        (yq, xq), (yk, xk) = req.seq_q, req.seq_k
        ay = axis_affine(yq, yk, req.sync)
    else:
        (xq,), (xk,) = req.seq_q, req.seq_k
        ay = (1, 0, 1, 0)
    ax = axis_affine(xq, xk, req.sync)
    if req.q_offset or req.k_offset:
        ax = (ax[0], ax[1] + req.q_offset, ax[2], ax[3] + req.k_offset)
    wy = wx = 1
    log2_stride = 0
    if isinstance(rule, Local):
        windows = rule.windows(req.ndim)
        wy, wx = (windows[0], windows[1]) if req.ndim == 2 else (1, windows[0])
        log2_stride = rule.log2_stride
    scalars = dict(
        q_cols=xq, k_cols=xk,
        qy_scale=ay[0], qy_shift=ay[1], ky_scale=ay[2], ky_shift=ay[3],
        qx_scale=ax[0], qx_shift=ax[1], kx_scale=ax[2], kx_shift=ax[3],
        row_len=max(xq, xk), window_y=wy, window_x=wx,
    )  # fmt: skip
    kind = "full" if isinstance(rule, Full) else "causal" if isinstance(rule, Causal) else "local"
    causal = isinstance(rule, Causal) or (isinstance(rule, Local) and rule.causal)
    consts = {"NDIM": req.ndim, "RULE": kind, "CAUSAL": causal, "LOG2_STRIDE": log2_stride}
    return scalars, consts
