#!/usr/bin/env bash
# Switch throughput on loopback against bare TCP streams of the same bytes.
# A one-rank job moves from device (0,0) to device (0,1): every byte of its
# state (bench-170m, 2.4 GB) crosses loopback once, one way. Two yardsticks:
# build/bench/shm_stream (scripts/bench/shm_stream.c), one pass of a plain
# send/recv loop between two fresh shared-memory objects, the memory a
# switch moves; and iperf3, which resends one cache-resident 1 MiB buffer.
# Runs alternate (switch, shm_stream, iperf3) RUNS times; the ratios of
# medians are reported. --doc writes the table into docs/BENCHMARKS.md.
set -euo pipefail
export VPS_TOKEN=${VPS_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" && make -s all build/bench/shm_stream
doc=
if [ "${1:-}" = --doc ]; then doc=1; fi
bin=$top/bin
t=$(mktemp -d)
server=
trap 'rm -rf "$t"; [ -z "$server" ] || kill $server 2>/dev/null || true' EXIT
cd "$t"
printf 'vps: devices\nversion: 1\ndevices: [[0, 0]]\n' > a.dev
printf 'vps: devices\nversion: 1\ndevices: [[0, 1]]\n' > b.dev
M=$top/scripts/bench/models/bench-170m.yaml
"$bin/vps-layout" --model "$M" --devices a.dev -o a.layout
"$bin/vps-layout" --model "$M" --devices b.dev -o b.layout
"$bin/vps-plan" a.layout b.layout | "$bin/vps-stage" --budget "${BUDGET:-1GiB}" - -o s.staged
bytes=$("$bin/vps-plan" a.layout b.layout --stats | awk '$1 == "bytes_moved:" { print $2 }')
iport=$("$top/scripts/free-port.sh")
iperf3 -s -p "$iport" > iperf.log 2>&1 &
server=$!
sleep 0.5
switch_gbps=() stream_gbps=() iperf_gbps=() pause=() attach=()
for run in $(seq "${RUNS:-3}"); do
	port=$("$top/scripts/free-port.sh")
	pids=()
	for r in 0 1; do
		"$bin/vps-trainer" --registry "bench$$-$r" --rank $r --steps 0 --steps-after 0 s.staged > t.$r 2>&1 &
		pids+=($!)
	done
	for r in 0 1; do
		"$bin/vps-exec" --registry "bench$$-$r" --rank $r --master 127.0.0.1:$port --wait -q --report r.$r s.staged &
		pids+=($!)
	done
	wait "${pids[@]}"
	sec=$(awk '$1 == "transfer_seconds:" { print $2 }' r.1)
	switch_gbps+=("$(awk -v b="$bytes" -v s="$sec" 'BEGIN { printf "%.3f", b / s / 1e9 }')")
	pause+=("$(awk '$1 == "pause_seconds:" { printf "%.2f", $2 }' r.1)")
	attach+=("$(awk '$1 == "mapped_in_pause_bytes:" { printf "%.0f", $2 / 1e6 }' r.1)")
	stream_gbps+=("$("$top/build/bench/shm_stream" "$bytes" | awk '$1 == "pass" { print $3 }')")
	iperf_gbps+=("$(iperf3 -c 127.0.0.1 -p "$iport" -n "$bytes" -l 1M -J | awk -F'[:,]' '/"bits_per_second"/ { v = $2 } END { printf "%.3f", v / 8e9 }')")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ms=$(median "${switch_gbps[@]}") mst=$(median "${stream_gbps[@]}") mi=$(median "${iperf_gbps[@]}")
table() {
	echo "\`RUNS=${RUNS:-3} scripts/bench/switch_tcp.sh --doc\` ($(date -u +%F), $(nproc) CPUs, load average"
	echo "$(cut -d' ' -f1-3 /proc/loadavg) at the end): $(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e9 }') GB one way, GB/s per run."
	echo
	echo "| | runs (GB/s) | median | switch / this |"
	echo "|---|---|---:|---:|"
	echo "| vps switch (receiver's transfer) | ${switch_gbps[*]} | $ms | |"
	awk -v a="$ms" -v b="$mst" -v r="${stream_gbps[*]}" 'BEGIN { printf "| shm_stream, first pass | %s | %s | %.2f |\n", r, b, a / b }'
	awk -v a="$ms" -v b="$mi" -v r="${iperf_gbps[*]}" 'BEGIN { printf "| iperf3 | %s | %s | %.2f |\n", r, b, a / b }'
	echo
	echo "Pause of the receiving rank per run (s): ${pause[*]}; MB of its buffers first read in the pause: ${attach[*]}."
}
table
if [ -n "$doc" ]; then table | "$top/scripts/bench/doc-section.sh" switch-tcp "$top/docs/BENCHMARKS.md"; fi
