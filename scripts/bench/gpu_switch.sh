#!/usr/bin/env bash
# A switch of GPU state over ipc, every rank on one GPU: the bytes every
# rank receives or copies in place over the slowest rank's transfer time,
# against cudaMemcpy device-to-device in the same run
# (build/bench/gpu_copy_bench, or VPS_BENCH's); and the pause of a synchronous job, from the
# last rank's request to each rank's resume (the reports' requested_at and
# done_at: the trainers of a training loop ask at the same step, so the
# ranks' spread is not the switch's), split into what the slowest rank spent
# attaching, agreeing, transferring and digesting.
#
#   scripts/bench/gpu_switch.sh [--check] [--budget SIZE] [--memcpy MIB] [MODEL FROM TO]
#   (default: gpt3-1.3b tp=4,pp=2,dp=1 -> tp=2,pp=4,dp=1, budget 4GiB)
#
#   --check       the executors digest both sides (vps-exec --check) on the
#                 GPU: the digest's cost against the transfer's, and against
#                 its floor (reading both sides at cudaMemcpy's memory traffic)
#   --memcpy MIB  the cudaMemcpy yardstick's size (default 1024)
#   --steps N     optimizer steps the trainers take before they ask (default
#                 1: the executors open the IPC handles meanwhile, as they do
#                 while a job trains)
#
# The trainers register their sources and targets before their steps
# (vps-trainer), so the executors open every CUDA IPC handle before the
# request; "opened in the pause" counts what they could not. On a world of
# one rank every byte is copied in place: the copy kernel with the GPU to
# itself. Runs on the stand-ins too (VPS_CUDA_LIBRARY), where its figures
# mean nothing: tests/bats/standin.bats runs it there, for its plumbing and
# its arithmetic.
set -euo pipefail
export VPS_TOKEN=${VPS_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
top=$(cd "$(dirname "$0")/../.." && pwd)
bin=${VPS_BIN:-$top/bin}
check=() budget=4GiB mib=1024 steps=1
while [ $# -gt 0 ]; do
	case $1 in
	--check) check=(--check); shift ;;
	--budget) budget=$2; shift 2 ;;
	--memcpy) mib=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	-*) echo "gpu_switch.sh: unknown option '$1'" >&2; exit 2 ;;
	*) break ;;
	esac
done
model=${1:-gpt3-1.3b} from=${2:-tp=4,pp=2,dp=1} to=${3:-tp=2,pp=4,dp=1}
export VPS_CONFIG_PATH=$top/configs
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
"$bin/vps-layout" --model "$model" --parallel "$from" -o a.layout 2> layouts.txt
"$bin/vps-layout" --model "$model" --parallel "$to" -o b.layout 2>> layouts.txt
"$bin/vps-plan" -q a.layout b.layout -o ab.plan
"$bin/vps-stage" -q --budget "$budget" ab.plan -o ab.staged
world=$("$bin/vps-plan" a.layout b.layout --stats | awk '$1 == "world:" { print $2 }')
port=$("$top/scripts/free-port.sh")
pids=()
for ((r = 0; r < world; r++)); do
	"$bin/vps-trainer" --registry "gs$$-$r" --rank "$r" --steps "$steps" --steps-after 0 --cuda --timeout 600 ab.staged \
		> "trainer.$r.log" 2>&1 &
	pids+=($!)
done
for ((r = 0; r < world; r++)); do
	"$bin/vps-exec" --registry "gs$$-$r" --rank "$r" --world "$world" --master "127.0.0.1:$port" --transport ipc \
		--wait --timeout 300 "${check[@]}" --report "report.$r.yaml" -q ab.staged > "exec.$r.log" 2>&1 &
	pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ $failed != 0 ]; then cat trainer.*.log exec.*.log >&2; exit 1; fi
grep -h "wrong" trainer.*.log | head -2
memcpy=$("${VPS_BENCH:-$top/build/bench}/gpu_copy_bench" "$mib" | awk '/^contiguous/ { for (i = 1; i <= NF; i++) if ($i ~ /cudaMemcpy/) { gsub(/[(]/, "", $(i+1)); print $(i+1) } }')
# "layout: MODEL on N ranks (...); S a rank, ..." of each side
sed -n 's/^layout: .*); \([^,]*\) a rank.*/\1 a rank/p' layouts.txt | paste -sd' ' | sed 's/^/state: /; s/ a rank /, then /'
awk -v memcpy="$memcpy" -v model="$model" -v from="$from" -v to="$to" -v world="$world" -v checked="${#check[@]}" '
	# the keys of a switch (two spaces in), not of its stages; one report a rank
	FNR == 1 { r = nr++ }
	/^  bytes_received:/ { recv += $2 } /^  bytes_copied:/ { copied += $2; own[r] += $2 }
	/^  bytes_sent:/ { if ($2 > sendmax) sendmax = $2 }
	/^  transfer_seconds:/ { t[r] = $2; if ($2 > tmax) tmax = $2 }
	/^  attach_seconds:/ { a[r] = $2 } /^  agree_seconds:/ { g[r] = $2 } /^  digest_seconds:/ { d[r] = $2 }
	/^  requested_at:/ { q[r] = $2; if ($2 > last) last = $2 } /^  done_at:/ { e[r] = $2 }
	/^  started_at:/ { b[r] = $2 } /^  release_seconds:/ { rel[r] = $2 }
	/^  opened_in_pause:/ { opened += $2 } /^  premapped_bytes:/ { pre += $2 } /^  mapped_in_pause_bytes:/ { cold += $2 }
	/^  digest:/ { dig[$2]++ }
	END {
		moved = recv + copied
		slow = 0
		for (i = 0; i < nr; i++) if (e[i] - last > e[slow] - last) slow = i
		p = e[slow] - last
		# from the last request to this rank knowing every request
		arrive = b[slow] > last ? b[slow] - last : 0
		other = p - arrive - a[slow] - g[slow] - t[slow] - d[slow]
		printf "switch %s (%s) -> (%s), %d rank%s on one GPU over ipc%s\n", model, from, to, world, (world > 1 ? "s" : ""),
			checked ? ", digests on the GPU (--check)" : ""
		printf "bytes moved (received + copied in place): %.3f GB in %.4f s (slowest rank) = %.1f GB/s\n", moved / 1e9, tmax, moved / tmax / 1e9
		printf "cudaMemcpy D2D, same run: %.1f GB/s; ratio %.3f\n", memcpy, moved / tmax / 1e9 / memcpy
		printf "pause (last request to resume, slowest rank %d): %.4f s: arrive %.4f s, attach %.4f s, agree %.4f s, transfer %.4f s, digest %.4f s, other %.4f s; opened in the pause: %d; premapped %.2f GB, first mapped in the pause %.2f GB\n", slow, p, arrive, a[slow], g[slow], t[slow], d[slow], other, opened, pre / 1e9, cold / 1e9
		printf "after the pause (the trainers going on): mappings let go in %.4f s (slowest rank %d)\n", rel[slow], slow
		if (checked) {
			printf "digest on the GPU: %.4f s (slowest rank %d), %.1f%% of its transfer; digest: %s\n", d[slow], slow, (t[slow] > 0 ? 100 * d[slow] / t[slow] : 0), (dig["match"] == nr ? "match" : "MISMATCH")
			# the least any digest apart from the copy can cost: reading the
			# sources and the targets (twice the bytes moved) at the memory
			# traffic cudaMemcpy reached (a read and a write a byte)
			fl = memcpy > 0 ? moved / 1e9 / memcpy : 0
			printf "digest against its floor: reading %.1f GB (sources and targets) at the %.0f GB/s of memory traffic cudaMemcpy reached takes %.1f ms, %.0f%% of the transfer; the digests took %.2fx that (target: at most 1.5x)\n", 2 * moved / 1e9, 2 * memcpy, 1000 * fl, (t[slow] > 0 ? 100 * fl / t[slow] : 0), (fl > 0 ? d[slow] / fl : 0)
		} else
			printf "pause minus transfer: %.1f ms (slowest rank %d)\n", 1000 * (p - t[slow]), slow
	}' report.*.yaml
