#!/usr/bin/env bash
# The host's digest against the one it replaced (scripts/bench/digest_bench.c:
# the same bytes, runs alternating, medians), fp32 and bf16, a whole tensor
# and a TP shard of it. With --doc, writes the table into docs/BENCHMARKS.md
# (section digest-host).
#   [MIB=N] [RUNS=N] scripts/bench/digest.sh [--doc]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
doc=0
[ "${1:-}" = --doc ] && doc=1
cd "$top" && make -s build/bench/digest_bench
if [ "$doc" = 0 ]; then
	exec build/bench/digest_bench "${MIB:-64}" "${RUNS:-9}"
fi
t=$(mktemp)
trap 'rm -f "$t"' EXIT
build/bench/digest_bench "${MIB:-64}" "${RUNS:-9}" > "$t"
{
	scripts/bench/doc-stamp.sh "MIB=${MIB:-64} RUNS=${RUNS:-9} scripts/bench/digest.sh --doc"
	echo
	echo "| elements | bytes | this digest | the digest before | this / before |"
	echo "|---|---:|---:|---:|---:|"
	# NAME, KIND  BYTES bytes  new X GB/s Y Gelem/s  before X GB/s Y Gelem/s  new/before R
	awk '/ bytes / {
		i = match($0, / +[0-9]+ bytes/); name = substr($0, 1, i - 1)
		split(substr($0, i), f, " +")
		printf "| %s | %d MiB | %s GB/s | %s GB/s | %.2fx |\n", name, f[2] / 1048576, f[5], f[10], f[15] }' "$t"
} | scripts/bench/doc-section.sh digest-host docs/BENCHMARKS.md
echo "wrote the digest-host section of docs/BENCHMARKS.md"
