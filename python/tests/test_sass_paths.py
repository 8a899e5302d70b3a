# SPDX-License-Identifier: MIT
"""bench/sass_paths.py on SASS text written here: the loop it picks, the paths it walks (both
ways at each branch, through blocks placed outside the loop's span, never around an inner loop),
the counts it reports and its exit status. cuobjdump is not needed (--sass)."""

import pytest
from helpers import load_bench


@pytest.fixture(scope="module")
def sp():
    return load_bench("sass_paths")


def sass(name, lines):
    """cuobjdump --dump-sass's layout: a Function line, then /*addr*/ instruction ; /* enc */."""
    body = "".join(f"        /*{16 * i:04x}*/ {t} ;  /* 0x0000000000000000 */\n"
                   for i, t in enumerate(lines))
    return f"\n\tcode for sm_90\n\t\tFunction : {name}\n\t.headerflags\t@\"EF_CUDA_SM90\"\n{body}"


# 0x10 is the head; one iteration takes 0x20's branch or not, and 0x50's (a conditional
# branch with a predicate operand) to a block placed after the loop's back edge at 0x70.
KERNEL = [
    "MOV R1, c[0x0][0x28]",                           # 0x00
    "HMMA.16816.F32.BF16 R4, R8, R12, R4",            # 0x10 head
    "@P0 BRA 0x50",                                   # 0x20
    "MUFU.EX2 R2, R2",                                # 0x30
    "BRA 0x60",                                       # 0x40
    "@!P2 BRA P3, 0x90",                              # 0x50
    "LDGSTS.E.BYPASS.128 [R3], desc[UR4][R6.64]",     # 0x60
    "@P1 BRA 0x10",                                   # 0x70 back edge
    "EXIT",                                           # 0x80
    "LDL R9, [R1+0x8]",                               # 0x90 outside the span
    "BRA 0x60",                                       # 0xa0
]


def run(sp, tmp_path, capsys, text, *args):
    f = tmp_path / "dump.sass"
    f.write_text(text)
    rc = sp.main(["--sass", str(f), *args])
    return rc, capsys.readouterr()


def test_paths_and_counts(sp, tmp_path, capsys):
    rc, out = run(sp, tmp_path, capsys, sass("kern_a", KERNEL), "--kernel", "kern_a")
    assert rc == 0, out.err
    lines = out.out.splitlines()
    assert lines[1].strip() == "loop 0x10..0x70: 3 paths"
    rows = [tuple(map(int, l.split())) for l in lines[3:]]
    # (ins, hmma, ex2, mufu, ldsm, ldgsts, ldl, stl, bar, fmul, i2f, paths)
    assert rows == [
        (5, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1),  # 0x10 0x20 0x50 0x60 0x70
        (6, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1),  # 0x10 0x20 0x30 0x40 0x60 0x70
        (7, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1),  # 0x10 0x20 0x50 0x90 0xa0 0x60 0x70
    ]


def test_hist(sp, tmp_path, capsys):
    rc, out = run(sp, tmp_path, capsys, sass("kern_a", KERNEL), "--hist", "7")
    assert rc == 0
    mix = out.out.split("opcodes of the path of 7 instructions:")[1].split()
    assert dict(zip(mix[::2], map(int, mix[1::2]))) == {
        "BRA": 4, "HMMA": 1, "LDL": 1, "LDGSTS": 1}  # 0x20 0x50 0xa0 0x70
    rc, out = run(sp, tmp_path, capsys, sass("kern_a", KERNEL), "--hist", "9")
    assert "no path issues 9 instructions" in out.out


def test_longest_hmma_loop_and_inner_loops(sp, tmp_path, capsys):
    # The loop at 0x40..0x80 is longer but has no HMMA; the HMMA loop's inner loop (0x20 ->
    # 0x10) is never taken around: an iteration is one pass.
    text = sass("kern_b", [
        "HMMA.16816.F32.F16 R4, R8, R12, R4",    # 0x00 head
        "FMUL R2, R2, R3",                       # 0x10
        "@P0 BRA 0x10",                          # 0x20 inner loop
        "@P1 BRA 0x0",                           # 0x30 back edge
        "NOP", "NOP", "NOP", "NOP",              # 0x40 .. 0x70
        "@P2 BRA 0x40",                          # 0x80 a longer loop, without HMMA
        "EXIT",                                  # 0x90
    ])
    rc, out = run(sp, tmp_path, capsys, text)
    assert rc == 0
    lines = out.out.splitlines()
    assert lines[1].strip() == "loop 0x0..0x30: 1 paths"
    row = lines[3].split()
    assert row[0] == "4" and row[1] == "1" and row[9] == "1"  # 0x00 .. 0x30, one FMUL


def test_no_match_no_loop_no_tool(sp, tmp_path, capsys, monkeypatch):
    rc, out = run(sp, tmp_path, capsys, sass("kern_a", KERNEL), "--kernel", "other")
    assert rc == 1 and "no kernel matches" in out.err
    rc, out = run(sp, tmp_path, capsys, sass("kern_c", ["NOP", "@P0 BRA 0x0", "EXIT"]))
    assert rc == 1 and "no loop with an HMMA" in out.out
    monkeypatch.setenv("CUOBJDUMP", str(tmp_path / "missing-cuobjdump"))
    assert sp.main([str(tmp_path / "x.o")]) == 2
    assert "cannot run" in capsys.readouterr().err
