#!/usr/bin/env python3
"""Every path through a CUDA kernel's main loop, read from cuobjdump's SASS: how many
instructions one iteration issues on each path, and which (HMMA, MUFU, LDSM, LDGSTS, spills).

Without a GPU, this is the part of a kernel's speed that can still be measured: the work a warp
issues per key block, for our kernel and for another (flash-attn's, compiled by the same nvcc)
on the same tile. Which path a GPU takes, and how well it hides latency, only a GPU says.

    python3 bench/sass_paths.py build/cuda/fwd_mma.o --arch sm_90 --kernel 'ILi128ELi128ELi64ELb1'
    python3 bench/sass_paths.py fa2.cubin --kernel 'Li64ELi4E' --hist 939
    python3 bench/sass_paths.py --sass dump.txt --kernel NAME      # SASS text already dumped

The loop is the longest backward branch whose span holds an HMMA. A path starts at the loop's
head and ends at that branch; it follows each conditional branch both ways, also to blocks
placed outside the span (compilers move rare or rotated blocks away), and never enters the
loop's head again. Paths with the same counts are one row, with their number.

Columns: ins (instructions on the path, the back-edge branch included), hmma (mma.sync),
ex2 (MUFU.EX2), mufu (other MUFU: tanh, rcp, ...), ldsm (ldmatrix), ldgsts (cp.async), ldl/stl
(local memory: spills), bar (BAR.SYNC), fmul, i2f. --hist INS prints the opcode mix of the paths
that issue INS instructions. cuobjdump: --cuobjdump, else $CUOBJDUMP, else PATH, else beside
nvcc or in /usr/local/cuda/bin. Exit status: 0, 1 when no kernel matches or has no such loop,
2 when cuobjdump is missing.
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

COLUMNS = ("ins", "hmma", "ex2", "mufu", "ldsm", "ldgsts", "ldl", "stl", "bar", "fmul", "i2f")
MAX_PATHS = 4096

_INSN = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+([^;]*?)\s*;")
_BRANCH = re.compile(r"BRA\b(?:.*?\b0x([0-9a-f]+))?")  # BRA 0x2e50, BRA P3, 0x73a0
_GUARD = re.compile(r"^@!?U?P[0-9T]+\s+")


def find_cuobjdump(explicit=None):
    """The cuobjdump to run, or None."""
    if explicit:
        return explicit
    if os.environ.get("CUOBJDUMP"):
        return os.environ["CUOBJDUMP"]
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    for d in ([os.path.dirname(os.path.realpath(nvcc))] if nvcc else []) + ["/usr/local/cuda/bin"]:
        cand = os.path.join(d, "cuobjdump")
        if os.access(cand, os.X_OK):
            return cand
    return None


def functions(sass):
    """{name: [(address, instruction text), ...]} from cuobjdump --dump-sass output."""
    out = {}
    for chunk in re.split(r"\n\s*Function : ", "\n" + sass)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        out[name] = [(int(a, 16), t.strip()) for a, t in _INSN.findall(chunk)]
    return out


def opcode(text):
    """The opcode of an instruction without its guard predicate: 'HMMA.16816.F32.BF16'."""
    return _GUARD.sub("", text).split()[0]


def branch_target(text):
    """(is a branch, target address or None, unconditional) for one instruction."""
    body = _GUARD.sub("", text)
    m = _BRANCH.match(body)
    if not m:
        return False, None, False
    return True, int(m.group(1), 16) if m.group(1) else None, body == text


def main_loop(insns):
    """(head, back-edge address) of the longest backward branch whose span has an HMMA."""
    best = None
    for addr, text in insns:
        is_bra, target, _ = branch_target(text)
        if not is_bra or target is None or target >= addr:
            continue
        if not any("HMMA" in t for a, t in insns if target <= a <= addr):
            continue
        if best is None or addr - target > best[1] - best[0]:
            best = (target, addr)
    return best


def loop_paths(insns, head, back):
    """Every path from head to the back edge at back, as lists of instruction indices, and
    whether the enumeration stopped at MAX_PATHS."""
    index = {a: i for i, (a, _) in enumerate(insns)}
    start, end = index[head], index[back]
    paths, stack = [], [(start, [])]
    while stack:
        if len(paths) >= MAX_PATHS:
            return paths, True
        i, path = stack.pop()  # path: this walk's own list
        seen = set(path)
        while True:
            if i in seen:
                break  # an inner loop or the head again: not one iteration
            path.append(i)
            seen.add(i)
            if i == end:
                paths.append(path)
                break
            addr, text = insns[i]
            if opcode(text) == "EXIT" and not _GUARD.match(text):
                break
            is_bra, target, uncond = branch_target(text)
            nexts = []
            if not (is_bra and uncond):
                nexts.append(i + 1)
            if is_bra and target is not None and target in index:
                nexts.append(index[target])
            nexts = [j for j in nexts if j < len(insns)]
            if not nexts:
                break
            for j in nexts[1:]:
                stack.append((j, list(path)))
            i = nexts[0]
    return paths, False


def counts(texts):
    """The COLUMNS of one path."""
    ops = [opcode(t) for t in texts]
    has = lambda pre: sum(o.startswith(pre) for o in ops)
    return (len(ops), has("HMMA"), has("MUFU.EX2"), has("MUFU") - has("MUFU.EX2"), has("LDSM"),
            has("LDGSTS"), has("LDL"), has("STL"), has("BAR.SYNC"), has("FMUL"), has("I2F"))


def report(name, insns, hist=None, out=None):
    """Prints the path table of one kernel (to out, default stdout); False when it has no main
    loop."""
    out = out or sys.stdout
    loop = main_loop(insns)
    if loop is None:
        print(f"{name}: no loop with an HMMA", file=out)
        return False
    paths, capped = loop_paths(insns, *loop)
    rows = collections.Counter()
    mixes = {}
    for p in paths:
        texts = [insns[i][1] for i in p]
        key = counts(texts)
        rows[key] += 1
        mixes.setdefault(key[0], collections.Counter()).update(opcode(t).split(".")[0]
                                                               for t in texts)
    print(f"{name}\n  loop {loop[0]:#x}..{loop[1]:#x}: {len(paths)} paths"
          + (f" (stopped at {MAX_PATHS})" if capped else ""), file=out)
    print("  " + " ".join(f"{c:>6}" for c in COLUMNS) + "  paths", file=out)
    for key in sorted(rows):
        print("  " + " ".join(f"{v:>6}" for v in key) + f"  {rows[key]:>5}", file=out)
    if hist is not None:
        mix = mixes.get(hist)
        if mix is None:
            print(f"  no path issues {hist} instructions", file=out)
        else:
            n = sum(1 for k in rows if k[0] == hist)
            print(f"  opcodes of the path{'s' if n > 1 else ''} of {hist} instructions"
                  + (f" ({n} rows, summed)" if n > 1 else "") + ":", file=out)
            for op, c in mix.most_common():
                print(f"    {op:<10} {c:>5}", file=out)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?", help="object, cubin, fatbin or shared library")
    ap.add_argument("--sass", help="read SASS text (cuobjdump --dump-sass output) from this file")
    ap.add_argument("--arch", help="the SASS of this architecture only, e.g. sm_90 (needed "
                    "when the binary holds several)")
    ap.add_argument("--kernel", default="", help="regular expression on the mangled name")
    ap.add_argument("--hist", type=int, help="opcode mix of the paths of this many instructions")
    ap.add_argument("--cuobjdump", help="the cuobjdump to run")
    args = ap.parse_args(argv)
    if args.sass:
        with open(args.sass) as f:
            sass = f.read()
    elif args.binary:
        tool = find_cuobjdump(args.cuobjdump)
        if tool is None:
            print("sass_paths: no cuobjdump (give --cuobjdump or set CUOBJDUMP; it ships with "
                  "the CUDA toolkit, beside nvcc)", file=sys.stderr)
            return 2
        cmd = [tool, "--dump-sass"] + (["-arch", args.arch] if args.arch else []) + [args.binary]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            print(f"sass_paths: cannot run {tool}: {e}", file=sys.stderr)
            return 2
        if run.returncode != 0:
            print(f"sass_paths: {' '.join(cmd)} failed:\n{run.stderr.strip()}", file=sys.stderr)
            return 1
        sass = run.stdout
    else:
        ap.error("give a binary or --sass FILE")
    fns = functions(sass)
    found = [n for n in fns if re.search(args.kernel, n)]
    if not found:
        print(f"sass_paths: no kernel matches {args.kernel!r}", file=sys.stderr)
        return 1
    ok = [report(n, fns[n], args.hist) for n in found]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
