"""Measured dispatch (SPEC §8): per-device timing profiles and stored certification verdicts.

A *profile* holds, for one device (``device_key``: the GPU's name and compute capability, or
the CPU's model), the measured time of each candidate backend on a grid of *request classes*.
``backend="auto"`` orders the backends that can run a request by the times of the request's
class (:func:`lookup`); without a comparable class it keeps the declared priority order.

A request class (:func:`request_class`) is everything that decides which kernel is fastest,
with the sizes bucketed: framework, device type, dtype, rule kind, sequence rank, sync (ignored
for the full rule, where it changes nothing), head dim rounded up to a power of two, grouped
query heads or not, whether gradients are needed, and the query and key lengths as
``round(log2(L))``. Batch and head counts are not part of it: the grid keeps ``B * L`` fixed.
:func:`lookup` takes the class with the same fields whose lengths are nearest in log space,
at most :data:`MAX_DISTANCE` octaves away in total; none that near means no measurement.

*Sized* classes (``request_class(req, sized=True)``) also hold ``round(log2(B * Hq))``: the
tuner's host-bound classes (small shapes where a call costs host time, not GPU time; issue 21).
They are narrow on purpose: one applies to a request of the same fields within
:data:`SIZED_DISTANCE` octave in total over Lq, Lk and B·Hq, and is then preferred over the
unsized classes; so a small class never captures a big request (whose B·Hq or lengths differ by
more), and a small request that no sized class matches falls back to the unsized classes.

Profiles are JSON: one ships with the package for each device measured by the maintainers
(``attnhub/profiles/<slug>.json``), and ``attnhub tune`` writes the user's
(``<cache dir>/profiles/<slug>.json``; the cache dir is ``ATTNHUB_CACHE_DIR``, default
``~/.cache/attnhub``). Both are read, the user's classes replacing the shipped ones.

``attnhub certify`` stores its verdict per backend and device under ``<cache dir>/certify/``;
:func:`certify_failure` names the stored report of a backend that failed on this device, which
``auto`` then never picks.

Files are read once per process; :func:`reload` forgets them (and every dispatch decision made
with them, through :data:`on_reload`).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnhub import settings
from attnhub.request import Request
from attnhub.rules import Causal, ExplicitMask, Full, Local

SCHEMA = "attnhub-profile/1"
#: How far (in octaves of Lq plus octaves of Lk) a measured class may be from the request's.
MAX_DISTANCE = 2
#: How far (octaves of Lq, Lk and B·Hq together) a sized (host-bound) class may be from a request.
SIZED_DISTANCE = 1
#: Shipped profiles, one per measured device.
SHIPPED_DIR = Path(__file__).with_name("profiles")

#: Called after :func:`reload` (the dispatcher drops its cached decisions).
on_reload: list[Any] = []

_lock = threading.Lock()
_profiles: dict[str, Profile] = {}
_certify: dict[tuple[str, str], str] | None = None
_device_keys: dict[str, str] = {}


# --- devices -----------------------------------------------------------------------------------


def cpu_model() -> str:
    model = platform.processor() or platform.machine() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return model


def device_key(device: str) -> str | None:
    """What a profile is measured on: ``cpu:<model>`` or ``cuda:<GPU name>:sm<major><minor>``.

    For a CUDA device the name comes from torch (or JAX) when one of them is already imported;
    otherwise None (no profile applies). Never imports a framework.
    """
    found = _device_keys.get(device)
    if found is not None:
        return found
    kind, _, index = device.partition(":")
    key: str | None = None
    if kind == "cpu":
        key = f"cpu:{cpu_model()}"
    elif kind == "cuda":
        key = _cuda_key(int(index) if index.isdigit() else None)
    if key is not None:
        _device_keys[device] = key
    return key


def _cuda_key(index: int | None) -> str | None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            i = torch.cuda.current_device() if index is None else index
            major, minor = torch.cuda.get_device_capability(i)
            return f"cuda:{torch.cuda.get_device_name(i)}:sm{major}{minor}"
    except Exception:
        return None
    jax = sys.modules.get("jax")
    try:
        if jax is not None:
            gpus = [d for d in jax.devices() if d.platform == "gpu"]
            if gpus:
                d = gpus[index or 0]
                cap = getattr(d, "compute_capability", "")
                return f"cuda:{d.device_kind}:sm{str(cap).replace('.', '')}"
    except Exception:
        return None
    return None


def slug(key: str) -> str:
    """A file name for a device key: lower case, runs of other characters as one '-'."""
    return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def cache_dir() -> Path:
    base = settings.value("ATTNHUB_CACHE_DIR")
    if base:
        return Path(base)
    xdg = settings.external("XDG_CACHE_HOME")
    return Path(xdg) / "attnhub" if xdg else Path.home() / ".cache" / "attnhub"


def user_profile_path(key: str) -> Path:
    return cache_dir() / "profiles" / f"{slug(key)}.json"


# --- request classes ---------------------------------------------------------------------------

#: The fields of a class other than the lengths, in order.
FAMILY_FIELDS = ("framework", "device_type", "dtype", "rule", "ndim", "sync", "dim", "gqa", "grad")


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def _octave(n: int) -> int:
    return round(math.log2(max(n, 1)))


def rule_kind(rule: Any) -> str:
    if isinstance(rule, Full):
        return "full"
    if isinstance(rule, Causal):
        return "causal"
    if isinstance(rule, Local):
        return "local-causal" if rule.causal else "local"
    if isinstance(rule, ExplicitMask):
        return f"explicit-{rule.kind}"
    return type(rule).__name__.lower()


def request_class(req: Request, sized: bool = False) -> tuple:
    """(family, Lq octave, Lk octave): the class a request's measurements are filed under; with
    ``sized``, (family, Lq octave, Lk octave, B·Hq octave), a host-bound class."""
    kind = rule_kind(req.rule)
    family = (
        req.framework,
        req.device_type,
        req.dtype,
        kind,
        req.ndim,
        "*" if kind == "full" else req.sync,
        _pow2_ceil(max(req.dim_qk, req.dim_v)),
        req.heads_q != req.heads_kv,
        req.needs_grad,
    )
    if sized:
        return family, _octave(req.nq), _octave(req.nk), _octave(req.batch * req.heads_q)
    return family, _octave(req.nq), _octave(req.nk)


def class_to_json(cls: tuple) -> dict[str, Any]:
    family, lq, lk, *bh = cls
    return {**dict(zip(FAMILY_FIELDS, family)), "lq": lq, "lk": lk, **({"bh": bh[0]} if bh else {})}


def class_from_json(d: dict[str, Any]) -> tuple:
    family = tuple(d[f] for f in FAMILY_FIELDS)
    if "bh" in d:
        return family, int(d["lq"]), int(d["lk"]), int(d["bh"])
    return family, int(d["lq"]), int(d["lk"])


def class_text(cls: tuple) -> str:
    family, lq, lk, *bh = cls
    d = dict(zip(FAMILY_FIELDS, family))
    return (
        f"{d['framework']}/{d['device_type']} {d['dtype']} {d['rule']} D<={d['dim']}"
        f"{' gqa' if d['gqa'] else ''}{' grad' if d['grad'] else ''} Lq~2^{lq} Lk~2^{lk}"
        + (f" B*Hq~2^{bh[0]}" if bh else "")
    )


# --- profiles ----------------------------------------------------------------------------------


#: The case label prefix of classes measured on first use (``ATTNHUB_AUTOTUNE``).
FIRST_USE = "first use: "


@dataclass
class Entry:
    """One class's measurements: milliseconds per backend (None: it failed to run), and where from."""

    ms: dict[str, float | None]
    source: str
    case: str = ""


@dataclass
class Profile:
    device: str
    #: family -> {(lq, lk): Entry, and (lq, lk, bh): Entry for sized classes}
    classes: dict[tuple, dict[tuple[int, ...], Entry]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def add(self, cls: tuple, entry: Entry) -> None:
        self.classes.setdefault(cls[0], {})[tuple(cls[1:])] = entry

    def nearest(self, cls: tuple) -> tuple[tuple, Entry] | None:
        """The measured class that applies to ``cls`` and its entry: for a sized ``cls`` (with the
        B·Hq octave) the nearest sized class within :data:`SIZED_DISTANCE`, else (and for an
        unsized ``cls``) the nearest unsized class within :data:`MAX_DISTANCE`; or None."""
        family, lq, lk, *bh = cls
        row = self.classes.get(family)
        if not row:
            return None
        if bh:
            sized = [p for p in row if len(p) == 3]
            if sized:
                best = min(sized, key=lambda p: (_dist(p, (lq, lk, bh[0])), p))
                if _dist(best, (lq, lk, bh[0])) <= SIZED_DISTANCE:
                    return (family, *best), row[best]
        plain = [p for p in row if len(p) == 2]
        if not plain:
            return None
        best = min(plain, key=lambda p: (_dist(p, (lq, lk)), p))
        if _dist(best, (lq, lk)) > MAX_DISTANCE:
            return None
        return (family, *best), row[best]

    def __len__(self) -> int:
        return sum(len(r) for r in self.classes.values())


def _dist(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def _read_file(path: Path, key: str, into: Profile) -> None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if data.get("schema") != SCHEMA or data.get("device") != key:
        return
    for e in data.get("entries", []):
        try:
            ms = {str(b): (None if t is None else float(t)) for b, t in e["ms"].items()}
            into.add(class_from_json(e["class"]), Entry(ms, str(path), e.get("case", "")))
        except (KeyError, TypeError, ValueError):
            continue
    into.sources.append(str(path))


def load(key: str) -> Profile:
    """The profile of device ``key``: the shipped one, then the user's over it (read once)."""
    found = _profiles.get(key)
    if found is not None:
        return found
    with _lock:
        found = _profiles.get(key)
        if found is None:
            found = Profile(key)
            _read_file(SHIPPED_DIR / f"{slug(key)}.json", key, found)
            _read_file(user_profile_path(key), key, found)
            _profiles[key] = found
    return found


@dataclass(frozen=True)
class Measured:
    """The times that apply to a request: its nearest measured class in this device's profile."""

    device: str
    cls: tuple
    ms: dict[str, float | None]
    source: str
    exact: bool
    case: str = ""

    @property
    def origin(self) -> str:
        """Where the figures come from: "shipped profile", "first-use measurement" (the class was
        timed on its first ``auto`` call on this device) or "user profile" (``attnhub tune``)."""
        if Path(self.source).parent == SHIPPED_DIR:
            return "shipped profile"
        if self.case.startswith(FIRST_USE):
            return "first-use measurement"
        return "user profile"

    def describe(self) -> str:
        how = "" if self.exact else "nearest "
        return f"{how}measured class {class_text(self.cls)} ({self.origin}: {self.source})"


def lookup(req: Request) -> Measured | None:
    """The measurements for ``req`` on its device, or None (no profile, or no class near enough)."""
    key = device_key(req.device)
    if key is None:
        return None
    prof = load(key)
    if not prof.classes:
        return None
    cls = request_class(req, sized=True)
    hit = prof.nearest(cls)
    if hit is None:
        return None
    found, entry = hit
    return Measured(key, found, dict(entry.ms), entry.source, found == cls[: len(found)], entry.case)


def record(
    key: str,
    results: list[tuple],
    meta: dict,
    out: Path | None = None,
) -> Path:
    """Add measured classes to the profile file ``out`` (default: the user's for ``key``; a directory:
    the device's file in it), replacing classes measured before, and to this process's profile;
    dispatch decisions are dropped.

    Each result is ``(class, ms per backend, case label)`` or, with a fourth item, also how each
    backend's figure was measured (kept in the entry as ``"how"``)."""
    path = Path(out) if out is not None else user_profile_path(key)
    if path.is_dir():
        path = path / f"{slug(key)}.json"
    entries: dict[tuple, dict[str, Any]] = {}
    if path.exists():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
            if old.get("schema") == SCHEMA and old.get("device") == key:
                for e in old.get("entries", []):
                    entries[_freeze(e["class"])] = e
        except (OSError, ValueError, KeyError, TypeError):
            pass
    for cls, ms, case, *how in results:
        d = class_to_json(cls)
        entries[_freeze(d)] = {"class": d, "case": case, "ms": ms, **({"how": how[0]} if how else {})}
    payload = {
        "schema": SCHEMA,
        "device": key,
        "meta": {**meta, "updated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
        "entries": sorted(entries.values(), key=lambda e: json.dumps(e["class"], sort_keys=True)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    reload()
    return path


def _freeze(d: dict[str, Any]) -> tuple:
    return tuple(sorted((k, json.dumps(v)) for k, v in d.items()))


def reload() -> None:
    """Forget the profiles and certification verdicts read so far (and the dispatch decisions)."""
    global _certify
    with _lock:
        _profiles.clear()
        _certify = None
    for callback in on_reload:
        callback()


# --- certification verdicts --------------------------------------------------------------------


def certify_report_path(backend: str, key: str) -> Path:
    return cache_dir() / "certify" / f"{backend}--{slug(key)}.json"


def store_certify_report(report: dict[str, Any]) -> Path | None:
    """Keep ``attnhub certify``'s verdict for its backend on this device (None: device unknown)."""
    key = device_key(str(report.get("device", "cpu")))
    if key is None:
        return None
    path = certify_report_path(str(report["backend"]), key)
    kept = {k: report.get(k) for k in ("schema", "backend", "mode", "seed", "device", "date", "command")}
    kept.update(device_key=key, summary=report.get("summary", {}), suspects=report.get("suspects", []))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=1) + "\n", encoding="utf-8")
    reload()
    return path


def _certify_failures() -> dict[tuple[str, str], str]:
    """(backend, device key) -> report path, for every stored report with a failing case."""
    global _certify
    found = _certify
    if found is not None:
        return found
    found = {}
    folder = cache_dir() / "certify"
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError:
        paths = []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data["summary"].get("failed", 0) > 0:
                found[(str(data["backend"]), str(data["device_key"]))] = str(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    _certify = found
    return found


def certify_failure(backend: str, device: str) -> str | None:
    """The stored report saying ``backend`` failed certification on ``device``'s device, or None."""
    failures = _certify_failures()
    if not failures:
        return None
    key = device_key(device)
    return None if key is None else failures.get((backend, key))
