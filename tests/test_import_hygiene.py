"""`import attnhub` loads no framework; backends load theirs lazily."""

import subprocess
import sys

FRAMEWORKS = ["torch", "tensorflow", "jax", "triton", "poptorch"]


def test_import_attnhub_imports_no_framework():
    code = f"import sys, attnhub, attnhub.cli; print([m for m in {FRAMEWORKS!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_numpy_call_through_reference_imports_no_framework():
    code = (
        "import sys, numpy as np, attnhub; x = np.ones((1, 1, 4, 8));"
        "attnhub.attention(x, x, x, backend='reference');"
        f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_command_line_imports_no_test_framework():
    """pytest and hypothesis are the `certify` extra: the CLI (certify's module too) loads without them."""
    code = (
        "import sys, attnhub.cli, attnhub.cli.info, attnhub.cli.demo, attnhub.cli.bench, attnhub_conformance.cli;"
        "print([m for m in ('pytest', 'hypothesis') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _run_fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter; its stdout."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_framework_submodules_are_lazy_attributes():
    """``dir(attnhub)`` names the submodules, yet listing them imports no framework."""
    code = (
        "import sys, attnhub; names = dir(attnhub);"
        "print([n for n in ('torch', 'tf', 'keras', 'ipu', 'integrations', 'distributed') if n not in names],"
        f" [m for m in {FRAMEWORKS!r} if m in sys.modules])"
    )
    assert _run_fresh(code) == "[] []"


def test_attnhub_torch_patch_sdpa_resolves_after_bare_import():
    """The README's ``import attnhub; attnhub.torch.patch_sdpa()`` works without importing attnhub.torch."""
    code = (
        "import sys, attnhub; assert 'torch' not in sys.modules;"
        "print(callable(attnhub.torch.patch_sdpa), attnhub.torch is sys.modules['attnhub.torch'],"
        " 'torch' in sys.modules)"
    )
    assert _run_fresh(code) == "True True True"


def test_attnhub_integrations_resolves_after_bare_import():
    code = "import sys, attnhub; print(attnhub.integrations.__name__, 'torch' in sys.modules)"
    assert _run_fresh(code) == "attnhub.integrations False"


def test_unknown_attribute_still_raises_attribute_error():
    code = (
        "import attnhub\n"
        "try:\n    attnhub.no_such_thing\nexcept AttributeError as exc:\n    print('AttributeError', exc)\n"
        "print(callable(attnhub.tune))"
    )
    out = _run_fresh(code).splitlines()
    assert out[0] == "AttributeError module 'attnhub' has no attribute 'no_such_thing'"
    assert out[1] == "True"
