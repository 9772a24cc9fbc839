"""What the ``cudnn`` backend serves, decided from the request alone (no torch, no ``cudnn``).

The rules map SPEC §2-§3 onto cuDNN's SDPA masking arguments (``diagonal_alignment`` and
``diagonal_band_right_bound``, cuDNN frontend docs/operations/Attention.md and the pybind
docstring of ``pygraph.sdpa`` in python/pygraph/sdpa.cpp):

- ``Full()``: no mask, whatever the sync mode (positions do not matter).
- ``Causal()`` with Lq == Lk: every sync mode puts query i and key j at i and j; top-left.
- ``Causal()``, ``none_front`` (P = i, R = j): attended iff j <= i, cuDNN's TOP_LEFT alignment with
  right bound 0 (its reference masks ``triu(diagonal=1)``; test/python/sdpa/fp16_ref.py).
- ``Causal()``, ``none_end`` with Lq < Lk (P = i + Lk - Lq, R = j): attended iff j <= i + Lk - Lq,
  cuDNN's BOTTOM_RIGHT alignment with right bound 0 (reference: ``triu(diagonal=s_kv - s_q + 1)``).
- ``Causal()``, ``none_end`` with Lq > Lk: declined. The first Lq - Lk rows attend no key (SPEC §4
  wants out = 0, lse = -inf there) and cuDNN refuses the graph anyway ("Bottom right causal mask
  does not support max_s_q > max_s_kv", include/cudnn_frontend/node/sdpa_support_surface.h).
- ``Causal()`` with ``scale_front``/``scale_end`` and Lq != Lk: not a diagonal band; declined.
- ``Local(w)`` (stride 1): the band ``P - w < R < P + w`` (left bound w, right bound w - 1), with
  ``causal=True`` right bound 0; aligned as Causal is. Strided windows are declined.
- ``q_lengths``/``k_lengths``: declined. cuDNN's padding mask (seq_len_q/seq_len_kv) was wired and
  certified on the H200: it lets a NaN stored in padding reach valid rows (SPEC §10), see
  docs/backends/cudnn.md.

No accepted request has a query row without keys (Lk >= 1 and every row above attends key 0 or
more), so SPEC §4's empty-row contract never depends on what cuDNN writes for such rows.
"""

from __future__ import annotations

from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local

#: Largest head dim (Dqk and Dv) served: the sm90 limit of cuDNN's fp16/bf16 SDPA backward
#: ("Num hidden_dim should be less than or equal to 256 and hidden_dim should be multiple of 8",
#: scaled_dot_product_flash_attention.h) and of its forward on Hopper. Newer releases serve more on
#: some GPUs (a frontend python engine on sm90 goes to 512 in the forward); not taken here.
MAX_HEAD_DIM = 256
#: Head dims must be multiples of this ("hidden_dim should be multiple of 8").
HEAD_DIM_ALIGN = 8

#: Where to go instead, in the reasons.
ELSEWHERE = "use backend='triton' or backend='cuda' (or backend='auto', which picks one that takes it)"


def alignment(req: Request) -> str | None:
    """``"top_left"`` or ``"bottom_right"`` for a banded request (Causal, Local) cuDNN serves, None
    for Full. Only meaningful for requests :func:`reasons` accepts."""
    if isinstance(req.rule, Full):
        return None
    lq, lk = req.seq_q[0], req.seq_k[0]
    if req.sync == "none_front" or lq == lk:
        return "top_left"
    return "bottom_right"


def band(req: Request) -> tuple[int | None, int | None]:
    """(left bound, right bound) of cuDNN's diagonal band for the request's rule: attended iff
    ``P - left < R <= P + right`` (None: unbounded). Causal: (None, 0); ``Local(w)``: (w, w - 1),
    ``Local(w, causal=True)``: (w, 0), since SPEC §3 attends ``|P - R| < w``."""
    rule = req.rule
    if isinstance(rule, Causal):
        return None, 0
    if isinstance(rule, Local):
        w = rule.windows(1)[0]
        return w, (0 if rule.causal else w - 1)
    return None, None


def reasons(req: Request) -> list[str]:
    """Why the cudnn backend cannot serve ``req``, beyond what its declared features already say
    (the base class names a missing feature; these add what to use instead, and the limits that
    depend on shapes, rule and sync)."""
    out: list[str] = []
    if req.symbolic:
        out.append("needs concrete torch tensors (the inputs are traced)")
    rule = req.rule
    if isinstance(rule, Local) and rule.log2_stride:
        out.append(f"strided windows (Local with log2_stride > 0) are no diagonal band; {ELSEWHERE}")
    elif isinstance(rule, ExplicitMask):
        out.append(f"does not read mask arrays; express the mask as a rule (Causal) or {ELSEWHERE}")
    uses = {
        "softcap": req.softcap is not None,
        "an additive bias (bias=, or a float mask)": req.bias is not None,
        "attention sinks": req.sinks,
        # Measured (cuDNN 9.19, H200, certify 2026-11-28): with its padding mask a NaN stored in a
        # padded key or query row reaches valid rows (10 of 10 such cases failed), and an entry with
        # no valid keys came back nonzero. SPEC §10 says padding never passes a NaN on, and
        # uninitialised cache rows hold anything: declined until cuDNN masks before it multiplies.
        "q_lengths/k_lengths (cuDNN's padding mask lets a NaN stored in padding reach valid rows, "
        "SPEC §10)": req.q_lengths or req.k_lengths,
        "packed sequences (attention_varlen)": req.varlen,
        "paged KV caches": bool(req.paged),
        "q_offset/k_offset": bool(req.q_offset or req.k_offset),
    }
    out.extend(f"does not take {what}; {ELSEWHERE}" for what, used in uses.items() if used)
    if req.scale == 0:
        # measured on cuDNN 9.19 (H200): attn_scale = 0 gives NaN where SPEC §4 wants uniform weights
        out.append(f"cuDNN returns NaN for scale = 0 (uniform weights); {ELSEWHERE}")
    if req.ndim != 1:
        out.append(f"serves 1-d sequences only; {ELSEWHERE}")
        return out
    dqk, dv = req.dim_qk, req.dim_v
    if dqk % HEAD_DIM_ALIGN or dv % HEAD_DIM_ALIGN:
        out.append(
            f"cuDNN needs head dims that are multiples of {HEAD_DIM_ALIGN}, got Dqk={dqk} Dv={dv}; "
            f"pad them with zeros or {ELSEWHERE}"
        )
    if dv > dqk:
        # cuDNN's own tests only draw Dqk >= Dv (test/python/sdpa/random_config.py); untested here.
        out.append(f"serves Dv <= Dqk only (cuDNN's tested range), got Dqk={dqk} Dv={dv}; {ELSEWHERE}")
    lq, lk = req.seq_q[0], req.seq_k[0]
    if lq == 1 and lk == 1:
        out.append(f'cuDNN does not take Lq = Lk = 1 ("s_q = s_kv = 1 is not supported"); {ELSEWHERE}')
    if isinstance(rule, (Causal, Local)) and lq != lk:
        if req.sync == "none_end" and lq > lk:
            out.append(
                f"a band with sync='none_end' and Lq > Lk ({lq} > {lk}) leaves the first {lq - lk} query "
                "rows without keys; cuDNN's bottom-right causal mask does not take Lq > Lk (nor promise "
                f"out = 0, lse = -inf there); {ELSEWHERE}"
            )
        elif req.sync not in ("none_front", "none_end"):
            out.append(
                f"{type(rule).__name__} with sync={req.sync!r} and Lq != Lk is not a diagonal band cuDNN can express "
                f"(it aligns top-left = 'none_front' or bottom-right = 'none_end'); {ELSEWHERE}"
            )
    if isinstance(rule, Local) and alignment(req) == "top_left" and lq >= lk + rule.windows(1)[0]:
        out.append(
            f"Local({rule.windows(1)[0]}) aligned top-left with Lq >= Lk + window leaves query rows "
            f"without keys (SPEC §4: out = 0, lse = -inf), which cuDNN does not promise; {ELSEWHERE}"
        )
    return out
