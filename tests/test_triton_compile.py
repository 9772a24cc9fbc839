"""Compile latency: calls that differ only in their lengths compile no new Triton kernel.

Triton compiles a kernel once per *specialisation*: its constexprs and launch options, and per
runtime argument its type and, for integers, whether it equals 1 or is divisible by 16 (pointers:
16-byte alignment). The CPU tests here run the launch code with the device decisions of an H100
(configs, TMA, split-KV) and Triton's own argument binder for sm90, without running a kernel, and
compare the specialisations launched for different lengths. The GPU tests count the kernels that
Triton's per-device caches hold.

Kernels take strides and modifier operands as tuples and their constexprs as named tuples
(``args.py``); the recorder flattens both, naming each member as the kernel's prologue unpacks it
(``sqb, sqh, sqn, sqd = sq``), so that keys compare per member as for separate arguments.

The dense kernels' ``Nq``/``Nk`` are unspecialised as built (``kernels.FWD_SEQ_ARGS`` and
``BWD_SEQ_ARGS``); emptying a list specialises them again, and a length that moves across a
multiple of 16 then compiles exactly one more variant of each kernel taking it. The CPU tests run
in both settings (``SEQ_MODES``): as built, and with Nq/Nk specialised in every dense kernel. The
GPU tests read the lists of the kernels they run and allow what those lists imply.
"""

from __future__ import annotations

import ast
import copy
import inspect
import math
import textwrap
from collections import OrderedDict
from typing import Any

import pytest
import torch

from attnhub.operands import Operands
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local
from attnhub_backends.triton import configs, device, launch, loader, ragged_launch, shape
from attnhub_backends.triton.modifiers import Mods

KERNELS = ("fwd_kernel", "combine_kernel", "bwd_prep_kernel", "dkdv_kernel", "dq_kernel")
RAGGED_KERNELS = ("table_kernel", "fwd_kernel", "dkdv_kernel", "dq_kernel")
SEQ_NAMES = ("Nq", "Nk")
#: "as built": the kernels as declared; "Nq/Nk specialised": as if FWD_SEQ_ARGS and BWD_SEQ_ARGS
#: were emptied (Triton specialising every dense kernel's Nq and Nk again).
SEQ_MODES = ("as built", "Nq/Nk specialised")


def _int_class(n: int) -> str:
    """Triton's specialisation of an integer argument: 1, divisible by 16, or neither."""
    return "1" if n == 1 else "D" if n % 16 == 0 else ""


def _members(fn: Any) -> dict[str, Any]:
    """Member names of a kernel's tuple arguments, from the unpacking statements at the top level
    of its body (``a, b, d = arg`` then ``b1, b2 = b``: {"arg": ["a", ["b1", "b2"], "d"]})."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    unpacked: dict[str, list] = {}
    for stmt in tree.body[0].body:  # type: ignore[attr-defined]
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name):
            target = stmt.targets[0]
            if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
                unpacked[stmt.value.id] = [e.id for e in target.elts]  # type: ignore[attr-defined]

    def resolve(name: str) -> Any:
        return [resolve(m) for m in unpacked[name]] if name in unpacked else name

    return {p: resolve(p) for p in fn.arg_names if p in unpacked}


def _flat(name: str, entry: Any, members: Any) -> list[tuple[str, Any]]:
    """(member name, specialisation) of one argument's binding: a tuple argument per member
    (named as ``members`` says, else ``name[i]``), a named-tuple constexpr per field."""
    kind, key = entry
    if kind == "constexpr" and hasattr(key, "_fields"):
        return [(f, ("constexpr", v)) for f, v in zip(key._fields, key, strict=True)]
    if isinstance(kind, tuple):
        out = []
        for i, (k, v) in enumerate(zip(kind, key, strict=True)):
            sub = members[i] if isinstance(members, list) else f"{name}[{i}]"
            out += _flat(sub if isinstance(sub, str) else f"{name}[{i}]", (k, v), sub)
        return out
    return [(name, entry)]


def _respecialised(params: list, names: tuple[str, ...]) -> list:
    out = []
    for p in params:
        if p.name in names:
            p = copy.copy(p)
            p.do_not_specialize = False
        out.append(p)
    return out


class _Recorder:
    """Stands in for the kernels modules (dense and ragged): records the compile key of every
    launch, runs nothing. ``specialise``: argument names bound as if left out of
    do_not_specialize."""

    def __init__(self, specialise: tuple[str, ...] = ()) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        backend = make_backend(GPUTarget("cuda", 90, 128))
        self.dense = loader.kernels(interpret=False)
        self.ragged = loader.load("ragged_kernels.py", interpret=False)
        self.params: dict[tuple[str, str], list] = {}
        self.binders: dict[tuple[str, str], Any] = {}
        self.members: dict[tuple[str, str], dict[str, Any]] = {}
        #: Per kernel ("tag" + name), the flattened argument names of its keys (see ``_flat``).
        self.flat_names: dict[str, list[str]] = {}
        for tag, module, names in (("", self.dense, KERNELS), ("ragged.", self.ragged, RAGGED_KERNELS)):
            for name in names:
                fn = getattr(module, name)
                params = _respecialised(fn.params, specialise) if tag == "" else fn.params
                self.params[(tag, name)] = params
                self.binders[(tag, name)] = create_function_from_signature(fn.signature, params, backend)
                self.members[(tag, name)] = _members(fn)
        self.keys: set[tuple] = set()

    def module(self, tag: str) -> Any:
        """A kernels module whose kernels record (``tag`` "" dense, "ragged." ragged)."""
        rec, base = self, self.dense if tag == "" else self.ragged

        class _Module:
            def __getattr__(self, name: str) -> Any:
                if (tag, name) not in rec.binders:
                    return getattr(base, name)

                class _Indexed:
                    def __getitem__(self, grid: Any) -> Any:
                        def call(*args: Any, **kwargs: Any) -> None:
                            _, spec, options = rec.binders[(tag, name)](*args, **kwargs)
                            members = rec.members[(tag, name)]
                            flat = [
                                m
                                for p, entry in zip(rec.params[(tag, name)], spec, strict=True)
                                for m in _flat(p.name, entry, members.get(p.name))
                            ]
                            rec.flat_names[tag + name] = [n for n, _ in flat]
                            rec.keys.add(
                                (tag + name, tuple(str(e) for _, e in flat), tuple(sorted(options.items())))
                            )

                        return call

                return _Indexed()

        return _Module()

    def specialised(self, name: str) -> tuple[str, ...]:
        """The dense kernel's length arguments (Nq, Nk) that Triton specialises in this binding."""
        params = self.params.get(("", name), [])
        return tuple(p.name for p in params if p.name in SEQ_NAMES and not p.do_not_specialize)

    def names(self, key: tuple) -> list[str]:
        """The (flattened) argument names of a key's specialisation entries."""
        return self.flat_names[key[0]]


@pytest.fixture(params=SEQ_MODES)
def h100(request, monkeypatch) -> _Recorder:
    """launch.py and ragged_launch.py deciding as on one H100 (132 SMs, sm90), kernels recorded
    instead of run; in each of ``SEQ_MODES``."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "0")  # no tuning records read from this machine
    for name in ("ATTNHUB_TRITON_TMA", "ATTNHUB_TRITON_SPLITS", *configs.CFG_SETTING.values()):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(device, "on_gpu", lambda dev: True)
    monkeypatch.setattr(device, "sm_count", lambda dev: 132)
    monkeypatch.setattr(ragged_launch, "_on_gpu", lambda dev: True)
    monkeypatch.setattr(ragged_launch, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(device, "capability", lambda dev: (9, 0))
    monkeypatch.setattr(launch, "_FWD_LAUNCHES", OrderedDict())
    monkeypatch.setattr(ragged_launch, "_PLANS", OrderedDict())
    monkeypatch.setattr(configs, "_CHOSEN", {})
    rec = _Recorder(SEQ_NAMES if request.param == SEQ_MODES[1] else ())
    monkeypatch.setattr(launch, "kernels", lambda: rec.module(""))
    monkeypatch.setattr(ragged_launch, "dense_kernels", lambda: rec.module(""))
    monkeypatch.setattr(ragged_launch, "_kernels", lambda: rec.module("ragged."))
    return rec


def _request(
    nq: int, nk: int, d: int, hq: int, hkv: int, b: int, rule: Any, dtype: torch.dtype, **extra: Any
) -> Request:
    return Request(
        "torch", "cuda:0", str(dtype).removeprefix("torch."), "bhsd", b, hq, hkv, (nq,), (nk,), d, d, rule,
        "none_front", 1 / math.sqrt(d), **extra,
    )  # fmt: skip


def _call(
    rec: _Recorder, nq: int, nk: int, *, d: int = 128, hq: int = 2, hkv: int = 2, b: int = 1,
    rule: Any = None, dtype: torch.dtype = torch.bfloat16, backward: bool = False,
    mods: Mods | None = None, **extra: Any,
) -> set[tuple]:  # fmt: skip
    """The compile keys one dense call launches (forward, and backward where asked)."""
    rule = Causal() if rule is None else rule
    q = torch.zeros(b, hq, nq, d, dtype=dtype)
    k = torch.zeros(b, hkv, nk, d, dtype=dtype)
    v = torch.zeros(b, hkv, nk, d, dtype=dtype)
    req = _request(nq, nk, d, hq, hkv, b, rule, dtype, **extra)
    rec.keys = set()
    out, lse = launch.forward(q, k, v, req, mods=mods)
    if backward:
        launch.backward(q, k, v, out, lse, torch.zeros_like(out), req, mods)
    return rec.keys


def _names(keys: set[tuple]) -> list[str]:
    return sorted(k[0] for k in keys)


def _split(keys: set[tuple]) -> bool:
    return "combine_kernel" in _names(keys)


def _state(rec: _Recorder, keys: set[tuple]) -> tuple[bool, str]:
    """The forward's two switches that follow lengths by design: split-KV, and EVEN_K (the pointer
    band walk's key count being a multiple of its key tile)."""
    (fwd,) = [k for k in keys if k[0] == "fwd_kernel"]
    return _split(keys), fwd[1][rec.names(fwd).index("EVEN_K")]


def _strip(rec: _Recorder, keys: set[tuple]) -> set[tuple]:
    """The keys with every dense kernel's Nq/Nk entry blanked: what no length may change."""
    out = set()
    for name, spec, options in keys:
        names = rec.names((name, spec, options))
        spec = tuple("len" if n in SEQ_NAMES and not name.startswith("ragged.") else s
                     for n, s in zip(names, spec, strict=True))  # fmt: skip
        out.add((name, spec, options))
    return out


def _classes(rec: _Recorder, nq: int, nk: int) -> tuple:
    """The specialisation classes of (Nq, Nk) that the recorder's binding tells apart."""
    specialised = {n for name in KERNELS for n in rec.specialised(name)}
    return tuple(_int_class(x) for n, x in (("Nq", nq), ("Nk", nk)) if n in specialised)


def _moves_share_kernels(rec: _Recorder, moves: list[tuple[int, int]], call: Any) -> dict:
    """Call ``call(nq, nk)`` for each move: calls in the same forward state (``_state``) and the same
    classes of their specialised lengths launch the very same kernels, and any two in the same
    state differ in nothing but specialised Nq/Nk entries. Returns the kernels per group, keyed by
    (state, classes)."""
    groups: dict[tuple, set[tuple]] = {}
    stripped: dict[tuple, set[tuple]] = {}
    for nq, nk in moves:
        keys = call(nq, nk)
        state = _state(rec, keys)
        assert _strip(rec, keys) == stripped.setdefault(state, _strip(rec, keys)), (nq, nk)
        assert keys == groups.setdefault((state, _classes(rec, nq, nk)), keys), (nq, nk)
    return groups


# Lengths that are and are not multiples of 16 and of the tiles (Triton's and the kernels' special
# cases), Lk alone, Lq alone and both moving; split-KV on for some (few query tiles x heads, at
# least MIN_SPLIT_VISITS key tiles), off for others.
LENGTHS = [(1777, 1001), (1777, 1777), (1024, 1777), (4096, 1777), (4096, 4096), (1024, 2048), (2000, 3000),
           (1777, 3001), (300, 1001), (300, 1777), (300, 4096), (257, 4096), (320, 1024), (4000, 4000),
           (1776, 1776), (1000, 3000)]  # fmt: skip

CASES = {
    "bf16 D=128 causal": (torch.bfloat16, 128, Causal()),
    "bf16 D=128 full": (torch.bfloat16, 128, Full()),
    "bf16 D=64 causal": (torch.bfloat16, 64, Causal()),
    "fp32 D=64 full": (torch.float32, 64, Full()),
    "bf16 D=128 local": (torch.bfloat16, 128, Local(256, causal=True)),
    "fp16 D=80 causal": (torch.float16, 80, Causal()),
}


@pytest.mark.parametrize("case", CASES)
def test_lengths_share_one_forward_and_backward(h100, case) -> None:
    dtype, d, rule = CASES[case]
    groups = _moves_share_kernels(
        h100, LENGTHS, lambda nq, nk: _call(h100, nq, nk, d=d, dtype=dtype, rule=rule, backward=True)
    )
    for keys in groups.values():
        assert {"fwd_kernel", "bwd_prep_kernel", "dkdv_kernel", "dq_kernel"} <= set(_names(keys))
    if not _classes(h100, 17, 17):  # as built: one set of kernels per forward state
        assert len(groups) == len({state for state, _ in groups}) <= 4


def _new_variants(rec: _Recorder, old: set[tuple], new: set[tuple]) -> dict[str, list[str]]:
    """Per kernel launched in ``new`` but not ``old``: the arguments its one new key differs in
    from the key of the same kernel in ``old``."""
    out = {}
    for key in new - old:
        (before,) = [k for k in old if k[0] == key[0]]
        names = rec.names(key)
        out[key[0]] = [n for n, a, b in zip(names, before[1], key[1], strict=True) if a != b]
    assert len(out) == len(new - old)  # at most one new variant per kernel
    return out


def test_a_length_crossing_a_multiple_of_16(h100) -> None:
    """Lk 1001 -> 1777 compiles nothing in either setting. Lk 1001 -> 1024 (and Lq 300 -> 320)
    compiles nothing where Nk (Nq) is unspecialised, else exactly one more variant of each kernel
    that takes it, differing in that argument only."""
    call = lambda nq, nk: _call(h100, nq, nk, backward=True)  # noqa: E731
    base = call(300, 1001)
    assert not _split(base)  # a causal Lq = 300 visits few key tiles: no split-KV in these moves
    assert call(300, 1777) == base
    assert call(1000, 1777) == base
    takes = {
        "fwd_kernel": SEQ_NAMES,
        "bwd_prep_kernel": ("Nq",),
        "dkdv_kernel": SEQ_NAMES,
        "dq_kernel": SEQ_NAMES,
    }
    for moved, (nq, nk) in (("Nk", (300, 1024)), ("Nq", (320, 1001))):
        want = {
            name: [moved] for name, args in takes.items() if moved in args and moved in h100.specialised(name)
        }
        assert _new_variants(h100, base, call(nq, nk)) == want, moved


def test_split_kv_is_the_only_length_dependent_forward_switch(h100) -> None:
    """Across prefill lengths a shape class compiles at most two forwards, with and without
    split-KV (the SPLIT constexpr), and one backward (Nq/Nk entries aside)."""
    keys: set[tuple] = set()
    for nq, nk in LENGTHS:
        keys |= _strip(h100, _call(h100, nq, nk, backward=True))
    fwd = [k for k in keys if k[0] == "fwd_kernel"]
    assert _names(keys) == [
        "bwd_prep_kernel", "combine_kernel", "dkdv_kernel", "dq_kernel", "fwd_kernel", "fwd_kernel"
    ]  # fmt: skip
    differ = [i for i, (a, b) in enumerate(zip(fwd[0][1], fwd[1][1], strict=True)) if a != b]
    names = h100.names(fwd[0])
    assert [names[i] for i in differ] == ["O", "SPLIT"]  # O: float32 partials when split


def test_pointer_band_walk_has_an_even_key_variant(h100) -> None:
    """Where the band walk loads K/V through pointers (head dims without TMA, older GPUs), key
    counts that are a multiple of the key tile compile a second forward without bounds masks
    (EVEN_K); with TMA (16-bit, D = 128 on sm90) there is one forward for every key count."""
    odd = _call(h100, 1777, 1001, d=80, dtype=torch.float16)
    even = _call(h100, 1024, 1024, d=80, dtype=torch.float16)
    assert not _split(odd) and not _split(even)
    (a,), (b,) = [[k for k in _strip(h100, keys) if k[0] == "fwd_kernel"] for keys in (odd, even)]
    names = h100.names(a)
    assert [names[i] for i, (x, y) in enumerate(zip(a[1], b[1], strict=True)) if x != y] == ["EVEN_K"]
    assert _strip(h100, _call(h100, 1777, 1001)) == _strip(h100, _call(h100, 1024, 1024))  # D = 128, TMA


def test_decode_lengths_share_one_forward_and_combine(h100) -> None:
    """Decoding (Lq = 1, GQA 32/8): split-KV from 16 key tiles of 128 on (Lk > 1920), its factor
    following Lk (4 at 2048, 9 at 8k with B = 1, 32 at 32k) as a runtime value, so is the combine
    kernel's split tile; below, every Lk shares one forward without split-KV."""
    call = lambda nq, nk, b=1: _call(h100, nq, nk, hq=32, hkv=8, b=b, rule=Full())  # noqa: E731
    moves = [(1, 2048), (1, 1921), (1, 3001), (1, 8192), (1, 32768), (1, 20000)]
    groups = _moves_share_kernels(h100, moves, call)
    for nq, nk in moves[:4]:  # B = 8: other split factors, the same kernels
        keys = call(nq, nk, b=8)
        assert keys == groups[(_state(h100, keys), _classes(h100, nq, nk))], nk
    assert all(split for (split, _), _ in groups)
    assert _names(next(iter(groups.values()))) == ["combine_kernel", "fwd_kernel"]
    short = _moves_share_kernels(h100, [(1, 1001), (1, 1777), (1, 1920), (1, 16)], call)
    assert not any(split for (split, _), _ in short)
    if not _classes(h100, 17, 17):  # as built: one forward per split-KV state
        assert len(groups) == len(short) == 1


def test_decode_and_prefill_are_different_kernels_by_design(h100) -> None:
    """Lq = 1 packs a GQA group's rows into one 16-row tile (a decode kernel, with its one row
    folded in: NQ1); Lq = 300 tiles the queries (the prefill kernel). The move compiles the
    prefill kernel once, then no prefill length compiles again."""
    full = Full()
    decode = _call(h100, 1, 1777, hq=32, hkv=8, rule=full)
    prefill = _call(h100, 300, 1777, hq=32, hkv=8, rule=full)
    assert decode != prefill
    assert _call(h100, 1000, 1777, hq=32, hkv=8, rule=full) == prefill
    assert _call(h100, 2, 1777, hq=32, hkv=8, rule=full) != decode  # NQ1: one query row
    assert _call(h100, 3, 1777, hq=32, hkv=8, rule=full) == _call(h100, 2, 1777, hq=32, hkv=8, rule=full)


def _differing(rec: _Recorder, a: set[tuple], b: set[tuple], kernel: str) -> list[str]:
    """The arguments in which ``kernel``'s one key in ``a`` and in ``b`` differ."""
    ((ka,), (kb,)) = [[k for k in keys if k[0] == kernel] for keys in (a, b)]
    return [n for n, x, y in zip(rec.names(ka), ka[1], kb[1], strict=True) if x != y]


def test_offsets_softcap_sinks_compile_nothing_new(h100) -> None:
    """SPEC §9/§11 arguments: a new q_offset/k_offset (folded into the position shifts) or a new
    length with softcap and sinks compiles nothing (Nq/Nk, where specialised, by class only)."""
    mods = Mods(sinks=torch.zeros(4), softcap=30.0)
    # batch 16: enough (query tile, head) programs that no length here takes split-KV (softcap's
    # 64-row query tiles would split a single sequence's few programs at these lengths)

    def call(nq: int, nk: int, off: int = 0) -> set[tuple]:
        return _call(
            h100, nq, nk, hq=4, hkv=2, b=16, backward=True, mods=mods, softcap=30.0, sinks=True,
            sinks_grad=True, q_offset=off, k_offset=off // 2,
        )  # fmt: skip

    base = call(1777, 1001)
    plain = _call(h100, 1777, 1001, hq=4, hkv=2, b=16, backward=True)
    assert not _split(base)
    assert {"SOFTCAP", "HAS_SINKS"} <= set(_differing(h100, plain, base, "fwd_kernel"))
    assert "SOFTCAP" in _differing(h100, plain, base, "dq_kernel")
    for nq, nk, off in [
        (1777, 1777, 0),
        (999, 1777, 0),
        (1777, 1001, 5),
        (1777, 1001, 4096),
        (301, 1001, 77),
    ]:
        assert call(nq, nk, off) == base, (nq, nk, off)
    moved = call(1777, 1024, 3)
    assert _strip(h100, moved) == _strip(h100, base)


def test_bias_and_mask_lengths_in_one_class_compile_nothing_new(h100) -> None:
    """A (1, 1, Lq, Lk) bias or a (1, H, Lq, Lk) boolean mask: its strides follow Lk and stay
    specialised like every stride, so a new length compiles nothing while Lk stays in its class of
    16 (here: not a multiple), and a move across a multiple of 16 differs in those strides (and
    Nq/Nk where specialised) only, and for the bias in EVEN_K (its forward takes pointer loads,
    whose band walk switches by design when Lk becomes a multiple of the key tile: see _state).
    The mask plan's row strides (plan_h: 14 query tiles at Lq = 1777, 16 at 2047) are
    unspecialised."""

    def call(nq: int, nk: int, kind: str) -> set[tuple]:
        if kind == "bias":
            mods = Mods(bias=torch.zeros(1, 1, nq, nk))
            return _call(h100, nq, nk, backward=True, mods=mods, bias=(1, 1, nq, nk), bias_grad=True)
        mask = torch.ones(1, 2, nq, nk, dtype=torch.bool).view(torch.uint8)
        rule = ExplicitMask("bool", (1, 2, nq, nk))
        # 48 batch entries: enough (query tile, head) programs at every length here (3 query tiles
        # of 128 rows at Lq = 301) that split-KV stays off
        return _call(h100, nq, nk, b=48, backward=True, rule=rule, mods=Mods(mask=mask))

    for kind, strides in (("bias", {"sbm", "EVEN_K"}), ("mask", {"smm", "smh"})):
        base = call(1777, 1001, kind)
        assert not _split(base)
        for nq, nk in [(1777, 1777), (999, 1777), (301, 1001), (2047, 1001)]:
            assert call(nq, nk, kind) == base, (kind, nq, nk)
        moved = call(1777, 1024, kind)
        for name in ("fwd_kernel", "dq_kernel"):
            want = strides - {"EVEN_K"} if name == "dq_kernel" else strides
            assert set(_differing(h100, base, moved, name)) - {"Nk"} == want, (kind, name)


def test_tuning_keys_have_no_lengths(h100) -> None:
    """A config is chosen per shape class: lengths never pick another config (another compile)."""
    x = torch.zeros(1, 2, 8, 128, dtype=torch.bfloat16)
    reqs = [
        _request(nq, nk, 128, 2, 2, 1, Causal(), torch.bfloat16)
        for nq, nk in [(300, 1777), (1777, 1001), (4096, 16384)]
    ]
    for kernel in ("fwd", "dkdv", "dq"):
        assert len({shape.config_key(kernel, r, x) for r in reqs}) == 1


# --- ragged kernels (SPEC §10-§11) -----------------------------------------------------------------


def _ragged(
    rec: _Recorder, *, lq: int, lk: int, b: int = 2, hq: int = 8, hkv: int = 2, d: int = 128,
    q_lengths: list[int] | None = None, k_lengths: list[int] | None = None, varlen: tuple | None = None,
    paged: int = 0, rule: Any = None, backward: bool = False, offsets: tuple[int, int] = (0, 0),
) -> set[tuple]:  # fmt: skip
    """The compile keys of one ragged call (padded lengths, packed sequences or a paged cache)."""
    from tests.ragged_dense import case_request

    rule = Causal() if rule is None else rule
    i32 = dict(dtype=torch.int32)
    extra: dict[str, Any] = dict(q_offset=offsets[0], k_offset=offsets[1], needs_grad=backward)
    if varlen is not None:
        cu_q = [0, *torch.tensor(varlen[0]).cumsum(0).tolist()]
        cu_k = [0, *torch.tensor(varlen[1]).cumsum(0).tolist()]
        lq, lk, b = cu_q[-1], cu_k[-1], 1
        ops = Operands(cu_seqlens_q=torch.tensor(cu_q, **i32), cu_seqlens_k=torch.tensor(cu_k, **i32),
                       max_seqlen_q=max(varlen[0]), max_seqlen_k=max(varlen[1]))  # fmt: skip
        extra.update(varlen=True)
    else:
        ops = Operands(
            q_lengths=None if q_lengths is None else torch.tensor(q_lengths, **i32),
            k_lengths=None if k_lengths is None else torch.tensor(k_lengths, **i32),
        )
        extra.update(q_lengths=q_lengths is not None, k_lengths=k_lengths is not None)
    q = torch.zeros(b, hq, lq, d, dtype=torch.bfloat16)
    k = v = torch.zeros(b, hkv, lk, d, dtype=torch.bfloat16)
    if paged:
        per = lk // paged
        k = v = torch.zeros(b * per, paged, hkv, d, dtype=torch.bfloat16)
        ops = Operands(k_lengths=ops.k_lengths, block_table=torch.zeros(b, per, **i32))
        extra.update(paged=paged)
    req = case_request("bfloat16", b, hq, hkv, lq, lk, d, d, rule, "none_front", device="cuda:0", **extra)
    rec.keys = set()
    out, lse = ragged_launch.forward(q, k, v, req, ops)
    if backward:
        ragged_launch.backward(q, k, v, out, lse, torch.zeros_like(out), req, ops)
    return rec.keys


def test_ragged_new_lengths_compile_nothing_new(h100) -> None:
    """Padded batches (q_lengths/k_lengths), packed sequences (cu_seqlens: new totals and
    max_seqlen) and offsets: forward and backward compile nothing for new lengths (the dense
    bwd_prep kernel's Nq, where specialised, by class only)."""
    pad = lambda lq, lk, ql, kl, off=(0, 0): _ragged(  # noqa: E731
        h100, lq=lq, lk=lk, q_lengths=ql, k_lengths=kl, backward=True, offsets=off
    )
    base = pad(1001, 1777, [1001, 500], [1777, 3])
    assert "ragged.dkdv_kernel" in _names(base) and "bwd_prep_kernel" in _names(base)
    for args in [(1001, 1777, [7, 1000], [1, 1776]), (1777, 3001, [1777, 1], [3001, 3001]),
                 (1001, 1777, [1001, 500], [1777, 3], (5, 77)), (999, 4095, [9, 9], [4095, 0], (1024, 3)),
                 (1024, 1777, [1024, 3], [1777, 5])]:  # fmt: skip
        keys = pad(*args)
        if _classes(h100, args[0], 1) == _classes(h100, 1001, 1):
            assert keys == base, args
        assert _strip(h100, keys) == _strip(h100, base), args
    packed = lambda lens_q, lens_k: _ragged(  # noqa: E731
        h100, lq=0, lk=0, varlen=(lens_q, lens_k), backward=True
    )
    base = packed([300, 77, 1000], [300, 77, 1000])
    for lens in [
        ([5, 900], [5, 900]),
        ([301, 78, 1001, 16], [301, 78, 1001, 16]),
        ([2001], [4001]),
        ([304, 80, 1008], [300, 77, 1000]),
    ]:  # a total of 1392 = 87 x 16
        keys = packed(*lens)
        if _classes(h100, sum(lens[0]), 1) == _classes(h100, 1377, 1):
            assert keys == base, lens
        assert _strip(h100, keys) == _strip(h100, base), lens


def test_ragged_decode_lengths_share_kernels(h100) -> None:
    """Decoding from a paged cache (one query per sequence, GQA 8/2): a longer cache (more key
    tiles, another split factor and chunk, a wider block table) or other sequence lengths compile
    nothing once split-KV is on; the split merge's tiles are fixed."""

    def call(max_k: int, kl: list[int], b: int = 2) -> set[tuple]:
        return _ragged(h100, lq=1, lk=max_k, b=b, k_lengths=kl, paged=16, rule=Full())

    base = call(4096, [4096, 100])
    (fwd,) = [key for key in base if key[0] == "ragged.fwd_kernel"]
    assert "True" in dict(zip(h100.names(fwd), fwd[1], strict=True))["SPLIT"]  # split-KV on
    for max_k, kl, b in [(4096, [1, 4000], 2), (8192, [8192, 8000], 2), (32768, [5, 32768], 2),
                         (65536, [65536] * 4, 4), (20000, [19999, 3], 2)]:  # fmt: skip
        assert call(max_k, kl, b) == base, (max_k, b)


# --- configs: no call-time tuning -------------------------------------------------------------------


def test_calls_do_not_tune_outside_tuning(monkeypatch) -> None:
    """Without configs.tuning() a call runs the first candidate only, however large its work."""
    ran = []
    monkeypatch.setattr(configs, "_CHOSEN", {})
    a, b = configs.Cfg(128, 128, 8, 3), configs.Cfg(64, 64, 4, 3)
    assert configs.choose(("no-tuning",), [a, b], ran.append, 1 << 40) == a
    assert ran == [a]


def test_tuning_records_its_pick(monkeypatch, tmp_path) -> None:
    """Inside configs.tuning() the pick is timed and recorded; a later process (records reloaded,
    choices forgotten) uses it, and ATTNHUB_TRITON_TUNE=0 ignores it."""
    monkeypatch.setenv("ATTNHUB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(configs, "_scope", lambda: "test GPU | triton x")
    monkeypatch.setattr(configs, "_RECORDS", None)
    monkeypatch.setattr(configs, "_CHOSEN", {})
    slow, fast = configs.Cfg(128, 128, 8, 3), configs.Cfg(64, 64, 4, 3, 128, True)
    state = {"last": None}
    monkeypatch.setattr(
        configs, "_elapsed_ms", lambda fn, n: (fn(), 2.0 if state["last"] == slow else 1.0)[1]
    )
    key = ("fwd", "cuda:0", (9, 0), "bfloat16")
    with configs.tuning():
        assert (
            configs.choose(key, [slow, fast], lambda c: state.update(last=c), 1 << 30, persist=True) == fast
        )
    assert configs.records_path() == tmp_path / "triton" / "tuned.json"
    assert configs.records_path().exists()
    for tune, want in (("1", fast), ("0", slow)):
        monkeypatch.setenv("ATTNHUB_TRITON_TUNE", tune)
        monkeypatch.setattr(configs, "_RECORDS", None)
        monkeypatch.setattr(configs, "_CHOSEN", {})
        ran = []
        assert configs.choose(key, [slow, fast], ran.append, 1 << 30, persist=True) == want
        assert ran == [want]


def test_attnhub_tune_times_inside_triton_tuning(monkeypatch) -> None:
    """``attnhub tune`` (the dispatch profile) runs its timings inside configs.tuning() (through
    ``TritonBackend.tuning``, the backends' generic hook), so the
    triton classes it meets are tuned and recorded as under ``attnhub warmup --tune``."""
    from click.testing import CliRunner

    import attnhub.tuner
    from attnhub.cli import main

    seen = []

    def fake_tune(device: str, **kwargs: Any) -> None:
        seen.append(configs._TUNE_NOW)
        raise RuntimeError("stopped here")

    monkeypatch.setattr(attnhub.tuner, "tune", fake_tune)
    result = CliRunner().invoke(main, ["tune", "--device", "cpu"])
    assert "stopped here" in result.output
    assert seen == [True] and configs._TUNE_NOW is False


# --- GPU: compiled kernels counted in Triton's caches ----------------------------------------------


def _compiled() -> int:
    mod = loader.kernels(interpret=False)
    return sum(len(cache[0]) for name in KERNELS for cache in getattr(mod, name).device_caches.values())


def _allowed_new(moves: list[tuple[int, int]], names: tuple[str, ...]) -> int:
    """New compiles the kernels as built allow over ``moves``: one per new class of a specialised
    Nq/Nk (none while FWD_SEQ_ARGS and BWD_SEQ_ARGS hold them)."""
    mod = loader.kernels(interpret=False)
    total = 0
    for name in names:
        spec = [p.name for p in getattr(mod, name).params if p.name in SEQ_NAMES and not p.do_not_specialize]
        seen = {tuple(_int_class(nq if n == "Nq" else nk) for n in spec) for nq, nk in moves}
        total += len(seen) - 1
    return total


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("hq", "hkv", "causal", "moves"),
    [
        (8, 8, True, [(2000, 3000), (2048, 4096), (4096, 4096), (4000, 4000), (3001, 3001)]),  # split-KV
        (8, 8, True, [(300, 1001), (300, 1777), (300, 4096), (320, 2048), (1777, 1001)]),  # no split
        (32, 8, False, [(1, 2049), (1, 3001), (1, 8192), (1, 4096), (1, 32768)]),  # decode, split-KV
        (32, 8, False, [(1, 1001), (1, 1777), (1, 1024), (1, 1920)]),  # decode, too few key tiles to split
    ],
)
def test_changing_lengths_compiles_nothing_new(monkeypatch, hq, hkv, causal, moves) -> None:
    import attnhub

    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "0")
    for name in ("ATTNHUB_TRITON_TMA", "ATTNHUB_TRITON_SPLITS", *configs.CFG_SETTING.values()):
        monkeypatch.delenv(name, raising=False)
    grad = moves[0][0] > 16

    def call(nq: int, nk: int) -> None:
        q = torch.randn(1, hq, nq, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        k = torch.randn(1, hkv, nk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        v = torch.randn(1, hkv, nk, 128, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        out = attnhub.attention(q, k, v, mask=attnhub.Causal() if causal else None, backend="triton")
        if grad:
            out.float().sum().backward()
        torch.cuda.synchronize()

    call(*moves[0])
    before = _compiled()
    assert before > 0
    for nq, nk in moves[1:]:
        call(nq, nk)
    allowed = _allowed_new(moves, KERNELS)
    assert _compiled() - before <= allowed, f"{_compiled() - before} new kernel(s), {allowed} allowed"


@pytest.mark.gpu
def test_ragged_decode_compiles_nothing_new(monkeypatch) -> None:
    """attention_kvcache-style decoding from a paged cache: new cache lengths compile nothing."""
    monkeypatch.delenv("ATTNHUB_TRITON_SPLITS", raising=False)
    mod = loader.load("ragged_kernels.py", interpret=False)

    def compiled() -> int:
        return sum(len(c[0]) for n in RAGGED_KERNELS for c in getattr(mod, n).device_caches.values())

    def call(max_k: int, kl: list[int]) -> None:
        from tests.ragged_dense import case_request

        b, hq, hkv, d, block = len(kl), 32, 8, 128, 16
        per = max_k // block
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b * per, block, hkv, d, device="cuda", dtype=torch.bfloat16)
        table = torch.randperm(b * per, device="cuda", dtype=torch.int32).reshape(b, per)
        ops = Operands(k_lengths=torch.tensor(kl, device="cuda", dtype=torch.int32), block_table=table)
        req = case_request("bfloat16", b, hq, hkv, 1, max_k, d, d, Full(), "none_front", device="cuda:0",
                           k_lengths=True, paged=block)  # fmt: skip
        ragged_launch.forward(q, k, k, req, ops)
        torch.cuda.synchronize()

    call(4096, [4096, 100])
    before = compiled()
    for max_k, kl in [(8192, [8000, 1]), (32768, [5, 32768]), (20000, [19999, 3, 7, 8])]:
        call(max_k, kl)
    assert compiled() == before


# --- attnhub warmup -------------------------------------------------------------------------------


def test_warmup_without_a_gpu_says_so(monkeypatch) -> None:
    from click.testing import CliRunner

    from attnhub.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(main, ["warmup", "--head-dims", "64"])
    assert result.exit_code == 1
    assert "none is visible" in result.output
    result = CliRunner().invoke(main, ["warmup", "--backends", "cuda"])
    assert result.exit_code == 2 and "only triton" in result.output


def test_warmup_covers_both_classes_of_specialised_lengths(monkeypatch) -> None:
    """Where the kernels specialise Nq/Nk, warmup calls each class also at lengths that are not
    multiples of 16; as built (unspecialised) once."""
    from attnhub_backends.triton import warmup

    mod = loader.kernels(interpret=False)
    monkeypatch.setattr(mod, "FWD_SEQ_ARGS", ["Nq", "Nk"])
    monkeypatch.setattr(mod, "BWD_SEQ_ARGS", ["Nq", "Nk"])
    once = warmup.variants(64)
    monkeypatch.setattr(mod, "BWD_SEQ_ARGS", ["Nq"])
    twice = warmup.variants(64)
    assert len(twice) == 2 * len(once)
    lengths = {(s["nq"] % 16 == 0, s["nk"] % 16 == 0) for _, s in twice if s["nq"] > 1}
    assert lengths == {(True, True), (False, False)}


@pytest.mark.gpu
def test_warmup_covers_later_lengths(monkeypatch, tmp_path) -> None:
    """After ``attnhub warmup`` (one dtype, one head dim) calls at other lengths compile nothing."""
    from click.testing import CliRunner

    import attnhub
    from attnhub.cli import main

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNHUB_TRITON_TUNE", "0")
    result = CliRunner().invoke(main, ["warmup", "--dtype", "bfloat16", "--head-dims", "64"])
    assert result.exit_code == 0, result.output
    assert any(tmp_path.iterdir())  # Triton's disk cache was written
    before = _compiled()
    for b, h, nq, nk, mask in [
        (4, 32, 1777, 1001, attnhub.Causal()),
        (1, 2, 300, 1777, None),
        (8, 32, 1, 1777, None),
        (8, 32, 1, 9001, None),
    ]:
        q = torch.randn(b, h, nq, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, h // 4 if nq == 1 else h, nk, 64, device="cuda", dtype=torch.bfloat16)
        attnhub.attention(q, k, k, mask=mask, backend="triton")
    torch.cuda.synchronize()
    assert _compiled() == before


@pytest.mark.parametrize(
    "groups, lk, splits",
    [(32, 8192, 8), (32, 32768, 8), (64, 8192, 4), (128, 8192, 2), (8, 8192, 16), (64, 4096, 4),
     (256, 32768, 3), (32, 512, 1)],
)  # fmt: skip
def test_decode_splits_fill_one_wave_for_few_groups(monkeypatch, groups, lk, splits):
    """Fewer (kv head, sequence) groups than SMs: one wave of programs, DECODE_PROGRAMS_PER_SM (2)
    on each SM (H200: B 4, Hkv 8: 8 splits, 256 programs, the measured best); more groups than
    SMs: TUNE's fill per SM."""
    monkeypatch.delenv("ATTNHUB_TRITON_SPLITS", raising=False)
    monkeypatch.setattr(ragged_launch, "_on_gpu", lambda device: True)
    monkeypatch.setattr(ragged_launch, "_sm_count", lambda device: 132)
    tiles = -(-lk // ragged_launch.TUNE["decode"][0])
    got = ragged_launch._splits(tiles, groups, torch.device("cpu"))
    assert got == splits
    if groups <= 132 and tiles >= 16:
        assert groups * got <= 2 * 132


def test_the_alibi_backward_takes_its_own_tiles(h100) -> None:
    """On Hopper (16-bit, head dim 128) the ALiBi backward launches the tiles measured for it
    (``configs.alibi_backward_candidates``) and the same call without ALiBi keeps the dense pair:
    the shape class keys on ALiBi, so neither call's pick is reused for the other."""
    slopes = torch.rand(1, 2)
    _call(h100, 512, 512, backward=True, mods=Mods(alibi=slopes), more=(("alibi_slopes", (1, 2)),))
    _call(h100, 512, 512, backward=True)
    picked = {(key[0], key[-1]): cfg for key, cfg in configs.chosen().items() if key[0] != "fwd"}
    cap = (9, 0)
    for kernel in ("dkdv", "dq"):
        assert picked[(kernel, True)] == configs.alibi_backward_candidates(kernel, 128, 2, cap)[0]
        assert picked[(kernel, False)] == configs.candidates(kernel, 128, 2, cap)[0]
        assert picked[(kernel, True)] != picked[(kernel, False)]
