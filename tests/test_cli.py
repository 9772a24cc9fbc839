"""The command line: show-mask draws SPEC's examples, explain renders a table, demo runs."""

from click.testing import CliRunner

from attnhub.cli import main


def run(*args):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def grid_rows(output):
    return [line.split()[-1] for line in output.splitlines() if line.startswith("q")]


def test_show_mask_spec_1d_examples():
    # Lk = 6, Lq = 3, causal: query at position p attends keys 0..p; positions as SPEC §2 lists them.
    for sync, positions in {"scale_front": [0, 2, 4], "scale_end": [1, 3, 5],
                            "none_front": [0, 1, 2], "none_end": [3, 4, 5]}.items():  # fmt: skip
        out = run("show-mask", "--q", "3", "--k", "6", "--mask", "causal", "--sync", sync)
        rows = grid_rows(out)
        assert rows == ["#" * (p + 1) + "." * (5 - p) for p in positions], (sync, out)
        assert [int(line.split()[1][1:]) for line in out.splitlines() if line.startswith("q")] == positions


def test_show_mask_spec_2d_examples():
    out = run(
        "show-mask", "--q", "2x2", "--k", "4x4", "--mask", "local", "--window", "1", "--sync", "scale_front"
    )
    assert "q(0,0) at (0,0)" in out and "q(1,1) at (2,2)" in out
    blocks = out.split("q(")[1:]
    # scale_front: query (1,0) sits at grid (2,0) -> flat 8: the only key attended is row 2, column 0.
    rows = [line.strip() for line in blocks[2].splitlines()[1:]]
    assert rows == ["....", "....", "#...", "...."]
    out = run(
        "show-mask", "--q", "2x2", "--k", "4x4", "--mask", "local", "--window", "1", "--sync", "scale_end"
    )
    rows = [line.strip() for line in out.split("q(")[4].splitlines()[1:]]
    assert rows == ["....", "....", "....", "...#"]  # query (1,1) at flat 15


def test_show_mask_window_with_stride_and_scale_end():
    out = run("show-mask", "--q", "4", "--k", "8", "--mask", "local", "--window", "2",
              "--log2-stride", "1", "--sync", "scale_end")  # fmt: skip
    # queries at 1, 3, 5, 7; keys within +-2 at even offsets: {p-2, p, p+2}.
    assert grid_rows(out) == [".#.#....", ".#.#.#..", "...#.#.#", ".....#.#"]


def test_show_mask_png(tmp_path):
    path = tmp_path / "mask.png"
    run("show-mask", "--q", "2x2", "--k", "4x4", "--mask", "causal", "--png", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explain_cli():
    out = run("explain", "--q", "1,8,128,64", "--k", "1,2,128,64", "--framework", "numpy",
              "--device", "cpu", "--dtype", "float32", "--mask", "causal")  # fmt: skip
    assert "chosen: reference" in out and "Hq=8 Hkv=2" in out
    out = run("explain", "--q", "1,8,128,64", "--k", "1,2,128,64", "--mask", "causal")
    assert "runs on cpu devices, the inputs are on cuda:0" in out


def test_explain_cli_bad_request():
    result = CliRunner().invoke(main, ["explain", "--q", "1,6,128,64", "--k", "1,4,128,64"])
    assert result.exit_code != 0 and "heads of q" in result.output


def test_demo_runs_on_cpu_backends():
    out = run("demo")
    assert "reference" in out and "numpy" in out


def test_every_command_loads():
    """Each lazily imported command resolves (none shows up as '(unavailable: ...)')."""
    from attnhub.cli import LAZY_COMMANDS

    out = run("--help")
    assert "unavailable" not in out
    for name in LAZY_COMMANDS:
        assert name in out
        assert "Usage:" in run(name, "--help")


def test_python_m_attnhub_cli():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "attnhub.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "show-mask" in out.stdout, out.stderr


def test_info_settings_lists_every_setting_user_ones_first(monkeypatch):
    from attnhub import settings

    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("ATTNHUB_DISABLE", "tf,jax")
    monkeypatch.setenv("ATTNHUB_TRITON_TMA", "x")  # not a valid value: shown as such, no error
    monkeypatch.delenv("ATTNHUB_BACKEND", raising=False)
    out = run("info", "--settings")
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ ATTNHUB_")}
    assert list(rows) == sorted(settings.SETTINGS, key=lambda n: settings.SETTINGS[n].audience != "user")
    assert all(n in rows for n in settings.SETTINGS)
    user = [n for n, s in settings.SETTINGS.items() if s.audience == "user"]
    assert list(rows)[: len(user)] == user
    assert "tf,jax" in rows["ATTNHUB_DISABLE"] and "user" in rows["ATTNHUB_DISABLE"]
    assert "invalid" in rows["ATTNHUB_TRITON_TMA"] and "dev" in rows["ATTNHUB_TRITON_TMA"]
    assert rows["ATTNHUB_TRITON_TUNE"].split("│")[3].strip() == "1"  # default True, as a user writes it
    assert rows["ATTNHUB_BACKEND"].split("│")[5].strip() == "-"  # not set here


def test_certify_without_pytest_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "hypothesis" else real(n, *a))
    result = CliRunner().invoke(main, ["certify", "reference", "--quick"])
    assert result.exit_code != 0
    assert "needs hypothesis" in result.output and "pip install 'attnhub[certify]'" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_explain_cli_with_spec_9_to_11_options():
    out = run(
        "explain", "--q", "2,8,64,16", "--k", "2,2,64,16", "--device", "cpu", "--mask", "causal",
        "--sync", "none_end", "--lengths", "k", "--padding-side", "left", "--softcap", "30", "--sinks",
    )  # fmt: skip
    assert "softcap=30 sinks k_lengths(left)" in out
    assert "does not apply softcap" in out and "chosen: reference" in out
    bad = CliRunner().invoke(main, ["explain", "--q", "1,2,8,16", "--k", "1,2,8,16", "--bias", "3,8,8"])
    assert bad.exit_code != 0 and "bias.shape" in bad.output
    bad = CliRunner().invoke(main, ["explain", "--q", "1,2,8,16", "--k", "1,2,8,16", "--softcap", "-1"])
    assert bad.exit_code != 0 and "softcap" in bad.output


def test_explain_cli_positions_out_of_range():
    """explain validates offsets as attention does (SPEC §11: positions in [-2**30, 2**30))."""
    bad = CliRunner().invoke(
        main, ["explain", "--q", "1,2,8,16", "--k", "1,2,8,16", "--q-offset", str(2**31 - 2)]
    )
    assert bad.exit_code != 0 and "q_offset" in bad.output
    ok = CliRunner().invoke(main, ["explain", "--q", "1,2,8,16", "--k", "1,2,8,16", "--q-offset", str(2**30 - 8),
                                   "--framework", "numpy"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
