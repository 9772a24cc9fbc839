"""Would fusing ring steps pay off? (issue 25, a probe, not the ring.)

At N = 4 the simulated ring's forward kernels take ~1.2x the single call's: each off-diagonal
step is one Full call with a short key loop (L/2N or L/N keys). Consecutive steps whose call is a
single Full call on the same query rows could run as one call on their keys concatenated (fewer,
longer calls, fewer merges and dq sums). This times the block calls only (no merges, no sums):
as scheduled, and with such steps fused (keys concatenated beforehand, the copy timed apart).

    python tools/dev/ring_fusion_probe.py --seq 32768 --heads 16 --worlds 2 4 [--backend triton]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import attnhub
from attnhub.distributed import simulate
from attnhub.rules import Full


def timed(fn, repeat: int) -> float:
    fn()
    gpu = torch.cuda.is_available()
    times = []
    for _ in range(repeat):
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if gpu:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def groups(s) -> list[list[tuple[int, object]]]:
    """The rank's (step, call) list cut into groups: runs of steps whose only call is Full on
    the same rows form one group; every other call is a group of its own."""
    out: list[list[tuple[int, object]]] = []
    for t in range(s.steps):
        cs = s.calls(t)
        one_full = len(cs) == 1 and isinstance(cs[0].rule, Full)
        prev = out[-1] if out else None
        if (
            one_full and prev and isinstance(prev[-1][1].rule, Full) and len(s.calls(prev[-1][0])) == 1
            and (prev[-1][1].q_lo, prev[-1][1].q_hi) == (cs[0].q_lo, cs[0].q_hi)
        ):  # fmt: skip
            prev.append((t, cs[0]))
        else:
            out.extend([[(t, c)] for c in cs])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--repeat", type=int, default=10)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, a.dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    shape = (1, a.heads, a.seq, a.dim)
    q, k, v, do = (torch.randn(shape, generator=g, device=dev, dtype=dtype) for _ in range(4))
    be = a.backend

    def fwd_bwd(qq, kk, vv, rule, dd):
        leaves = [x.detach().requires_grad_(True) for x in (qq, kk, vv)]
        out = attnhub.attention(*leaves, mask=rule, backend=be)
        torch.autograd.grad(out, leaves, dd)

    ql, kl, vl = (x.clone().requires_grad_(True) for x in (q, k, v))
    print(f"single: fwd {timed(lambda: attnhub.attention(q, k, v, mask='causal', backend=be), a.repeat):.2f} ms, "
          f"fwd+bwd {timed(lambda: fwd_bwd(ql, kl, vl, 'causal', do), a.repeat):.2f} ms")  # fmt: skip
    for world in a.worlds:
        sets = simulate.setups(q, k, world, mask="causal", backend=be)
        qs, ks, vs, dos = (simulate.shards(x, world, "zigzag") for x in (q, k, v, do))
        plain, fused, parts = [], [], []  # (q, k, v, rule, do) per call; the keys fused
        for r, s in enumerate(sets):
            for grp in groups(s):
                c0 = grp[0][1]
                if any(c.q_offset or c.k_offset for _, c in grp):
                    raise SystemExit(f"N={world}: a call with offsets; this probe takes causal zigzag")
                rows = slice(c0.q_lo, c0.q_hi)
                kk = [ks[s.source(t)][:, :, c.k_lo : c.k_hi] for t, c in grp]
                vv = [vs[s.source(t)][:, :, c.k_lo : c.k_hi] for t, c in grp]
                for (_, c), kx, vx in zip(grp, kk, vv):
                    plain.append((qs[r][:, :, rows], kx, vx, c.rule, dos[r][:, :, rows]))
                fused.append(
                    (qs[r][:, :, rows], torch.cat(kk, 2), torch.cat(vv, 2), c0.rule, dos[r][:, :, rows])
                )
                if len(grp) > 1:
                    parts.append((kk, vv))
        cat_ms = timed(lambda: [(torch.cat(kk, 2), torch.cat(vv, 2)) for kk, vv in parts], a.repeat)  # noqa: B023

        def run(calls: list, bwd: bool) -> None:
            for qq, kx, vx, rule, dd in calls:
                if bwd:
                    fwd_bwd(qq, kx, vx, rule, dd)
                else:
                    attnhub.attention(qq, kx, vx, mask=rule, backend=be)

        pf, ff = (timed(lambda x=x: run(x, False), a.repeat) for x in (plain, fused))
        pb, fb = (timed(lambda x=x: run(x, True), a.repeat) for x in (plain, fused))
        print(f"N={world}: {len(plain)} calls -> {len(fused)} fused; block calls fwd {pf:.2f} -> {ff:.2f} ms, "
              f"fwd+bwd {pb:.2f} -> {fb:.2f} ms; concatenating the keys ~{cat_ms:.2f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
