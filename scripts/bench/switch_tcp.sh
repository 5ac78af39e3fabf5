#!/usr/bin/env bash
# Switch throughput on loopback against a bare TCP stream of the same bytes.
# A one-rank job moves from device (0,0) to device (0,1): every byte of its
# state (bench-170m, 2.4 GB) crosses loopback once, one way, like iperf3's
# single stream. Runs alternate (switch, iperf3) RUNS times; the ratio of
# medians is reported.
set -euo pipefail
export VPS_TOKEN=${VPS_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" && make -s all
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
switch_gbps=() iperf_gbps=()
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
	iperf_gbps+=("$(iperf3 -c 127.0.0.1 -p "$iport" -n "$bytes" -l 1M -J | awk -F'[:,]' '/"bits_per_second"/ { v = $2 } END { printf "%.3f", v / 8e9 }')")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
ms=$(median "${switch_gbps[@]}") mi=$(median "${iperf_gbps[@]}")
echo "bytes: $bytes"
echo "switch GB/s: ${switch_gbps[*]} (median $ms)"
echo "iperf3 GB/s: ${iperf_gbps[*]} (median $mi)"
awk -v a="$ms" -v b="$mi" 'BEGIN { printf "ratio: %.2f\n", a / b }'
