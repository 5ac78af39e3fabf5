#!/usr/bin/env bash
# The table of fuzzing runs in docs/RELIABILITY.md, from scripts/fuzz.sh's
# summary (never typed by hand):
#
#   scripts/fuzz-report.sh SUMMARY.tsv                  print the table
#   scripts/fuzz-report.sh SUMMARY.tsv --update FILE    replace it in FILE
#
# In FILE the table sits between the lines <!-- fuzz-report:begin --> and
# <!-- fuzz-report:end -->.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/fuzz-report.sh SUMMARY.tsv [--update FILE]" >&2; exit 2; }
summary=$1
[ -s "$summary" ] || { echo "fuzz-report: $summary: no summary (run make fuzz)" >&2; exit 2; }

table() {
	local commit cpu cc
	commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
	git diff --quiet HEAD -- lib include tests/fuzz 2>/dev/null || commit="$commit+changes"
	cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
	cc=$(${FUZZ_CC:-clang} --version 2>/dev/null | head -1)
	echo "Run of $(date -u +%Y-%m-%d) on commit $commit, one harness at a time, each for the"
	echo "seconds shown, on $(nproc) cores (${cpu:-unknown CPU}), with $cc;"
	echo "\`make fuzz FUZZ_SECONDS=N FUZZ_REPORT=1\` reruns it and rewrites this table."
	echo
	echo "| harness | seconds | executions | corpus | coverage (edges) | regression inputs | findings |"
	echo "|---|---:|---:|---:|---:|---:|---:|"
	tail -n +2 "$summary" | while IFS=$'\t' read -r name secs execs corpus cov reg find; do
		echo "| $name | $secs | $execs | $corpus | $cov | $reg | $find |"
	done
}

if [ "${2:-}" = --update ]; then
	file=${3:?--update needs a file}
	grep -q '^<!-- fuzz-report:begin -->$' "$file" && grep -q '^<!-- fuzz-report:end -->$' "$file" ||
		{ echo "fuzz-report: $file has no fuzz-report markers" >&2; exit 2; }
	t=$(mktemp)
	table > "$t.table"
	awk -v tf="$t.table" '
		/^<!-- fuzz-report:end -->$/ { while ((getline l < tf) > 0) print l; skip = 0 }
		!skip { print }
		/^<!-- fuzz-report:begin -->$/ { skip = 1 }
	' "$file" > "$t"
	cat "$t" > "$file"
	rm -f "$t" "$t.table"
else
	table
fi
