#!/usr/bin/env bash
# Replace the lines between <!-- NAME:begin --> and <!-- NAME:end --> of FILE
# with stdin, so a benchmark's table in docs/BENCHMARKS.md is always the
# last run's. A file without the markers gets them, at its end.
#   scripts/bench/doc-section.sh NAME FILE < table
set -euo pipefail
name=$1 file=$2
body=$(mktemp)
trap 'rm -f "$body" "$file.tmp"' EXIT
cat > "$body"
if ! grep -q "^<!-- $name:begin -->$" "$file"; then
	printf '\n<!-- %s:begin -->\n<!-- %s:end -->\n' "$name" "$name" >> "$file"
fi
awk -v b="<!-- $name:begin -->" -v e="<!-- $name:end -->" -v body="$body" '
	$0 == b { print; while ((getline line < body) > 0) print line; skip = 1; next }
	$0 == e { skip = 0 }
	!skip { print }' "$file" > "$file.tmp"
mv "$file.tmp" "$file"
