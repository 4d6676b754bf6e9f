#!/usr/bin/env python3
"""Instruction counts of the loops of AArch64 kernels, from a disassembly.

Reads `aarch64-linux-gnu-objdump -d -C --no-show-raw-insn` output on stdin
and, for every function whose name contains one of the given patterns,
prints each loop (a backward branch and its target, the body counted
inclusive) with its length and how many of the marked instructions it
holds (SDOT, USMMLA/SMMLA, FMLA) — innermost loops that hold any of them.
Static counts, one pass of the loop;
`scripts/arm-loop-counts.sh` drives it for rlx's and llama.cpp's kernels.

usage: objdump ... | arm-loop-counts.py PATTERN [PATTERN ...]
"""

import re
import sys

MARKS = {
    "sdot": re.compile(r"\tsdot\s"),
    "mmla": re.compile(r"\t(us|s|u)mmla\s"),
    "fmla": re.compile(r"\tfml[as]\s"),
}


def functions(lines):
    name, body = None, []
    for line in lines:
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            if name is not None:
                yield name, body
            name, body = head.group(1), []
        elif name is not None and re.match(r"\s+[0-9a-f]+:", line):
            body.append(line)
    if name is not None:
        yield name, body


def loops(body):
    """Innermost loops: (first, last) address ranges of backward branches
    that hold no other loop, with their length and marked instructions."""
    addr = lambda line: int(line.split(":")[0], 16)
    spans = []
    for line in body:
        branch = re.search(r"\t(b|b\.\w+|cbn?z|tbn?z)\s+(?:\w+, )*([0-9a-f]+) <", line)
        if branch and int(branch.group(2), 16) < addr(line):
            spans.append((int(branch.group(2), 16), addr(line)))
    for lo, hi in spans:
        if any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in spans):
            continue
        inside = [x for x in body if lo <= addr(x) <= hi]
        marks = {k: sum(bool(p.search(x)) for x in inside) for k, p in MARKS.items()}
        if any(marks.values()):
            yield len(inside), marks


def main():
    patterns = sys.argv[1:]
    if not patterns:
        sys.exit(__doc__)
    for name, body in functions(sys.stdin.read().splitlines()):
        if not any(p in name for p in patterns):
            continue
        found = sorted(set((n, tuple(m.items())) for n, m in loops(body)))
        print(f"{name}: {len(body)} instructions")
        for n, marks in found:
            held = ", ".join(f"{v} {k}" for k, v in marks if v)
            print(f"  loop of {n}" + (f" ({held})" if held else ""))


if __name__ == "__main__":
    main()
