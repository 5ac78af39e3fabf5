#!/usr/bin/env bash
# Run each libFuzzer harness in turn and count what it did:
#
#   scripts/fuzz.sh DIR SECONDS NAME...     (make fuzz / make fuzz-smoke)
#
# DIR holds the harnesses (fuzz_NAME) and their corpora (corpus/NAME, from
# scripts/fuzz-corpus.sh; new inputs are added there). The inputs of
# tests/fuzz/regress/NAME (each one a crash the fuzzers found, since fixed)
# are run first, then the harness fuzzes for SECONDS. A crash, leak, hang
# (over 10 s) or run past 2 GiB leaves its input in DIR/findings/NAME/.
# Writes DIR/summary.tsv (one line per harness) and DIR/report.md (the table
# of docs/RELIABILITY.md, by scripts/fuzz-report.sh); with FUZZ_REPORT=1 the
# table in docs/RELIABILITY.md is replaced too. Exits 1 when a harness found
# anything.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "usage: scripts/fuzz.sh DIR SECONDS NAME..." >&2; exit 2; }
dir=$1 secs=$2
shift 2
summary="$dir/summary.tsv"
printf 'harness\tseconds\texecutions\tcorpus\tcoverage\tregressions\tfindings\n' > "$summary"
status=0
for name in "$@"; do
	h="$dir/fuzz_$name"
	corpus="$dir/corpus/$name" findings="$dir/findings/$name" log="$dir/fuzz_$name.log"
	[ -x "$h" ] || { echo "fuzz: $h missing (make fuzz-build)" >&2; exit 2; }
	mkdir -p "$corpus" "$findings"
	rm -f "$findings"/*
	regress=()
	nreg=0
	if [ -d "tests/fuzz/regress/$name" ]; then
		regress=("tests/fuzz/regress/$name")
		nreg=$(find "tests/fuzz/regress/$name" -type f | wc -l)
	fi
	case $name in
	registry) maxlen=16384 ;;
	*) maxlen=65536 ;;
	esac
	echo "fuzz: $name for ${secs}s ($(find "$corpus" -type f | wc -l) seeds, $nreg regression inputs)"
	# regression inputs once each, then the fuzzing proper
	if [ "$nreg" -gt 0 ] && ! "$h" -runs=0 -timeout=10 -rss_limit_mb=2048 "${regress[@]}" > "$log.regress" 2>&1; then
		echo "fuzz: $name: a regression input fails again (see $log.regress)" >&2
		status=1
	fi
	"$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$maxlen" \
		-print_final_stats=1 -artifact_prefix="$findings/" "$corpus" > "$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
	ncorp=$(find "$corpus" -type f | wc -l)
	nfind=$(find "$findings" -type f | wc -l)
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$secs" "${execs:-0}" "$ncorp" "${cov:-0}" "$nreg" "$nfind" >> "$summary"
	if [ "$rc" -ne 0 ] || [ "$nfind" -gt 0 ]; then
		echo "fuzz: $name found something (exit $rc): $(ls "$findings" | tr '\n' ' ')" >&2
		grep -m1 -E 'ERROR|SUMMARY|fuzz' "$log" >&2
		status=1
	fi
	echo "fuzz: $name: ${execs:-0} executions, $nfind findings"
	# a harness that crashed left its registry object behind
	for o in /dev/shm/vpsfuzz-[0-9]*; do
		[ -e "$o" ] && ! kill -0 "${o##*-}" 2>/dev/null && rm -f "$o"
	done
done
# the registry harness's shared buffer object, once no harness runs
pgrep -f 'fuzz_registry' >/dev/null 2>&1 || rm -f /dev/shm/vpsfuzzbuf
scripts/fuzz-report.sh "$summary" > "$dir/report.md"
if [ "${FUZZ_REPORT:-0}" = 1 ]; then
	scripts/fuzz-report.sh "$summary" --update docs/RELIABILITY.md
fi
cat "$dir/report.md"
exit $status
