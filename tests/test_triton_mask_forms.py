"""Padding-shaped boolean masks recognised exactly as SPEC §10 lengths (triton's mask_forms.py),
and everything else left to the mask kernels; no kernel runs here (the interpreter cases are in
test_triton_modifiers.py)."""

from __future__ import annotations

import pytest

from attnhub.request import build_request
from attnhub.rules import Causal, Full

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attnhub_backends.triton import mask_forms  # noqa: E402


def _form(mask, b=3, lq=32, lk=32):
    q = torch.zeros(b, 2, lq, 8)
    k = torch.zeros(b, 2, lk, 8)
    req, _ = build_request(q, k, k, mask, "none_front", None, "bhsd", False)
    assert mask_forms.eligible(req)
    return mask_forms.lengths_form(mask, req)


def _pattern(lq, lk, qn, kn, side, causal, end=False):
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    out = []
    for nq, nk in zip(qn, kn, strict=True):
        sq, sk = (0, 0) if side == "right" else (lq - nq, lk - nk)
        m = (i >= sq) & (i < sq + nq) & (j >= sk) & (j < sk + nk)
        if causal:
            m = m & ((j - sk) <= (i - sq) + ((nk - nq) if end else 0))
        out.append(m)
    return torch.stack(out)[:, None]


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("kind", ["causal", "causal_end", "full"])
def test_padding_patterns_are_recognised(side, kind) -> None:
    qn, kn = [32, 7, 0], [32, 20, 5]
    if kind == "causal":  # top-left on the segments: equal lengths, so every valid row keeps a key
        kn = qn
    m = _pattern(32, 32, qn, kn, side, kind != "full", end=kind == "causal_end")
    form = _form(m)
    assert form is not None
    assert form.side == side or not m.any()
    assert isinstance(form.rule, Full if kind == "full" else Causal)
    # the form's lengths reproduce the mask (what the ragged kernels then compute)
    again = _pattern(32, 32, form.q_lengths.tolist(), form.k_lengths.tolist(), form.side,
                     isinstance(form.rule, Causal), end=form.sync == "none_end")  # fmt: skip
    assert torch.equal(again, m)
    assert form.q_lengths.dtype == torch.int32 and form.q_lengths.shape == (3,)


def test_broadcast_batch_gives_lengths_per_entry() -> None:
    m = _pattern(32, 32, [19], [19], "right", True)
    form = _form(m, b=3)
    assert form.q_lengths.tolist() == [19, 19, 19] and form.k_lengths.tolist() == [19, 19, 19]


@pytest.mark.parametrize("edit", ["hole", "extra", "random", "gap_rows"])
def test_other_masks_keep_the_mask_kernels(edit) -> None:
    m = _pattern(32, 32, [32, 20, 9], [32, 20, 9], "right", True)
    if edit == "hole":
        m[0, 0, 20, 3] = False
    elif edit == "extra":
        m[1, 0, 2, 5] = True  # above the diagonal
    elif edit == "random":
        m = torch.rand(3, 1, 32, 32, generator=torch.Generator().manual_seed(0)) > 0.5
    else:
        m[2, 0, 3] = False  # a padded row inside the valid ones
    assert _form(m) is None


def test_per_head_masks_and_modifiers_are_not_eligible() -> None:
    q = torch.zeros(2, 2, 16, 8)
    m = _pattern(16, 16, [16, 3], [16, 3], "right", True).expand(2, 2, 16, 16)
    req, _ = build_request(q, q, q, m, "none_front", None, "bhsd", False)
    assert not mask_forms.eligible(req)


def test_verdict_cached_per_mask_version() -> None:
    m = _pattern(32, 32, [32, 7, 1], [32, 7, 1], "right", True)
    first = _form(m)
    assert _form(m) is first
    m[0, 0, 31, 0] = False  # in place: a new version, a new verdict
    assert _form(m) is None


def test_capture_uses_a_warm_up_verdict_and_recognises_nothing(monkeypatch) -> None:
    """Under a CUDA graph capture (simulated) a mask seen eagerly keeps its verdict (the lengths
    tensors are already on the device); a new mask is not compared (no host read): None."""
    seen = _pattern(32, 32, [32, 7, 1], [32, 7, 1], "right", True)
    warm = _form(seen)
    assert warm is not None
    monkeypatch.setattr(mask_forms, "_capturing", lambda mask: True)
    monkeypatch.setattr(mask_forms, "_recognise", lambda *a: pytest.fail("recognised under capture"))
    assert _form(seen) is warm
    assert _form(_pattern(32, 32, [5, 7, 1], [5, 7, 1], "right", True)) is None
