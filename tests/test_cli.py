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
