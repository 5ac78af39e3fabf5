#!/usr/bin/env bash
# An 8-rank switch of GPU state over ipc, all ranks on one GPU: the bytes
# every rank receives or copies in place, over the slowest rank's transfer
# time, against cudaMemcpy device-to-device in the same run
# (build/bench/gpu_copy_bench); and the pause from the trainers' request to
# their resume, split into attaching (mapping, IPC handles), rendezvous and
# transfer.
#
#   scripts/bench/gpu_switch.sh [MODEL FROM TO]
#   (default: gpt3-1.3b tp=4,pp=2,dp=1 -> tp=2,pp=4,dp=1)
set -euo pipefail
export VPS_TOKEN=${VPS_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
top=$(cd "$(dirname "$0")/../.." && pwd)
bin=$top/bin
model=${1:-gpt3-1.3b} from=${2:-tp=4,pp=2,dp=1} to=${3:-tp=2,pp=4,dp=1}
export VPS_CONFIG_PATH=$top/configs
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
"$bin/vps-layout" --model "$model" --parallel "$from" -o a.layout
"$bin/vps-layout" --model "$model" --parallel "$to" -o b.layout
"$bin/vps-plan" a.layout b.layout -o ab.plan
"$bin/vps-stage" --budget 4GiB ab.plan -o ab.staged
world=$("$bin/vps-plan" a.layout b.layout --stats | awk '$1 == "world:" { print $2 }')
port=$("$top/scripts/free-port.sh")
pids=()
for ((r = 0; r < world; r++)); do
	"$bin/vps-trainer" --registry "gs$$-$r" --rank "$r" --steps 0 --steps-after 0 --cuda --timeout 600 ab.staged \
		> "trainer.$r.log" 2>&1 &
	pids+=($!)
done
for ((r = 0; r < world; r++)); do
	"$bin/vps-exec" --registry "gs$$-$r" --rank "$r" --world "$world" --master "127.0.0.1:$port" --transport ipc \
		--wait --timeout 300 --report "report.$r.yaml" -q ab.staged > "exec.$r.log" 2>&1 &
	pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ $failed != 0 ]; then cat trainer.*.log exec.*.log >&2; exit 1; fi
grep -h "wrong" trainer.*.log | head -2
memcpy=$("$top/build/bench/gpu_copy_bench" 1024 | awk '/^contiguous/ { for (i = 1; i <= NF; i++) if ($i ~ /cudaMemcpy/) { gsub(/[(]/, "", $(i+1)); print $(i+1) } }')
awk -v memcpy="$memcpy" -v model="$model" -v from="$from" -v to="$to" '
	# the keys of a switch (two spaces in), not of its stages
	/^  bytes_received:/ { recv += $2 } /^  bytes_copied:/ { copied += $2 }
	/^  transfer_seconds:/ { if ($2 > tmax) tmax = $2 }
	/^  pause_seconds:/ { if ($2 > pmax) pmax = $2 }
	/^  attach_seconds:/ { if ($2 > amax) amax = $2 }
	/^  agree_seconds:/ { if ($2 > gmax) gmax = $2 }
	END {
		moved = recv + copied
		printf "switch %s (%s) -> (%s), 8 ranks on one GPU over ipc\n", model, from, to
		printf "bytes moved (received + copied in place): %.3f GB in %.4f s (slowest rank) = %.1f GB/s\n", moved / 1e9, tmax, moved / tmax / 1e9
		printf "cudaMemcpy D2D, same run: %.1f GB/s; ratio %.3f\n", memcpy, moved / tmax / 1e9 / memcpy
		printf "pause (slowest rank): %.4f s: attach %.4f s, rendezvous %.4f s, transfer %.4f s\n", pmax, amax, gmax, tmax
	}' report.*.yaml
