#!/usr/bin/env bash
# The Long runs section of docs/BENCHMARKS.md: a short scripts/bench/longrun.sh
# run of each host transport (micro-llama, 2 ranks, SWITCHES switches back and
# forth), its table and verdict as printed. Exits 1 unless both are flat.
#   [SWITCHES=N] scripts/bench/longrun_section.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${SWITCHES:-200}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
rc=0
for tr in tcp ipc; do
	scripts/bench/longrun.sh --switches "$n" --model scripts/bench/models/micro-llama.yaml \
		--transport "$tr" > "$t/$tr" 2> "$t/$tr.err" || { rc=1; cat "$t/$tr.err" >&2; }
done
{
	scripts/bench/doc-stamp.sh "SWITCHES=$n scripts/bench/longrun_section.sh"
	for tr in tcp ipc; do
		echo
		echo '```'
		grep -v "^vps: built" "$t/$tr"
		echo '```'
	done
} | scripts/bench/doc-section.sh longrun docs/BENCHMARKS.md
echo "wrote the longrun section of docs/BENCHMARKS.md"
exit "$rc"
