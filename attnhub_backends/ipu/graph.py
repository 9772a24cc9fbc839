"""Chunked flash attention as a ``torch.nn.Module`` of plain torch operations.

The module is built for one static signature (batch, heads, sequence shapes, head dims, rule,
sync, scale, chunk counts). Its ``forward`` is a straight-line sequence of slices, matmuls and
element-wise operations with an online softmax over the key chunks of each query chunk; chunk
pairs that the rule masks entirely emit no operation at all (see :mod:`attnhub_backends.ipu.plan`).
That is the form PopTorch traces and compiles for an IPU, and ``torch.fx.symbolic_trace`` /
``torch.jit.trace`` accept it too. The same module runs on CPU tensors (emulation mode).

Numerics: q, k and v are computed in float32 (float16 inputs are widened per chunk), the running
maximum is a constant of the graph's gradient (out does not depend on it), fully masked rows give
out 0 and lse -inf with zero gradients and no NaN.
"""

from __future__ import annotations

import math

import torch

from attnhub_backends.ipu.plan import Plan


class ChunkedAttention(torch.nn.Module):
    """Attention of canonical q (B, Hq, Nq, Dqk), k (B, Hkv, Nk, Dqk), v (B, Hkv, Nk, Dv).

    ``forward`` returns ``(out, lse)``: out (B, Hq, Nq, Dv) in the input dtype, lse (B, Hq, Nq)
    float32. Masks of partially masked tiles are registered as buffers (constants of the graph),
    one per distinct mask.
    """

    def __init__(
        self,
        plan: Plan,
        batch: int,
        heads_q: int,
        heads_kv: int,
        dim_v: int,
        scale: float,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        if heads_kv < 1 or heads_q % heads_kv:
            raise ValueError(f"heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
        self.plan = plan
        self.batch, self.heads_q, self.heads_kv = batch, heads_q, heads_kv
        self.group = heads_q // heads_kv
        self.dim_v = dim_v
        self.scale = float(scale)
        self.nq = plan.q_bounds[-1][1] if plan.q_bounds else 0
        self.nk = plan.k_bounds[-1][1] if plan.k_bounds else 0
        # One constant per distinct tile mask: tiles cut the same way by the rule share it (causal
        # with equal chunks: every diagonal tile; local: every tile at the same chunk offset).
        self._mask_names: dict[tuple[int, int], str] = {}
        distinct: dict[tuple, str] = {}
        for row in plan.tiles:
            for t in row:
                if t.mask is None:
                    continue
                key = (t.mask.shape, t.mask.tobytes())
                name = distinct.get(key)
                if name is None:
                    name = distinct[key] = f"mask_{len(distinct)}"
                    self.register_buffer(name, torch.from_numpy(t.mask.copy()).to(device), persistent=False)
                self._mask_names[(t.i, t.j)] = name

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, hkv, g = self.batch, self.heads_kv, self.group
        # GQA: query head h reads kv head h // g; the g query heads of a kv head share its chunks.
        qg = q.reshape(b, hkv, g, self.nq, q.shape[-1])
        kg = k.reshape(b, hkv, 1, self.nk, k.shape[-1])
        vg = v.reshape(b, hkv, 1, self.nk, v.shape[-1])
        outs, lses = [], []
        for i, (q0, q1) in enumerate(self.plan.q_bounds):
            q_i = qg[:, :, :, q0:q1, :].float()
            if self.plan.tiles[i]:
                o_i, l_i = self._query_chunk(q_i, kg, vg, i)
            else:  # the rule masks every key for this query chunk: out 0, lse -inf
                o_i = _zeros_tied_to(q_i[..., :1]).expand(*q_i.shape[:-1], self.dim_v)
                l_i = torch.full_like(q_i[..., 0], -math.inf).detach()
            outs.append(o_i)
            lses.append(l_i)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=3)
        lse = lses[0] if len(lses) == 1 else torch.cat(lses, dim=3)
        out = out.reshape(b, self.heads_q, self.nq, self.dim_v).to(q.dtype)
        return out, lse.reshape(b, self.heads_q, self.nq)

    def _query_chunk(
        self, q_i: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, i: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Online softmax of float32 query chunk ``i`` over the key chunks its tiles name."""
        m = m_safe = den = acc = None
        for t in self.plan.tiles[i]:
            k0, k1 = self.plan.k_bounds[t.j]
            k_j = kg[:, :, :, k0:k1, :].float()
            v_j = vg[:, :, :, k0:k1, :].float()
            s = torch.matmul(q_i, k_j.transpose(-1, -2)) * self.scale
            if t.mask is not None:
                s = torch.where(getattr(self, self._mask_names[(t.i, t.j)]), s, -math.inf)
            # The running max only keeps exp() in range; out does not depend on it, so it is a
            # constant for autograd (detached: no gradient flows through max()).
            tile_max = s.detach().amax(dim=-1)
            m_new = tile_max if m is None else torch.maximum(m, tile_max)
            # Rows without an attended key so far have max -inf; shift them by 0 (no inf - inf).
            m_new_safe = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
            p = torch.exp(s - m_new_safe.unsqueeze(-1))
            pv = torch.matmul(p, v_j)
            if m is None:
                den, acc = p.sum(dim=-1), pv
            else:
                c = torch.exp(m_safe - m_new_safe)
                den = den * c + p.sum(dim=-1)
                acc = acc * c.unsqueeze(-1) + pv
            m, m_safe = m_new, m_new_safe
        assert den is not None and acc is not None and m_safe is not None
        empty = den == 0
        out = acc / torch.where(empty, torch.ones_like(den), den).unsqueeze(-1)
        lse = (m_safe + torch.log(den)).detach()
        return out, lse


def _zeros_tied_to(x: torch.Tensor) -> torch.Tensor:
    """Zeros shaped like ``x`` that stay in the autograd graph of ``x`` with zero gradients.

    ``torch.where`` selects the zeros (NaN or Inf in ``x`` cannot leak into the output) and sends
    a zero gradient to the unselected branch.
    """
    return torch.where(torch.zeros_like(x, dtype=torch.bool), x, torch.zeros_like(x))
