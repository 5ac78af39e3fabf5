#!/usr/bin/env bash
# Every transition of configs/transitions: bytes moved against the lower
# bound, the busiest device against the balanced bound, and the estimated
# time on the paper's testbed against the least time the topology allows
# (from the plan's pieces) and against the time floor (from the two layouts
# alone, never the plan); then the transitions the paper timed, next to the
# paper's times for DynaTrain and its baselines (MCP's checkpoint save and
# load, HotSpa). Plans are vps-plan's default (relays where they win), each
# next to the same transition planned without relays (--no-relay) and to
# the floor of plans that relay; the lines under the last table say, from
# these figures, whether issue 40's targets are met: every transition
# within 1.02x of its relayed floor, none slower than without relays, the
# joins at their floor. The section of docs/BENCHMARKS.md between
# <!-- transitions:begin --> and <!-- transitions:end --> is this script's
# output, never typed by hand:
#
#   scripts/bench/paper_transitions.sh           rewrite that section (and print it)
#   scripts/bench/paper_transitions.sh --print   print it only
#   scripts/bench/paper_transitions.sh --check   exit 1 when the section differs from a rerun
#
# Nothing here is a timing: every figure follows from the plans, the layouts
# and the paper's numbers in the transition files, so a rerun reproduces the
# section byte for byte. VPS_BIN picks the tools (default: bin/, built
# first); ROWS=FILE also writes the figures as tab-separated lines: name,
# world, the first table's columns, bytes moved, the lower bound, the floor,
# estimate / floor, the busiest device's bytes, MCP's save and load, HotSpa's
# time, the two configurations; then the estimate without relays, the
# relayed floor, the estimate over it, the bytes relayed, the devices
# joining, the busiest device over the balanced bound and the estimate
# over the time bound without relays, the estimate to 4 decimals, and the
# bytes moved into transit areas (moved again as they are passed on).
# EVERY=N with ROWS: every N-th transition only, those lines and no
# section (make asan's tests: the planner under the sanitizers, on a
# sample of every kind of transition; make check runs them all).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-write}
case "$mode" in write | --print | --check) ;; *)
	echo "usage: scripts/bench/paper_transitions.sh [--print | --check]" >&2
	exit 2
	;;
esac
every=${EVERY:-1}
case "$every" in [1-9] | [1-9][0-9]) ;; *)
	echo "paper_transitions: EVERY=$every: not a number from 1 to 99" >&2
	exit 2
	;;
esac
if [ "$every" != 1 ] && { [ -z "${ROWS:-}" ] || [ "$mode" != --print ]; }; then
	echo "paper_transitions: EVERY=$every samples the rows: give ROWS=FILE and --print" >&2
	exit 2
fi
doc=docs/BENCHMARKS.md
if [ -z "${VPS_BIN:-}" ]; then
	make -s all
	VPS_BIN=bin
fi
topo=${TOPOLOGY:-a800-testbed}
export LC_ALL=C
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT

k=0
for f in configs/transitions/*.yaml; do
	k=$((k + 1))
	[ $(((k - 1) % every)) = 0 ] || continue
	n=$(basename "$f" .yaml)
	"$VPS_BIN"/vps-plan --transition "$n" --stats --topology "$topo" > "$t/stats" ||
		{ echo "paper_transitions: $n: vps-plan failed" >&2; exit 1; }
	"$VPS_BIN"/vps-plan --no-relay --transition "$n" --stats --topology "$topo" > "$t/direct" ||
		{ echo "paper_transitions: $n: vps-plan --no-relay failed" >&2; exit 1; }
	direct=$(awk '$1 == "estimate_seconds:" { e = $2 } $1 == "busiest_over_bound:" { b = $2 }
		$1 == "estimate_over_time_bound:" { t = $2 } END { print e, b, t }' "$t/direct")
	awk -v n="$n" -v direct="$direct" '
		BEGIN { split(direct, d, " ") }
		{ v[$1] = $2 }
		$1 == "from:" || $1 == "to:" { gsub(/"/, "", $2); v[$1] = $2 }
		function opt(k) { return (k in v) ? v[k] : "" }
		END { printf "%s\t%s\t%.3f\t%s\t%s\t%.1f\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t%.4f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.4f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			n, v["world:"],
			# what reaches B over the lower bound: transit arrivals move twice on purpose
			(v["bytes_lower_bound:"] > 0 ? (v["bytes_moved:"] - v["bytes_transit:"]) / v["bytes_lower_bound:"] : 1),
			v["busiest_over_bound:"], v["send_over_bound:"],
			v["bytes_moved:"] / 1e9, v["estimate_seconds:"], v["time_bound_seconds:"],
			v["estimate_over_time_bound:"], opt("paper_seconds:"), v["bytes_moved:"], v["bytes_lower_bound:"],
			v["time_floor_seconds:"], v["estimate_over_time_floor:"],
			(v["max_send_bytes:"] + 0 > v["max_recv_bytes:"] + 0 ? v["max_send_bytes:"] : v["max_recv_bytes:"]),
			opt("paper_mcp_save_seconds:"), opt("paper_mcp_load_seconds:"), opt("paper_hotspa_seconds:"),
			v["from:"], v["to:"], d[1], v["relayed_time_floor_seconds:"], v["estimate_over_relayed_time_floor:"],
			v["bytes_relayed:"], v["joining:"], d[2], d[3], v["estimate_seconds:"], v["bytes_transit:"] }' "$t/stats"
done > "$t/rows"
# the figures, one transition a line, for tests/bats/transitions.bats
[ -z "${ROWS:-}" ] || cp "$t/rows" "$ROWS"
[ "$every" = 1 ] || exit 0

# The paper's rows in its order: its configurations s1, s2, ... of table
# hybrid_merged first, by the number of the source, then the others (the
# ablation's own s1 and s2, the migrations) by name.
paper_rows() {
	awk -F'\t' '$10 != "" {
		k = "~" $1
		if ($1 !~ /ablation/ && match($1, /-s[0-9]+-s[0-9]+$/)) k = sprintf("%04d", substr($1, RSTART + 2) + 0)
		print k "\t" $0 }' "$t/rows" | sort -t$'\t' -k1,1 | cut -f2-
}

section() {
	echo "\`scripts/bench/paper_transitions.sh\` (topology \`$topo\`) wrote this section from"
	echo "the global plans of all $(wc -l < "$t/rows") transitions in \`configs/transitions/\`,"
	echo "their layouts, and the paper's times that the transition files carry."
	echo
	echo "### The paper's transitions"
	echo
	echo "| transition | configurations | GB moved | GB lower bound | busiest device (GB) | estimate (s) | floor (s) | estimate / floor | DynaTrain (s) | estimate / DynaTrain | MCP save + load (s) | HotSpa (s) |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	paper_rows > "$t/paper"
	awk -F'\t' '
		# (TP,PP,DP) as the paper writes a configuration, EP after them when above 1
		function conf(s,   n, i, kv, p, c) {
			n = split(s, kv, ",")
			for (i = 1; i <= n; i++) { split(kv[i], p, "="); c[p[1]] = p[2] }
			return "(" c["tp"] "," c["pp"] "," c["dp"] (c["ep"] > 1 ? "," c["ep"] : "") ")"
		}
		{ printf "| %s | %s -> %s | %.1f | %.1f | %.2f | %s | %.3f | %s | %s | %.2f | %s | %s |\n", $1, conf($19), conf($20),
			$11 / 1e9, $12 / 1e9, $15 / 1e9, $7, $13, $14, $10, $7 / $10,
			($16 != "" ? sprintf("%.2f + %.2f", $16, $17) : ""), $18 }' "$t/paper"
	echo
	awk -F'\t' '
		function lo_hi(x, k) { if (!(k in lo) || x < lo[k]) lo[k] = x; if (!(k in hi) || x > hi[k]) hi[k] = x }
		{ lo_hi($14 + 0, "f"); lo_hi($7 / $10, "d")
		  if ($16 != "") { lo_hi(($16 + $17) / $10, "m"); lo_hi(($16 + $17) / $7, "e") }
		  if ($18 != "") lo_hi($18 / $10, "h") }
		END {
			printf "- estimate / floor: %.3f to %.3f.\n", lo["f"], hi["f"]
			printf "- estimate / DynaTrain: %.2f to %.2f (the estimate is the transfer alone).\n", lo["d"], hi["d"]
			printf "- MCP (save + load) / DynaTrain, the paper'"'"'s speedups: %.1f to %.1f.\n", lo["m"], hi["m"]
			printf "- MCP (save + load) / estimate: %.0f to %.0f.\n", lo["e"], hi["e"]
			printf "- HotSpa / DynaTrain: %.2f to %.2f.\n", lo["h"], hi["h"]
		}' "$t/paper"
	echo
	echo "### Every transition"
	echo
	echo "| transition | world | moved / lower bound | busiest / balanced bound | busiest sender / send bound | GB moved | GB relayed | GB through transit | estimate (s) | without relays (s) | faster by | time bound (s) | estimate / time bound | floor (s) | estimate / floor | relayed floor (s) | estimate / relayed floor | paper (s) |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %.1f | %.1f | %s | %.3f | %.2fx | %s | %s | %.3f | %s | %.3f | %s | %s |\n", $1, $2, $3, $4, $5, $6, $24 / 1e9, $29 / 1e9, $7, $21, ($28 > 0 ? $21 / $28 : 1), $8, $9, $13, $14, $22, $23, $10 }' "$t/rows"
	echo
	awk -F'\t' '
		$3 != "1.000" { moved = moved " " $1 }
		$24 + 0 > 0 { relaying++; rb = $4 + 0 > rb ? $4 + 0 : rb }
		# the balance targets hold plans without relays, as planned with --no-relay
		$26 + 0 > worst { worst = $26 + 0; wname = $1 }
		$26 + 0 <= 1.10 && $26 + 0 > worst_in { worst_in = $26 + 0; iname = $1 }
		$26 + 0 > 1.10 { over = over (over ? ", " : "") "`" $1 "` (" $26 ", estimate / time bound " $27 ")" }
		$26 + 0 > 1.10 && $27 + 0 > 1.02 { fail = fail " " $1 }
		$27 + 0 > tworst { tworst = $27 + 0; tname = $1 }
		$14 + 0 > fworst { fworst = $14 + 0; fname = $1 }
		END {
			printf "- moved / lower bound: %s.\n", moved ? "above 1.000 for" moved : "1.000 on every transition"
			printf "- planned without relays (--no-relay), busiest / balanced bound: at most %.3f within the 1.10 target (`%s`)", worst_in, iname
			if (over)
				printf "; above it %s.\n", over
			else
				printf ".\n"
			printf "- planned without relays, estimate / time bound: at most %.3f (`%s`).\n", tworst, tname
			if (relaying)
				printf "- the %d plans that relay are bounded as plans that relay (docs/relay.md, Statistics): busiest / balanced bound at most %.3f; their floors are the relayed floor.\n", relaying, rb
			printf "- estimate / floor: at most %.3f (`%s`).\n", fworst, fname
			if (fail)
				printf "- **over both targets without relays:**%s.\n", fail
		}' "$t/rows"
	echo
	targets
}

# Issue 40's targets for the default plans (relays where they win), each
# said met or not from the rows: every transition within 1.02x of the floor
# of plans that relay, none slower than planned without relays, and every
# join (a transition with joining devices) at that floor.
targets() {
	awk -F'\t' '
		function item(s, x) { return s (s ? ", " : "") x }
		{ n++; ratio = $23 + 0; join = $25 + 0 > 0; joins += join }
		$24 + 0 > 0 { relaying++; gain = $28 > 0 ? $21 / $28 : 1; if (!lo || gain < lo) lo = gain; if (gain > hi) hi = gain }
		$28 + 0 > $21 + 0 { slower = item(slower, "`" $1 "` (" $21 " s -> " $28 " s)") }
		ratio > 1.02 { over++; if (join) overj = item(overj, "`" $1 "` (" $23 ")"); else others++ }
		ratio > 1.02 && ratio > worst { worst = ratio; wname = $1 }
		END {
			print "Issue 40'"'"'s targets, for the plans above (no flag: relays where they win):"
			print ""
			printf "- %d of the %d transitions relay, each faster than without relays (%.2fx to %.2fx).\n", relaying, n, lo, hi
			printf "- none slower than planned without relays (--no-relay): %s.\n", slower ? "**not met**: " slower : "met"
			printf "- every transition within 1.02x of its relayed floor: %s\n", over ? sprintf("**not met**: %d of %d are (%d above it, at most %.3fx, `%s`); %s.", n - over, n, over, worst, wname, others ? sprintf("%d of those above %s no joining device (docs/relay.md, \"Devices that do not join\" and \"Sharing once over NVLink\")", others, others > 1 ? "have" : "has") : "every one above it is a join") : "met."
			printf "- every join at its relayed floor (within 1.02x): %s\n", overj ? sprintf("**not met**: %d of the %d joins are; above it %s.", joins - (over - others), joins, overj) : sprintf("met (%d joins).", joins)
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
