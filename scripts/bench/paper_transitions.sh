#!/usr/bin/env bash
# Every transition of configs/transitions: bytes moved against the lower
# bound, the busiest device against the balanced bound, and the estimated
# time on the paper's testbed next to the paper's measured time. Prints a
# markdown table.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s all
topo=${TOPOLOGY:-a800-testbed}
echo "| transition | world | moved / lower bound | busiest / balanced bound | busiest sender / send bound | GB moved | estimate (s) | paper (s) |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for f in configs/transitions/*.yaml; do
	n=$(basename "$f" .yaml)
	bin/vps-plan --transition "$n" --stats --topology "$topo" | awk -v n="$n" '
		{ v[$1] = $2 }
		END { printf "| %s | %s | %s | %s | %s | %.1f | %.3f | %s |\n", n, v["world:"],
			v["moved_over_lower_bound:"], v["busiest_over_bound:"], v["send_over_bound:"],
			v["bytes_moved:"] / 1e9, v["estimate_seconds:"], ("paper_seconds:" in v) ? v["paper_seconds:"] : "" }'
done
