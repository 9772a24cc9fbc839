"""The triton backend's ragged kernels (SPEC §10-§11) on the CPU under Triton's interpreter, against
a float64 dense formula written here from the spec.

Run as a normal test: ``test_ragged_under_interpreter`` starts this file again in a child pytest
with ``TRITON_INTERPRET=1`` (it must be set before triton is imported and must not leak into other
tests); the cases below are defined only in that child.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

if not INTERPRETED:

    @pytest.mark.slow
    def test_ragged_under_interpreter() -> None:
        """Every case below, in a child process with the interpreter on."""
        here = Path(__file__).parent
        env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(here.parent))
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__))],
            cwd=here.parent, env=env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]

else:
    import torch

    from attnhub.rules import Causal, Full, Local
    from tests.ragged_dense import case_request, check_case

    SYNCS = ("none_front", "none_end", "scale_front", "scale_end")
    RULES = (Full(), Causal(), Local(3, causal=True), Local(2, log2_stride=1))

    @pytest.mark.parametrize("side", ["right", "left"])
    @pytest.mark.parametrize("sync", SYNCS)
    def test_lengths_forward_backward(side, sync) -> None:
        """Both padding sides, each sync mode, rules, GQA, lengths 0 and full, a padded query row."""
        for n, rule in enumerate(RULES):
            check_case(
                torch, dtype="float32", b=3, hq=4, hkv=2, lq=21, lk=34 if n % 2 else 13, dqk=16, dv=8,
                q_lengths=[21, 0, 9], k_lengths=[0, 13 if n % 2 == 0 else 30, 5 + n], side=side,
                rule=rule, sync=sync, grad=n < 2 or sync == "none_end", seed=n,
            )  # fmt: skip

    @pytest.mark.parametrize("side", ["right", "left"])
    def test_query_tiled_lengths_write_their_padded_rows(side) -> None:
        """More query rows than one packed tile holds: the query-tiled programs write the padded
        rows themselves (out 0, lse -inf; FILL_PADDED), an entry without queries included; NaN in
        the padded keys and values reaches nothing."""
        for n, rule in enumerate((Causal(), Full())):
            check_case(
                torch, dtype="float32", b=3, hq=2, hkv=2, lq=70, lk=40, dqk=16, dv=16,
                q_lengths=[70, 0, 33], k_lengths=[40, 7, 0 if n else 25], side=side, rule=rule,
                sync="none_end", grad=False, seed=30 + n, nan_padding=True,
            )  # fmt: skip
        check_case(
            torch, dtype="float32", b=2, hq=2, hkv=1, lq=70, lk=40, dqk=16, dv=16, q_lengths=[5, 70],
            k_lengths=[40, 31], side=side, rule=Causal(), sync="none_front", grad=True, seed=32,
        )  # fmt: skip

    def test_lengths_only_one_side() -> None:
        """Only q_lengths, only k_lengths; float16 and bfloat16; large logits."""
        check_case(torch, dtype="float32", b=2, hq=2, hkv=1, lq=17, lk=17, dqk=16, dv=16,
                   q_lengths=[17, 4], k_lengths=None, side="left", rule=Causal(), sync="none_front",
                   grad=True, logit_boost=8.0)  # fmt: skip
        check_case(torch, dtype="float16", b=2, hq=2, hkv=2, lq=19, lk=40, dqk=32, dv=32,
                   q_lengths=None, k_lengths=[40, 11], side="right", rule=Causal(), sync="none_end",
                   grad=True)  # fmt: skip
        check_case(torch, dtype="bfloat16", b=2, hq=4, hkv=1, lq=12, lk=20, dqk=16, dv=16,
                   q_lengths=[3, 12], k_lengths=[20, 2], side="left", rule=Local(4), sync="none_end",
                   grad=True)  # fmt: skip

    def test_softcap_sinks_offsets() -> None:
        """softcap and sinks (with dsinks), and q_offset/k_offset under none_front."""
        check_case(torch, dtype="float32", b=2, hq=4, hkv=2, lq=15, lk=26, dqk=16, dv=16,
                   q_lengths=[15, 6], k_lengths=[26, 0], side="right", rule=Causal(), sync="none_end",
                   grad=True, softcap=2.5, sinks=True, logit_boost=4.0)  # fmt: skip
        check_case(torch, dtype="float32", b=2, hq=2, hkv=2, lq=18, lk=30, dqk=16, dv=16,
                   q_lengths=[18, 7], k_lengths=[30, 20], side="left", rule=Local(5, causal=True),
                   sync="none_front", grad=True, q_offset=9, k_offset=3)  # fmt: skip

    @pytest.mark.parametrize("splits", ["", "3"])
    def test_decode_split_kv(monkeypatch, splits) -> None:
        """Few queries: GQA heads packed in one tile, split-KV with a combine, ragged k_lengths."""
        monkeypatch.setenv("ATTNHUB_TRITON_SPLITS", splits)
        for lq, sinks in ((1, False), (3, True)):
            check_case(torch, dtype="float32", b=3, hq=8, hkv=2, lq=lq, lk=45, dqk=32, dv=32,
                       q_lengths=None, k_lengths=[45, 1, 0], side="right", rule=Causal(), sync="none_end",
                       grad=False, sinks=sinks, softcap=3.0 if sinks else None)  # fmt: skip

    @pytest.mark.parametrize("splits", ["", "2"])
    def test_paged(monkeypatch, splits) -> None:
        """Paged KV cache: block table over shuffled blocks, block sizes under and over a tile."""
        monkeypatch.setenv("ATTNHUB_TRITON_SPLITS", splits)
        for block in (8, 32):
            check_case(torch, dtype="float32", b=3, hq=4, hkv=2, lq=2, lk=64, dqk=16, dv=16,
                       q_lengths=None, k_lengths=[64, 9, 33], side="right", rule=Causal(), sync="none_end",
                       grad=False, paged=block)  # fmt: skip

    @pytest.mark.parametrize("rule", [Causal(), Full(), Local(4, causal=True)], ids=lambda r: r.describe())
    @pytest.mark.parametrize("sync", ["none_front", "none_end"])
    def test_varlen(rule, sync) -> None:
        """Packed sequences (including empty ones), forward and backward."""
        check_case(torch, dtype="float32", b=1, hq=4, hkv=2, lq=0, lk=0, dqk=16, dv=16,
                   varlen=([5, 0, 17, 9, 1], [7, 3, 17, 20, 0]), side="right", rule=rule, sync=sync,
                   grad=True)  # fmt: skip

    def test_declines() -> None:
        """A bias with lengths is served (issue 39); a differentiated paged cache is declined with a
        reason."""
        from dataclasses import replace

        from attnhub_backends.triton.backend import TritonBackend

        req = case_request("float32", 2, 2, 1, 8, 8, 16, 16, Causal(), "none_end", q_lengths=True)
        assert TritonBackend().check(req) == []
        assert TritonBackend().check(replace(req, bias=(1, 1, 8, 8), bias_grad=True, needs_grad=True)) == []
        paged = replace(req, q_lengths=False, k_lengths=True, paged=16, needs_grad=True)
        assert any("no_grad" in r for r in TritonBackend().check(paged))

    def _api_pair(fn, inputs, grad_inputs, **kw):
        """(triton results, float64 reference results) of ``fn`` on float32 inputs, with gradients
        of a random projection of out and lse for ``grad_inputs``."""
        results = []
        for backend, dt in (("triton", torch.float32), ("reference", torch.float64)):
            xs = {n: (x.to(dt).detach().requires_grad_(n in grad_inputs) if x.is_floating_point() else x)
                  for n, x in inputs.items()}  # fmt: skip
            out, lse = fn(**xs, backend=backend, return_lse=True, **kw)
            proj = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
            loss = (out.double() * proj).sum()
            grads = torch.autograd.grad(loss, [xs[n] for n in grad_inputs]) if grad_inputs else ()
            results.append((out, lse, grads))
        return results

    def _close(got, want, tol, name):
        got, want = got.double(), want.double()
        assert torch.equal(torch.isinf(got), torch.isinf(want)), name
        fin = torch.isfinite(want)
        e = (got[fin] - want[fin]).norm() / want[fin].norm().clamp_min(1e-30)
        assert e < tol, f"{name}: {e:.3g}"

    def test_api_lengths_against_reference(monkeypatch) -> None:
        """attnhub.attention with lengths, sinks and softcap: triton vs the reference (float64).

        The ragged kernels apply softcap and sinks; the backend declares those features once its
        dense kernels do too (another branch), so they are declared here for this test."""
        import attnhub
        from attnhub_backends.triton.backend import TritonBackend

        monkeypatch.setattr(TritonBackend, "features", TritonBackend.features | {"softcap", "sinks"})

        g = torch.Generator().manual_seed(5)
        inputs = dict(q=torch.randn(3, 4, 13, 16, generator=g), k=torch.randn(3, 2, 19, 16, generator=g),
                      v=torch.randn(3, 2, 19, 16, generator=g), sinks=torch.randn(4, generator=g))  # fmt: skip
        lens = dict(q_lengths=torch.tensor([13, 0, 6], dtype=torch.int32),
                    k_lengths=torch.tensor([19, 4, 0], dtype=torch.int32))  # fmt: skip
        for side in ("right", "left"):
            (o, lse, gr), (o_r, lse_r, gr_r) = _api_pair(
                attnhub.attention, inputs, ("q", "k", "v", "sinks"), mask=Local(4, causal=True), sync="none_end",
                softcap=3.0, padding_side=side, **lens,
            )  # fmt: skip
            _close(o, o_r, 2e-5, "out")
            _close(lse, lse_r, 2e-5, "lse")
            for n, a, b in zip("qkvs", gr, gr_r, strict=True):
                _close(a, b, 1e-4, f"d{n}")

    def test_api_varlen_and_kvcache_against_reference() -> None:
        import attnhub

        g = torch.Generator().manual_seed(6)
        cu_q = torch.tensor([0, 5, 5, 22, 30], dtype=torch.int32)
        cu_k = torch.tensor([0, 7, 10, 27, 40], dtype=torch.int32)
        inputs = dict(q=torch.randn(30, 4, 16, generator=g), k=torch.randn(40, 2, 16, generator=g),
                      v=torch.randn(40, 2, 16, generator=g), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)  # fmt: skip
        (o, lse, gr), (o_r, lse_r, gr_r) = _api_pair(
            attnhub.attention_varlen, inputs, ("q", "k", "v"), mask="causal", sync="none_end"
        )
        _close(o, o_r, 2e-5, "out")
        _close(lse, lse_r, 2e-5, "lse")
        for n, a, b in zip("qkv", gr, gr_r, strict=True):
            _close(a, b, 1e-4, f"d{n}")
        # KV cache: contiguous, then the same keys paged through a shuffled block table
        q = torch.randn(2, 8, 2, 16, generator=g)
        kc = torch.randn(2, 2, 32, 16, generator=g)
        vc = torch.randn(2, 2, 32, 16, generator=g)
        kl = torch.tensor([32, 9], dtype=torch.int32)
        inputs = dict(q=q, k_cache=kc, v_cache=vc, k_lengths=kl)
        (o, lse, _), (o_r, lse_r, _) = _api_pair(attnhub.attention_kvcache, inputs, ())
        _close(o, o_r, 2e-5, "out")
        _close(lse, lse_r, 2e-5, "lse")
        perm = torch.randperm(8, generator=g).to(torch.int32)
        table = perm.reshape(2, 4)
        kp = torch.empty(8, 8, 2, 16)
        vp = torch.empty(8, 8, 2, 16)
        kp[table.long()] = kc.reshape(2, 2, 4, 8, 16).permute(0, 2, 3, 1, 4)
        vp[table.long()] = vc.reshape(2, 2, 4, 8, 16).permute(0, 2, 3, 1, 4)
        out_p, lse_p = attnhub.attention_kvcache(
            q, kp, vp, kl, block_table=table, backend="triton", return_lse=True
        )
        _close(out_p, o_r, 2e-5, "paged out")
        _close(lse_p, lse_r, 2e-5, "paged lse")

    def test_api_bias_with_lengths_against_reference() -> None:
        """A bias requiring grad with left-padded lengths (T5's padded batches, issue 39): the ragged
        kernels' out, lse, dq, dk, dv and dbias against the reference (float64)."""
        import attnhub

        g = torch.Generator().manual_seed(6)
        inputs = dict(q=torch.randn(2, 4, 11, 16, generator=g), k=torch.randn(2, 2, 11, 16, generator=g),
                      v=torch.randn(2, 2, 11, 16, generator=g), bias=torch.randn(1, 4, 11, 11, generator=g))  # fmt: skip
        (o, lse, gr), (o_r, lse_r, gr_r) = _api_pair(
            attnhub.attention, inputs, ("q", "k", "v", "bias"), mask=Full(), k_lengths=[11, 4], q_lengths=[11, 6],
            padding_side="left",
        )  # fmt: skip
        _close(o, o_r, 2e-5, "out")
        _close(lse, lse_r, 2e-5, "lse")
        for name, a, b in zip(("dq", "dk", "dv", "dbias"), gr, gr_r, strict=True):
            _close(a, b, 1e-4, name)

    def test_repeated_signature_new_data(monkeypatch) -> None:
        """The forward plan is kept per call signature: later calls with new tensors and lengths of
        the same signature still compute their own inputs (split-KV and packed paths)."""
        monkeypatch.setenv("ATTNHUB_TRITON_SPLITS", "2")
        for seed in range(3):
            check_case(torch, dtype="float32", b=2, hq=4, hkv=2, lq=2, lk=40, dqk=16, dv=16,
                       q_lengths=None, k_lengths=[40 - 7 * seed, 3 + seed], side="right", rule=Causal(),
                       sync="none_end", grad=False, seed=seed)  # fmt: skip
            check_case(torch, dtype="float32", b=1, hq=2, hkv=2, lq=0, lk=0, dqk=16, dv=16,
                       varlen=([9, 4 + seed], [9, 12 - seed]), side="right", rule=Causal(), sync="none_front",
                       grad=False, seed=seed)  # fmt: skip
