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
