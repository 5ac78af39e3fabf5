#!/usr/bin/env bash
# The executors' control plane at 128 to 16,384 ranks on this machine
# (build/bench/control_plane: every rank a thread running the real
# lib/exec/net code over loopback, rank 0 in a process of its own pinned
# to a CPU of its own, the others in processes of as many ranks as the
# open-file limit allows, on the other CPUs), and
# what an idle executor costs (two real vps-exec waiting, with --wait, for
# a request that never comes, for IDLE_SECONDS, default 20). Prints the
# tables and, last, `control plane: W ranks, rank 0 T s, M messages per
# collective` for the largest world, T being rank 0's CPU time per
# collective (its thread's and its control loop's, the median over 15
# switches, averaged over the collectives); every figure is the median of
# RUNS runs of every world (default 3); with --doc, writes them into
# docs/BENCHMARKS.md. Targets: rank 0's time and messages per collective at
# the largest world within 1.5x of those at 128 ranks; 128 ranks run again
# paced like the largest world (control_plane --pace: each collective as
# long), which sets the world's own share of rank 0's time apart from what
# waiting longer costs it on this machine. A world past what
# this machine allows runs at the most it does, and the tables say so:
# rank 0 holds a connection from every rank while it bootstraps (its
# open-file limit, the hard one, which it raises its own to), every rank is
# a thread (the machine's tasks left below pid_max and threads-max, less
# 1,024 for the rest of it), and each takes memory (at most MemAvailable
# over 256 KB).
#   scripts/bench/control_plane.sh [--doc] [WORLDS...]   (default 128 1024 4096 16384 65536)
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=0
[ "${1:-}" = --doc ] && { doc=1; shift; }
asked=${*:-128 1024 4096 16384 65536}
for W in $asked; do
	[[ "$W" =~ ^[1-9][0-9]*$ ]] || { echo "control_plane.sh: $W: not a world size" >&2; exit 2; }
done
# the most ranks this machine holds, and what sets it
# (a process may end while it is read: what was read counts)
tasks=$({ cat /proc/[0-9]*/status 2> /dev/null || true; } | awk '$1 == "Threads:" { n += $2 } END { print n + 0 }')
by_files=$(($(ulimit -Hn) - 128))
by_tasks=$(($(sort -n /proc/sys/kernel/pid_max /proc/sys/kernel/threads-max | head -1) - tasks - 1024))
by_memory=$(($(awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo) / 256))
most=$by_files why="rank 0's open files ($(ulimit -Hn), the hard limit: it holds every rank's bootstrap connection at once)"
[ "$by_tasks" -lt "$most" ] && most=$by_tasks why="the tasks this machine has left ($(sort -n /proc/sys/kernel/pid_max /proc/sys/kernel/threads-max | head -1) less the $tasks running and 1,024 kept for the rest: every rank is a thread)"
[ "$by_memory" -lt "$most" ] && most=$by_memory why="its available memory (256 KB a rank)"
worlds= capped=
for W in $asked; do
	if [ "$W" -gt "$most" ]; then
		capped+="$W asked: this machine allows at most $most ranks, set by $why; the largest world run is $most. "
		W=$most
	fi
	[[ " $worlds " == *" $W "* ]] || worlds+="$W "
done
worlds=${worlds% }
make -s all build/bench/control_plane
t=$(mktemp -d)
pids=()
reg=cp$$
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$t" "/dev/shm/$reg-0" "/dev/shm/$reg-1"' EXIT

# ---- the control plane at each world ----
# TIMEOUT: how long a rank may take to come (default 900 s: 16,384 ranks on
# this shared 2-core machine can take five minutes to bootstrap)
# RUNS: how many times (default 3); each figure is the median of the runs'
# (rank 0's time per collective at 128 ranks moves by a third between runs)
runs=${RUNS:-3}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "control_plane.sh: RUNS=$runs: not a count" >&2; exit 2; }
: > "$t/out"
for run in $(seq "$runs"); do
	build/bench/control_plane --timeout "${TIMEOUT:-900}" $worlds >> "$t/out"
done
# 128 ranks again, paced like the largest world: rank 0's CPU time per
# collective grows with how long each collective keeps it waiting (its
# caches go cold), which here grows with the world because every rank shares
# the machine; the same 128 ranks, their last rank coming as late to each
# collective as the largest world's collectives last, set the world's own
# share apart (the median over the runs of the mean of rank 0's five
# collectives of a switch)
set -- $worlds
if [ "$1" = 128 ] && [ $# -gt 1 ]; then
	pace=$(awk -v W="${!#}" '$1 == "phase" && $2 == W && $3 ~ /^(arrival|training|start|verdict|digest)$/ {
			s[++k] = $5 } END { n = k / 5
			for (r = 1; r <= n; r++) { m[r] = 0; for (c = 1; c <= 5; c++) m[r] += s[(r - 1) * 5 + c] / 5 }
			for (i = 2; i <= n; i++) for (j = i; j > 1 && m[j - 1] > m[j]; j--) { x = m[j]; m[j] = m[j - 1]; m[j - 1] = x }
			printf "%.1f", 1000 * (n % 2 ? m[(n + 1) / 2] : (m[n / 2] + m[n / 2 + 1]) / 2) }' "$t/out")
	for run in $(seq "$runs"); do
		build/bench/control_plane --timeout "${TIMEOUT:-900}" --pace "$pace" 128 >> "$t/out"
	done
fi

# ---- an idle executor: bootstrapped, waiting for its trainer's request ----
idle_seconds=${IDLE_SECONDS:-20}
bin/vps-layout --model tiny-llama --parallel tp=2 --gpus-per-node 2 -o "$t/a" -q
bin/vps-layout --model tiny-llama --parallel tp=1,dp=2 --gpus-per-node 2 -o "$t/b" -q
bin/vps-plan "$t/a" "$t/b" 2> /dev/null | bin/vps-stage --budget 1MiB - -o "$t/s" 2> /dev/null
for r in 0 1; do
	build/bench/control_plane --registry "$reg-$r" $((idle_seconds + 30)) &
	pids+=($!)
done
port=$(scripts/free-port.sh)
for r in 0 1; do
	VPS_TOKEN=0123456789abcdef0123456789abcdef bin/vps-exec --registry "$reg-%r" --rank $r --master 127.0.0.1:$port \
		--wait --timeout 60 "$t/s" > "$t/exec.$r" 2>&1 &
	pids+=($!)
	ex[$r]=$!
done
sleep 3
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
for r in 0 1; do before[$r]=$(ticks ${ex[$r]}); done
sleep "$idle_seconds"
idle=
for r in 0 1; do
	idle+="$(awk -v a="${before[$r]}" -v b="$(ticks ${ex[$r]})" -v hz="$(getconf CLK_TCK)" -v s="$idle_seconds" \
		'BEGIN { printf "%.2f", (b - a) / hz / s * 100 }') "
done

tables() {
	awk -v idle="$idle" -v idle_s="$idle_seconds" -v capped="$capped" -v runs_n="$runs" '
		function log2(x) { return log(x) / log(2) }
		function median(a, k,   i, j, x, b) {
			for (i = 1; i <= k; i++) b[i] = a[i]
			for (i = 2; i <= k; i++)
				for (j = i; j > 1 && b[j - 1] > b[j]; j--) { x = b[j]; b[j] = b[j - 1]; b[j - 1] = x }
			return k % 2 ? b[(k + 1) / 2] : (b[k / 2] + b[k / 2 + 1]) / 2
		}
		# every run'\''s figures kept; the tables give their medians, the counts their extremes
		$1 == "phase" {
			W = $2; k = ++runs[W, $3]
			walls[W, $3, k] = $5; cpus[W, $3, k] = $7
			msg[W, $3] = $9 > msg[W, $3] ? $9 : msg[W, $3]
			if (k == 1 || $11 < wlo[W, $3]) wlo[W, $3] = $11
			if ($11 > whi[W, $3]) whi[W, $3] = $11
			next
		}
		$1 == "paced" {
			k = ++pruns[$3]; pcpus[$3, k] = $7; pmsg[$3] = $9 > pmsg[$3] ? $9 : pmsg[$3]; pace = $13
			next
		}
		$1 == "world" {
			W = $2
			if (!((W, "seen") in v)) ws[++n] = W
			v[W, "seen"] = 1; k = ++wruns[W]
			for (i = 3; i < NF; i += 2) {
				v[W, $i] = $(i + 1)
				if ($i == "wall" || $i == "cpu") whole[W, $i, k] = $(i + 1)
			}
		}
		END {
			for (key in runs) {
				split(key, kp, SUBSEP); k = runs[key]
				for (i = 1; i <= k; i++) { ma[i] = walls[kp[1], kp[2], i]; mc[i] = cpus[kp[1], kp[2], i] }
				wall[key] = median(ma, k); cpu[key] = median(mc, k)
			}
			for (key in wruns) {
				for (f = 1; f <= 2; f++) {
					name = f == 1 ? "wall" : "cpu"
					for (i = 1; i <= wruns[key]; i++) ma[i] = whole[key, name, i]
					v[key, name] = median(ma, wruns[key])
				}
			}
			split("transports arrival training start verdict digest", coll, " ")
			first = ws[1]; last = ws[n]
			print "Rank 0, per collective: its CPU time (its thread and its control loop, the median of 15 switches; the median of " runs_n " runs) and its messages sent and received" (v[first, "rank0_pinned"] ? " (rank 0 pinned to a CPU of its own, every other rank to the others)" : " (rank 0 not pinned: this machine lets the run use one CPU)") ":"
			print ""
			printf "| ranks | tree depth |"
			for (c = 1; c <= 6; c++) printf " %s |", coll[c]
			print " mean |"
			printf "|---:|---:|"; for (c = 1; c <= 7; c++) printf "---:|"; print ""
			for (k = 1; k <= n; k++) {
				W = ws[k]; s = 0; m = 0
				printf "| %\047d | %d |", W, v[W, "depth"]
				for (c = 1; c <= 6; c++) {
					printf " %.3f ms, %d |", cpu[W, coll[c]] * 1000, msg[W, coll[c]]
					s += cpu[W, coll[c]]; m = msg[W, coll[c]] > m ? msg[W, coll[c]] : m
				}
				mean[W] = s / 6; most[W] = m
				printf " %.3f ms, %d |\n", mean[W] * 1000, m
			}
			if (pace != "") {
				printf "| %\047d, paced like %\047d | %d |", first, last, v[first, "depth"]
				s = 0
				for (c = 1; c <= 6; c++) {
					for (i = 1; i <= pruns[coll[c]]; i++) mc[i] = pcpus[coll[c], i]
					pc = median(mc, pruns[coll[c]])
					printf " %.3f ms, %d |", pc * 1000, pmsg[coll[c]]
					s += pc
				}
				paced = s / 6
				printf " %.3f ms |\n", paced * 1000
				print ""
				printf "Paced: the same %\047d ranks, their last rank %.0f ms late to each collective (as long as one lasts at %\047d ranks here: the median over the runs of rank 0'\''s five collectives of a switch), so that rank 0 waits between its messages as long as in the largest world.\n", first, pace, last
			}
			print ""
			print "Rank 0, wall time per phase on this machine (every rank of the world shares its 2 CPUs, so this grows with the world; on a cluster a collective takes twice the tree depth in hops):"
			print ""
			printf "| ranks | bootstrap (rank 0 CPU) |"
			for (c = 1; c <= 6; c++) printf " %s |", coll[c]
			print " stage (64 B to 2 peers) | whole run |"
			printf "|---:|---:|"; for (c = 1; c <= 8; c++) printf "---:|"; print ""
			for (k = 1; k <= n; k++) {
				W = ws[k]
				printf "| %\047d | %.2f s (%.2f s) |", W, wall[W, "bootstrap"], cpu[W, "bootstrap"]
				for (c = 1; c <= 6; c++) printf " %.1f ms |", wall[W, coll[c]] * 1000
				printf " %.1f ms | %.1f s (%d processes, %.1f s CPU) |\n", wall[W, "stage"] * 1000, v[W, "wall"], v[W, "processes"], v[W, "cpu"]
			}
			print ""
			print "Every rank: the most messages any rank sent and received in one collective (and that over log2 W), its connections once started (to the ranks it exchanges data with: its plan peers and its partners in the stage boundaries'\'' all-reduce; and in the control tree), rank 0'\''s bootstrap connections (all closed before the first switch), and the bytes its network holds (lib/exec/net'\''s own accounting: most of any rank once started, and rank 0'\''s peak, its W-entry address table while it bootstraps):"
			print ""
			print "| ranks | messages per collective, busiest rank | / log2 W | data connections, most | control connections, most | rank 0 bootstrap connections | network memory per rank, most | rank 0 peak | resident memory per rank |"
			print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
			for (k = 1; k <= n; k++) {
				W = ws[k]
				printf "| %\047d | %d | %.2f | %d | %d | %\047d | %.1f KB | %.1f KB | %.0f KB |\n", W, v[W, "busiest_messages_per_collective"], v[W, "busiest_messages_per_collective"] / (W > 1 ? log2(W) : 1), v[W, "data_connections_max"], v[W, "control_connections_max"], v[W, "rank0_bootstrap_connections"], v[W, "memory_max"] / 1000, v[W, "rank0_memory_peak"] / 1000, v[W, "rss_kb_per_rank"]
			}
			print ""
			if (capped) {
				sub(/ $/, "", capped)
				print "Worlds past this machine: " capped
				print ""
			}
			split(idle, id, " ")
			printf "An idle executor (bootstrapped, waiting %d s with --wait for a request that never comes): %s%% and %s%% of a CPU (ranks 0 and 1).\n", idle_s, id[1], id[2]
			if (n > 1 && first == 128) {
				print ""
				rt = mean[last] / mean[first]; rm = most[last] / most[first]
				printf "At %\047d ranks against 128: rank 0'\''s CPU time per collective %.2fx, its messages per collective %.2fx (target: at most 1.5x each). Verdict: CPU time %s, messages %s.\n", last, rt, rm, rt <= 1.5 ? "met" : "**not met**", rm <= 1.5 ? "met" : "**not met**"
				if (pace != "") {
					rp = mean[last] / paced
					printf "At %\047d ranks against 128 paced like it: rank 0'\''s CPU time per collective %.2fx (128 paced against 128: %.2fx, what waiting as long costs it). Verdict, the world'\''s own share: %s.\n", last, rp, paced / mean[first], rp <= 1.5 ? "met" : "**not met**"
				}
			}
			if (n > 2 && first == 128) {
				# the same work at every world: what else grows is what each piece costs here
				lo = wlo[first, coll[1]]; hi = whi[first, coll[1]]
				for (k = 1; k <= n; k++)
					for (c = 1; c <= 6; c++) {
						lo = wlo[ws[k], coll[c]] < lo ? wlo[ws[k], coll[c]] : lo
						hi = whi[ws[k], coll[c]] > hi ? whi[ws[k], coll[c]] : hi
					}
				printf "From %\047d to %\047d ranks (%.0fx the ranks): rank 0'\''s CPU time per collective %.2fx; at every world it sent and received %d messages and woke %d to %d times per collective.\n", ws[2], last, last / ws[2], mean[last] / mean[ws[2]], most[last], lo, hi
			}
			print ""
			printf "control plane: %d ranks, rank 0 %.6f s, %d messages per collective\n", last, mean[last], most[last]
		}' "$t/out"
}
tables
[ "$doc" = 1 ] && { scripts/bench/doc-stamp.sh "RUNS=$runs scripts/bench/control_plane.sh --doc $asked"; echo; tables; } |
	scripts/bench/doc-section.sh control-plane docs/BENCHMARKS.md
exit 0
