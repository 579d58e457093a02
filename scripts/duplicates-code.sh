#!/bin/bash
# Counts the tree's duplicate pairs with the `duplicates` tool, Go import
# blocks blanked first. The tool's help says it passes over import lines,
# but it reads a grouped Go `import ( … )` block as code, so two files that
# import the same six packages count as a pair; issue 26 reports both
# counts. Line numbers are kept, so rows point at the real files.
#
#   scripts/duplicates-code.sh [DIR] [REGEX]   # REGEX filters the rows
set -euo pipefail
src=$(cd "${1:-.}" && pwd); pat=${2:-.}
command -v duplicates >/dev/null || { echo "duplicates: not on PATH" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Tracked and untracked-but-not-ignored files, as the tool itself reads them.
(cd "$src" && git ls-files -co --exclude-standard -z) | while IFS= read -r -d '' f; do
	[ -f "$src/$f" ] || continue
	mkdir -p "$tmp/$(dirname "$f")" && cp "$src/$f" "$tmp/$f"
done
python3 - "$tmp" <<'PY'
import os, re, sys
block = re.compile(r'\nimport \(.*?\n\)\n', re.S)
for d, _, fs in os.walk(sys.argv[1]):
    for f in fs:
        if f.endswith('.go'):
            p = os.path.join(d, f)
            s = open(p).read()
            open(p, 'w').write(block.sub(lambda m: '\n' * m.group(0).count('\n'), s))
PY
cd "$tmp" && git init -q && git add -A && git -c user.email=dup@localhost -c user.name=dup commit -qm tree
out=$(duplicates --most 200 --seconds 600)
echo "$out" | head -1
echo "$out" | tail -n +2 | grep -E -- "$pat" || true
