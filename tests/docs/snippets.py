#!/usr/bin/env python3
"""The code shown in README.md and docs/*.md is cut from compiled examples
and headers (as CUB includes its snippets, so they never rot): a code
block introduced by

    <!-- snippet: examples/compose_trainer.cpp#compose -->

must equal, line for line, the region of that file between
`// example-begin compose` and `// example-end compose`, less its common
indentation. Every region an example marks must be shown somewhere.

  tests/docs/snippets.py REPO_ROOT      exit 0, or 1 naming each mismatch
"""
import pathlib
import re
import sys
import textwrap

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
marker = re.compile(r"<!-- snippet: (\S+)#(\S+) -->")


def region(path, name):
    lines = (root / path).read_text().splitlines()
    begin = [i for i, l in enumerate(lines) if l.strip() == f"// example-begin {name}"]
    end = [i for i, l in enumerate(lines) if l.strip() == f"// example-end {name}"]
    if len(begin) != 1 or len(end) != 1 or end[0] <= begin[0]:
        raise ValueError(f"{path}: no single region '{name}' (example-begin/example-end)")
    return textwrap.dedent("\n".join(lines[begin[0] + 1:end[0]])).strip("\n")


failures, shown = [], set()
docs = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
for doc in docs:
    lines = doc.read_text().splitlines()
    for i, line in enumerate(lines):
        m = marker.search(line)
        if not m:
            continue
        path, name = m.group(1), m.group(2)
        shown.add((path, name))
        j = i + 1
        if j >= len(lines) or not lines[j].startswith("```"):
            failures.append(f"{doc.name}:{i + 1}: the snippet marker is not followed by a code block")
            continue
        k = j + 1
        while k < len(lines) and not lines[k].startswith("```"):
            k += 1
        got = "\n".join(lines[j + 1:k]).strip("\n")
        try:
            want = region(path, name)
        except (OSError, ValueError) as e:
            failures.append(f"{doc.name}:{i + 1}: {e}")
            continue
        if got != want:
            g, w = got.splitlines(), want.splitlines()
            n = next((x for x in range(max(len(g), len(w)))
                      if x >= len(g) or x >= len(w) or g[x] != w[x]), 0)
            failures.append(f"{doc.name}:{j + 2 + n}: differs from {path}#{name} at its line {n + 1}: "
                            f"{g[n] if n < len(g) else '(end)'!r} vs {w[n] if n < len(w) else '(end)'!r}")
for src in sorted((root / "examples").rglob("*.cpp")) + sorted((root / "include").rglob("*.hpp")):
    for name in re.findall(r"// example-begin (\S+)", src.read_text()):
        rel = str(src.relative_to(root))
        if (rel, name) not in shown:
            failures.append(f"{rel}: region '{name}' is shown in no document")
for f in failures:
    print("snippets: " + f)
print(f"snippets: {len(shown)} snippets checked, {len(failures)} mismatches")
sys.exit(1 if failures else 0)
