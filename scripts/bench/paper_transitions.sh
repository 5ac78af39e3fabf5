#!/usr/bin/env bash
# Every transition of configs/transitions: bytes moved against the lower
# bound, the busiest device against the balanced bound, and the estimated
# time on the paper's testbed against the least time the topology allows,
# next to the paper's measured time. The section of docs/BENCHMARKS.md
# between <!-- transitions:begin --> and <!-- transitions:end --> is this
# script's output, never typed by hand:
#
#   scripts/bench/paper_transitions.sh           rewrite that section (and print it)
#   scripts/bench/paper_transitions.sh --print   print it only
#   scripts/bench/paper_transitions.sh --check   exit 1 when the section differs from a rerun
#
# Nothing here is a timing: every figure follows from the plans, so a rerun
# reproduces the section byte for byte. VPS_BIN picks the tools (default:
# bin/, built first); ROWS=FILE also writes the figures as tab-separated
# lines (name, world, the table's columns, bytes moved, the lower bound).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-write}
case "$mode" in write | --print | --check) ;; *)
	echo "usage: scripts/bench/paper_transitions.sh [--print | --check]" >&2
	exit 2
	;;
esac
doc=docs/BENCHMARKS.md
if [ -z "${VPS_BIN:-}" ]; then
	make -s all
	VPS_BIN=bin
fi
topo=${TOPOLOGY:-a800-testbed}
export LC_ALL=C
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT

for f in configs/transitions/*.yaml; do
	n=$(basename "$f" .yaml)
	"$VPS_BIN"/vps-plan --transition "$n" --stats --topology "$topo" > "$t/stats" ||
		{ echo "paper_transitions: $n: vps-plan failed" >&2; exit 1; }
	awk -v n="$n" '
		{ v[$1] = $2 }
		END { printf "%s\t%s\t%s\t%s\t%s\t%.1f\t%.3f\t%.3f\t%s\t%s\t%s\t%s\n", n, v["world:"],
			v["moved_over_lower_bound:"], v["busiest_over_bound:"], v["send_over_bound:"],
			v["bytes_moved:"] / 1e9, v["estimate_seconds:"], v["time_bound_seconds:"],
			v["estimate_over_time_bound:"], ("paper_seconds:" in v) ? v["paper_seconds:"] : "",
			v["bytes_moved:"], v["bytes_lower_bound:"] }' "$t/stats"
done > "$t/rows"
# the figures, one transition a line, for tests/bats/transitions.bats
[ -z "${ROWS:-}" ] || cp "$t/rows" "$ROWS"

section() {
	echo "\`scripts/bench/paper_transitions.sh\` (topology \`$topo\`) wrote this section from"
	echo "the global plans of all $(wc -l < "$t/rows") transitions in \`configs/transitions/\`."
	echo
	echo "| transition | world | moved / lower bound | busiest / balanced bound | busiest sender / send bound | GB moved | estimate (s) | time bound (s) | estimate / time bound | paper (s) |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }' "$t/rows"
	echo
	awk -F'\t' '
		$3 != "1.000" { moved = moved " " $1 }
		$4 + 0 > worst { worst = $4 + 0; wname = $1 }
		$4 + 0 <= 1.10 && $4 + 0 > worst_in { worst_in = $4 + 0; iname = $1 }
		$4 + 0 > 1.10 { over = over (over ? ", " : "") "`" $1 "` (" $4 ", estimate / time bound " $9 ")" }
		$4 + 0 > 1.10 && $9 + 0 > 1.02 { fail = fail " " $1 }
		$9 + 0 > tworst { tworst = $9 + 0; tname = $1 }
		END {
			printf "- moved / lower bound: %s.\n", moved ? "above 1.000 for" moved : "1.000 on every transition"
			printf "- busiest / balanced bound: at most %.3f within the 1.10 target (`%s`)", worst_in, iname
			if (over)
				printf "; above it %s.\n", over
			else
				printf ".\n"
			printf "- estimate / time bound: at most %.3f (`%s`).\n", tworst, tname
			if (fail)
				printf "- **over both targets:**%s.\n", fail
		}' "$t/rows"
}
section > "$t/section"

grep -q '^<!-- transitions:begin -->$' "$doc" && grep -q '^<!-- transitions:end -->$' "$doc" ||
	{ echo "paper_transitions: $doc has no transitions markers" >&2; exit 2; }
awk -v sf="$t/section" '
	/^<!-- transitions:end -->$/ { while ((getline l < sf) > 0) print l; skip = 0 }
	!skip { print }
	/^<!-- transitions:begin -->$/ { skip = 1 }
' "$doc" > "$t/doc"
case "$mode" in
--print) cat "$t/section" ;;
--check)
	if ! cmp -s "$t/doc" "$doc"; then
		echo "paper_transitions: $doc is stale; rerun scripts/bench/paper_transitions.sh" >&2
		diff "$doc" "$t/doc" >&2 || true
		exit 1
	fi
	;;
*)
	cat "$t/doc" > "$doc"
	cat "$t/section"
	;;
esac
