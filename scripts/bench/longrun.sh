#!/usr/bin/env bash
# Long runs: one vps-trainer and one `vps-exec --serve` per rank switch the
# same job back and forth (layout A -> B -> A ...) N times, on the same
# connections, while every process's resident memory (VmRSS), mappings
# (/proc/PID/maps lines) and open fds (/proc/PID/fd), and the job's objects
# in /dev/shm (count and bytes), are sampled every N switches (counted from
# the trainers' sample logs: each switch adds one step's samples), so that a
# fast idle machine and a slow loaded one see the same number of samples.
#
#   scripts/bench/longrun.sh [--switches N] [--ranks R] [--transport tcp|ipc]
#                            [--model M] [--from SPEC] [--to SPEC] [--budget SIZE]
#                            [--every N] [--warmup K] [--rows N] [--check]
#                            [--rss-slack MIB] [--cuda] [--keep DIR]
#
#   --switches N     switches, alternating A -> B and B -> A (default 1000)
#   --ranks R        ranks, one trainer and one executor each (default 2)
#   --transport T    tcp (default) or ipc (host shared memory)
#   --model M        a model of configs/models, or a model file (default tiny-llama)
#   --from, --to     the two layouts (default tp=R and tp=1,dp=R)
#   --budget SIZE    staging budget per rank (default 16MiB)
#   --every N        a sample each N switches (default 1); a sampler slower than the
#                    switches samples as often as it can, each sample with its count
#   --warmup K       switches before the baseline (default 10, at most N/4)
#   --rows N         rows of the printed table (default 20)
#   --check          executors digest every switch too (vps-exec --check)
#   --rss-slack MIB  RSS growth allowed after warm-up, per process (default 16)
#   --cuda           trainers hold their state in GPU memory (vps-trainer --cuda; a GPU,
#                    or VPS_CUDA_LIBRARY naming the stand-in, docs/exec.md)
#   --keep DIR       keep the plans, logs and samples (samples.tsv) in DIR
#
# After the warm-up, the switches left are cut in thirds, and for each
# process and each measure the range sampled over the first third (floor to
# peak) is the baseline. A measure grows when its floor over the last third
# lies above the baseline's peak: by anything for mappings, fds and /dev/shm
# objects and bytes, by more than --rss-slack for RSS. A process holds more
# during a switch than between two, and some things for a moment (an fd
# while it maps an object, a trainer both layouts' buffers until it frees
# the old), so a sample may catch a peak or miss a trough and the floor and
# the peak move by that swing from window to window; what leaks lifts the
# whole last third above anything the first third saw (a leak of one object
# a switch, over 1,000 switches, by hundreds).
# (/dev/shm is measured per rank: its registry and buffers.) Prints the
# table (each measure the largest over the trainers, over the executors,
# and /dev/shm in all) and the verdict, `flat` (exit 0) or `NOT flat` (exit 1); a
# switch that fails, a trainer's check that fails or a sample read twice
# exits 1 too, and so does an object of the job left in /dev/shm at the end.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
switches=1000 ranks=2 transport=tcp model=tiny-llama from= to= budget=16MiB every=1
warmup= rows=20 check=() rss_slack=16 keep= cuda=()
while [ $# -gt 0 ]; do
	case $1 in
	--switches) switches=$2; shift 2 ;;
	--ranks) ranks=$2; shift 2 ;;
	--transport) transport=$2; shift 2 ;;
	--model) model=$2; shift 2 ;;
	--from) from=$2; shift 2 ;;
	--to) to=$2; shift 2 ;;
	--budget) budget=$2; shift 2 ;;
	--every) every=$2; shift 2 ;;
	--warmup) warmup=$2; shift 2 ;;
	--rows) rows=$2; shift 2 ;;
	--check) check=(--check); shift ;;
	--rss-slack) rss_slack=$2; shift 2 ;;
	--keep) keep=$2; shift 2 ;;
	--cuda) cuda=(--cuda); shift ;;
	-h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "longrun.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
int() { [[ $2 =~ ^[0-9]+$ ]] || { echo "longrun.sh: $1: '$2' is not a non-negative integer" >&2; exit 2; }; }
int --switches "$switches"
int --ranks "$ranks"
int --rows "$rows"
int --rss-slack "$rss_slack"
int --every "$every"
[ "$every" -ge 1 ] || { echo "longrun.sh: --every: at least 1" >&2; exit 2; }
case $transport in tcp|ipc) ;; *) echo "longrun.sh: --transport: '$transport': tcp or ipc" >&2; exit 2 ;; esac
[ "$switches" -ge 8 ] || { echo "longrun.sh: --switches: at least 8" >&2; exit 2; }
[ "$ranks" -ge 1 ] || { echo "longrun.sh: --ranks: at least 1" >&2; exit 2; }
if [ -z "$warmup" ]; then
	warmup=$((switches / 4 < 10 ? switches / 4 : 10))
fi
int --warmup "$warmup"
[ $((switches - warmup)) -ge 6 ] || { echo "longrun.sh: --warmup: leaves fewer than 6 switches to measure" >&2; exit 2; }
from=${from:-tp=$ranks} to=${to:-tp=1,dp=$ranks}
# a model file, from where we were started (named as given)
name=$model
[ ! -f "$model" ] || model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")

if [ -n "${VPS_BIN:-}" ]; then
	bin=$VPS_BIN
else
	make -s -C "$top" all
	bin=$top/bin
fi
export VPS_CONFIG_PATH=${VPS_CONFIG_PATH:-$top/configs}
# the job's secret (vps-exec(1) SECURITY): one per run
export VPS_TOKEN=${VPS_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
if [ -n "$keep" ]; then
	mkdir -p "$keep"
	dir=$(cd "$keep" && pwd)
else
	dir=$(mktemp -d)
fi
pids=() tpids=()
cleanup() {
	# a stopped process keeps a SIGTERM pending until it is continued
	for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null && kill "$p" 2>/dev/null || true; done
	[ -n "$keep" ] || rm -rf "$dir"
}
trap cleanup EXIT
cd "$dir"
rm -f ids.* samples.tsv
tag=longrun$$
gb=$((2 * ranks))
"$bin/vps-layout" --model "$model" --parallel "$from" --gpus-per-node "$ranks" -o a.layout
"$bin/vps-layout" --model "$model" --parallel "$to" --gpus-per-node "$ranks" -o b.layout
"$bin/vps-plan" a.layout b.layout --global-batch "$gb" -o ab.plan
"$bin/vps-plan" b.layout a.layout --global-batch "$gb" -o ba.plan
"$bin/vps-stage" --budget "$budget" ab.plan -o ab.staged
"$bin/vps-stage" --budget "$budget" ba.plan -o ba.staged
world=$("$bin/vps-plan" a.layout b.layout --stats | awk '$1 == "world:" { print $2 }')
moved=$("$bin/vps-plan" a.layout b.layout --stats | awk '$1 == "bytes_moved:" { print $2 }')
if [ "$world" != "$ranks" ]; then
	echo "longrun.sh: ($from) -> ($to) has a transition world of $world devices, not $ranks" >&2
	exit 2
fi
plans=()
for ((k = 0; k < switches; k++)); do
	if ((k % 2 == 0)); then plans+=(ab.staged); else plans+=(ba.staged); fi
done
echo "== $name: ($from) <-> ($to), $ranks ranks over $transport, $switches switches ($((moved / 1000000)) MB moved each)"

# One step after each switch, none before: every switch adds exactly gb
# sample ids to the trainers' logs, which count the switches done.
port=$("$top/scripts/free-port.sh")
kinds=()
for ((r = 0; r < ranks; r++)); do
	"$bin/vps-trainer" --registry "$tag-$r" --rank "$r" --steps 0 --steps-after 1 --global-batch "$gb" \
		--samples "ids.$r" --timeout 600 "${cuda[@]}" "${plans[@]}" > "trainer.$r.log" 2>&1 &
	pids+=($!) kinds+=("trainer $r") tpids+=($!)
done
for ((r = 0; r < ranks; r++)); do
	"$bin/vps-exec" --registry "$tag-$r" --rank "$r" --world "$ranks" --master "127.0.0.1:$port" \
		--transport "$transport" --wait --timeout 60 -q "${check[@]}" --serve "${plans[@]}" > "exec.$r.log" 2>&1 &
	pids+=($!) kinds+=("executor $r")
done

# samples.tsv: one line per process and sample,
#   seconds switches kind rank rss_kib maps fds
# and one per sample for /dev/shm: seconds switches shm - objects bytes
# The switches done are counted from the trainers' sample logs, read as
# they grow (a line counts once its newline is written); a sample is taken
# whenever the count reaches the next multiple of --every, and once as the
# job ends. No fork in the loop but stat's, so that samples keep up with
# short switches.
shopt -s nullglob
exec {nap}<> <(:)
t0=$EPOCHREALTIME
: > samples.tsv
declare -A idfd=()
id_lines=0
next=0
sample() { # SWITCHES_DONE
	local now=$EPOCHREALTIME out=() i p rss m fd objs sizes cnt sum l r
	for i in "${!pids[@]}"; do
		p=${pids[$i]}
		rss=
		{ while read -r k v _; do
			[ "$k" = VmRSS: ] && rss=$v
		done < "/proc/$p/status"; } 2>/dev/null || true
		{ mapfile -t m < "/proc/$p/maps"; } 2>/dev/null || m=()
		fd=("/proc/$p/fd/"*)
		# gone, or a zombie (no VmRSS) that waits to be reaped
		[ -n "$rss" ] && [ "${#m[@]}" -gt 0 ] || continue
		out+=("${kinds[$i]} $rss ${#m[@]} ${#fd[@]}")
	done
	# each rank's objects (its registry NAME, its buffers NAME.N), so that
	# each follows its own trainer's cycle
	objs=("/dev/shm/$tag-"*)
	sizes=()
	[ "${#objs[@]}" = 0 ] || mapfile -t sizes < <(stat -c '%n %s' -- "${objs[@]}" 2>/dev/null || true)
	cnt=() sum=()
	for ((r = 0; r < ranks; r++)); do cnt[r]=0 sum[r]=0; done
	for l in "${sizes[@]}"; do
		r=${l#"/dev/shm/$tag-"} r=${r%% *} r=${r%%.*}
		cnt[r]=$((cnt[r] + 1)) sum[r]=$((sum[r] + ${l##* }))
	done
	for ((r = 0; r < ranks; r++)); do out+=("shm $r ${cnt[r]} ${sum[r]}"); done
	printf "$now $1 %s\n" "${out[@]}" >> samples.tsv
}
while :; do
	alive=0
	for p in "${pids[@]}"; do
		line=
		{ read -r line < "/proc/$p/stat"; } 2>/dev/null || continue
		line=${line##*) }
		# a zombie waits to be reaped: gone too
		[ "${line%% *}" = Z ] || alive=1
	done
	for f in ids.*; do
		if [ -z "${idfd[$f]:-}" ]; then
			exec {fdv}< "$f"
			idfd[$f]=$fdv
		fi
		while read -r -u "${idfd[$f]}" _; do id_lines=$((id_lines + 1)); done
	done
	sw=$((id_lines / gb))
	if [ "$alive" = 0 ]; then
		sample "$sw"
		break
	fi
	if [ "$sw" -ge "$next" ]; then
		# the trainers held while the sample is taken: none can ask for
		# the next switch, so however slow the sampler (a loaded machine),
		# the job waits for it rather than run switches past it unsampled
		# (a switch under way finishes; the executors wait for requests
		# without a deadline that matters here, --serve)
		for p in "${tpids[@]}"; do kill -STOP "$p" 2>/dev/null || true; done
		sample "$sw"
		for p in "${tpids[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
		next=$(((sw / every + 1) * every))
	else
		read -rt 0.002 -u "$nap" || true
	fi
done
failed=0
for i in "${!pids[@]}"; do
	wait "${pids[$i]}" || { st=$?; echo "${kinds[$i]} exited with status $st"; failed=1; }
done
pids=()
cat trainer.*.log exec.*.log | grep -vE ': ok$' || true
left=("/dev/shm/$tag-"*)
if [ "${#left[@]}" != 0 ]; then
	echo "/dev/shm: ${#left[@]} objects of the job left after it ended: ${left[*]}"
	failed=1
fi
dups=$(cat ids.* | sort -n | uniq -c | awk '$1 != 1 { bad++ } END { print NR, bad + 0 }')
read -r distinct twice <<<"$dups"
if [ "$twice" != 0 ] || [ "$distinct" != $((switches * gb)) ]; then
	echo "samples: $distinct distinct, $twice read twice; expected $((switches * gb)) once each"
	failed=1
fi

# The table (per kind, the largest over its processes) and the verdict.
awk -v t0="$t0" -v N="$switches" -v W="$warmup" -v rows="$rows" -v slack="$rss_slack" '
function max(a, b) { return a > b ? a : b }
function fl(w, k, m, v) {
	if (!((w, k, m) in lo) || v < lo[w, k, m]) lo[w, k, m] = v
	if (!((w, k, m) in hi) || v > hi[w, k, m]) hi[w, k, m] = v
}
function range(m, w, k) {
	if (m == "rss") return sprintf("%.1f..%.1f", lo[w, k, m] / 1024, hi[w, k, m] / 1024)
	if (m == "bytes") return sprintf("%.1f..%.1f", lo[w, k, m] / 1048576, hi[w, k, m] / 1048576)
	return lo[w, k, m] ".." hi[w, k, m]
}
{
	t = $1 - t0; sw = $2; kind = $3
	if (kind == "shm") { key = "shm " $4; v1 = $5; v2 = $6 }
	else { key = kind " " $4; v1 = $5; v2 = $6; v3 = $7 }
	if (!($1 in seen)) { seen[$1] = 1; times[++nt] = t; swat[nt] = sw; newsample = 1 } else newsample = 0
	if (kind == "shm") { so[nt] += v1; sb[nt] += v2; procs[key] = 1 }
	else {
		procs[key] = 1
		tr = kind == "trainer" ? "t" : "e"
		rss[tr, nt] = max(rss[tr, nt], v1); maps[tr, nt] = max(maps[tr, nt], v2); fds[tr, nt] = max(fds[tr, nt], v3)
		some[tr, nt] = 1
	}
	# the verdict: baseline window and end window, by switches done
	span = N - W
	if (sw >= W && sw < W + span / 3) win = 1
	else if (sw >= N - span / 3 && sw < N - 1) win = 2 # not the last: the first trainers are leaving
	else win = 0
	if (win) {
		n[win] += newsample
		if (kind == "shm") { fl(win, key, "objects", v1); fl(win, key, "bytes", v2) }
		else { fl(win, key, "rss", v1); fl(win, key, "maps", v2); fl(win, key, "fds", v3) }
	}
}
function cols(tr, i) {
	if (!some[tr, i]) return sprintf("%10s %7s %5s", "-", "-", "-")
	return sprintf("%10.1f %7d %5d", rss[tr, i] / 1024, maps[tr, i], fds[tr, i])
}
END {
	printf "%8s %8s | %-24s | %-24s | %s\n", "", "", "trainers (largest)", "executors (largest)", "/dev/shm"
	printf "%8s %8s | %10s %7s %5s | %10s %7s %5s | %7s %10s\n", "seconds", "switches", "RSS MiB", "maps", "fds", "RSS MiB", "maps", "fds", "objects", "MiB"
	step = nt > rows ? (nt - 1) / (rows - 1) : 1
	last = 0
	for (r = 0; r < rows && r < nt; r++) {
		i = int(1 + r * step + 0.5); if (i > nt) i = nt
		if (i == last) continue
		last = i
		printf "%8.1f %8d | %s | %s | %7d %10.1f\n", times[i], swat[i], cols("t", i), cols("e", i), so[i], sb[i] / 1048576
	}
	if (n[1] < 10 || n[2] < 10) { printf "verdict: %d and %d samples in the two windows, too few (raise --switches or lower --every)\n", n[1], n[2]; exit 1 }
	printf "after %d switches of warm-up: floor..peak over switches %d-%d -> over %d-%d (%d and %d samples)\n", W, W, int(W + span / 3), int(N - span / 3), N, n[1], n[2]
	bad = 0
	np = 0
	for (k in procs) keys[++np] = k
	for (j = 1; j <= np; j++) {
		k = keys[j]
		if (k ~ /^shm/) { m1 = "objects"; m2 = "bytes"; m3 = "" } else { m1 = "rss"; m2 = "maps"; m3 = "fds" }
		line = k ":"
		for (q = 1; q <= 3; q++) {
			m = q == 1 ? m1 : q == 2 ? m2 : m3
			if (m == "") continue
			g = lo[2, k, m] - hi[1, k, m]
			allow = m == "rss" ? slack * 1024 : 0
			line = line sprintf("%s %s %s -> %s%s", q == 1 ? "" : ",", m == "rss" ? "RSS" : m, range(m, 1, k), range(m, 2, k), m == "rss" || m == "bytes" ? " MiB" : "")
			if (g > allow) { bad = 1; line = line " (GROWS)" }
		}
		print line | "sort"
	}
	close("sort")
	print bad ? "verdict: NOT flat" : "verdict: flat"
	exit bad
}' samples.tsv || failed=1
if [ "$failed" != 0 ] && [ -z "$keep" ]; then
	trap - EXIT
	echo "longrun.sh: files kept in $dir" >&2
fi
exit "$failed"
