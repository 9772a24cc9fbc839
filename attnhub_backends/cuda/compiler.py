"""NVRTC compilation of the CUDA kernels through ``cuda.core``, with a disk cache of cubins.

A kernel *variant* is one kernel source plus a few ``#define`` lines (dtype, head dims, tile sizes;
``variants.py`` builds them). Its cubin is cached under ``$ATTNHUB_CACHE_DIR`` (default ``~/.cache/attnhub/cuda``) in a file named
by the SHA-256 of the full source text, the compiler options, the GPU architecture and the NVRTC
version, so a second process loads the cubin without compiling, and any change to a kernel, an
option or the toolchain compiles afresh. Nothing here needs a GPU except :func:`load_kernel`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnhub import settings
from attnhub.errors import AttnhubError

KERNEL_DIR = Path(__file__).with_name("kernels")
_STD = "c++17"

#: Number of NVRTC compilations this process ran (tests read it to prove cache hits).
COMPILES = 0
_lock = threading.Lock()
_kernels: dict[tuple[str, int], Any] = {}
_smem_allowed: dict[tuple[str, int], int] = {}


@dataclass(frozen=True)
class Variant:
    """One compiled program: a source file, its defines and the kernels it exports."""

    source: str
    defines: tuple[tuple[str, int], ...]
    kernels: tuple[str, ...]
    headers: tuple[str, ...] = ("common.cuh",)

    @property
    def name(self) -> str:
        tail = "_".join(f"{k.lower()}{v}" for k, v in self.defines)
        return f"{Path(self.source).stem}_{tail}"

    def text(self) -> str:
        """The whole translation unit NVRTC compiles (defines, common header, kernel source)."""
        lines = [f"#define {k} {v}" for k, v in self.defines]
        parts = [(KERNEL_DIR / name).read_text() for name in (*self.headers, self.source)]
        return "\n".join(lines) + "\n" + "\n".join(parts)


def _core(*names: str) -> tuple[Any, ...]:
    """Objects of ``cuda.core`` (``cuda.core.experimental`` in cuda-core < 0.4)."""
    try:
        import cuda.core as core

        getattr(core, names[0])
    except (ImportError, AttributeError):
        import cuda.core.experimental as core  # type: ignore[no-redef]
    return tuple(getattr(core, n) for n in names)


def cache_dir() -> Path:
    """Where cubins are cached: ``$ATTNHUB_CACHE_DIR/cuda``, else ``$XDG_CACHE_HOME/attnhub/cuda``,
    else ``~/.cache/attnhub/cuda``."""
    base = settings.value("ATTNHUB_CACHE_DIR")
    if base:
        return Path(base) / "cuda"
    xdg = settings.external("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "attnhub" / "cuda"


def _include_dirs() -> list[str]:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise AttnhubError(
            "the cuda backend needs cuda-pathfinder to find cuda_fp16.h/cuda_bf16.h: pip install 'attnhub[cuda]'"
        ) from exc
    inc = find_nvidia_header_directory("cudart")
    if inc is None:
        raise AttnhubError(
            "cuda_fp16.h/cuda_bf16.h not found: install the CUDA runtime headers "
            "(pip install nvidia-cuda-runtime-cu12, part of 'attnhub[cuda]')"
        )
    return [str(inc)]


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _options(arch: str) -> tuple[str, ...]:
    return (f"arch={arch}", f"std={_STD}", f"nvrtc={nvrtc_version()}")


def cache_key(variant: Variant, arch: str) -> str:
    h = hashlib.sha256()
    h.update(variant.text().encode())
    h.update(repr(_options(arch)).encode())
    return h.hexdigest()


def compile_variant(variant: Variant, arch: str) -> bytes:
    """Compile ``variant`` for ``arch`` (e.g. ``"sm_90"``) with NVRTC; AttnhubError with the log on failure."""
    global COMPILES
    Program, ProgramOptions = _core("Program", "ProgramOptions")

    opts = ProgramOptions(arch=arch, std=_STD, include_path=_include_dirs(), name=variant.name)
    try:
        prog = Program(variant.text(), "c++", options=opts)
        obj = prog.compile("cubin")
    except Exception as exc:
        raise AttnhubError(
            f"NVRTC could not compile the cuda kernel {variant.name} for {arch}:\n{exc}"
        ) from exc
    with _lock:
        COMPILES += 1
    return bytes(obj.code)


def get_cubin(variant: Variant, arch: str) -> bytes:
    """The cubin of ``variant`` for ``arch``: from the disk cache, else compiled and stored there."""
    path = cache_dir() / f"{cache_key(variant, arch)}.cubin"
    try:
        return path.read_bytes()
    except OSError:
        pass
    data = compile_variant(variant, arch)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a compile per process
    return data


def load_kernel(variant: Variant, name: str, device_index: int, arch: str, smem: int = 0) -> Any:
    """A launchable ``cuda.core`` kernel for the current device, allowing ``smem`` bytes of dynamic smem."""
    key = (f"{variant.name}:{name}:{arch}", device_index)
    kern = _kernels.get(key)
    if kern is not None:
        if smem > _smem_allowed.get(key, 48 * 1024):
            _allow_smem(kern, smem, device_index)
            _smem_allowed[key] = smem
        return kern
    Device, ObjectCode = _core("Device", "ObjectCode")

    Device(device_index).set_current()
    obj = ObjectCode.from_cubin(get_cubin(variant, arch))
    kern = obj.get_kernel(name)
    if smem > 48 * 1024:
        _allow_smem(kern, smem, device_index)
        _smem_allowed[key] = smem
    _kernels[key] = kern
    _kernels[(key[0] + ":obj", device_index)] = obj  # keep the module alive
    return kern


def _allow_smem(kern: Any, smem: int, device_index: int) -> None:
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kern.handle
    if isinstance(handle, driver.CUkernel):
        dev = driver.CUdevice(device_index)
        (err,) = driver.cuKernelSetAttribute(attr, smem, handle, dev)
    else:
        (err,) = driver.cuFuncSetAttribute(handle, attr, smem)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise AttnhubError(f"cannot allow {smem} bytes of shared memory for the cuda kernel: {err}")
