#!/usr/bin/env bash
# Run a real switch on this machine: one reference trainer (vps-trainer) and
# one executor (vps-exec) per device of the transition world, over TCP on
# loopback, host memory in /dev/shm. Exits 0 only when every rank's digest
# matches and every trainer found its state intact; 1 when a switch failed
# (a process that stops, SIGSTOP, is named and killed rather than waited
# for); 2 for bad arguments, or when /dev/shm or the open-file limit has
# not the room the job needs (checked before anything starts). Every
# process and /dev/shm object it made is gone when it exits.
#
#   scripts/demo.sh [--model M] [--from SPEC] [--to SPEC] [--np N] [--back]
#                   [--budget SIZE] [--global-batch G] [--transport T] [--cuda]
#                   [--fault-rank R SPEC] [--exec-prefix CMD] [--keep DIR] [--per-rank]
#                   [--relay[=MODE] | --no-relay] [--topology T]
#
#   --model M        a model of configs/models (default tiny-llama)
#   --from, --to     parallel configurations (default (2,2,2) -> (4,1,2), ZeRO-1)
#   --np N           devices per node (default 8); a bigger world joins nodes
#   --back           switch back afterwards, on the same connections (--serve)
#   --budget SIZE    staging budget per rank (default 64MiB)
#   --global-batch G samples per step, checked: each read exactly once (default 24)
#   --transport T    tcp (default), ipc, nccl or auto: vps-exec(1) TRANSPORTS
#   --cuda           trainers hold their state in GPU memory (needs a GPU, or --standin)
#   --standin        no GPU needed: build the host stand-ins of libvps-cuda.so and NCCL
#                    (make standin) and point VPS_CUDA_LIBRARY and VPS_NCCL_LIBRARY at
#                    them (docs/exec.md, "The stand-ins")
#   --fault-rank R SPEC  rank R's executor fails (VPS_FAULT=SPEC: stall:STAGE, exit:STAGE,
#                    kill-trainer:STAGE, cut:STAGE, or :claim in place of :STAGE); a STAGE that no
#                    staged plan has is refused (a smaller --budget makes more stages).
#                    That rank runs the tests' executor, $VPS_FAULT_BIN/vps-exec (default:
#                    build/fault-bin, made by make fault-bin here; docs/exec.md, "Faults
#                    for the tests"): bin/vps-exec ignores VPS_FAULT
#   --exec-prefix CMD    run each executor under CMD (compute-sanitizer, say)
#   --timeout S      the executors' --timeout (default 60)
#   --keep DIR       keep the files (plans, reports, logs) in DIR
#   --relay[=MODE], --no-relay  vps-plan's: where joining devices pass on what they
#                    received (default auto: where that wins; --relay alone: always)
#   --topology T     plan for the time on topology T (configs/topologies): where relays
#                    win, and by which routes, is weighed on its links, not in bytes
#   --per-rank       each rank plans and stages only its own part (vps-plan --rank);
#                    the executors agree on the stages at the start
#
#   scripts/demo.sh --standin --cuda --transport nccl   a GPU-shaped switch on a laptop
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bin=$top/bin
model=tiny-llama from=tp=2,pp=2,dp=2,zero=1 to=tp=4,pp=1,dp=2,zero=1
per_rank=0 relay=() topology=() np=8 back=0 budget=64MiB gb=24 keep= transport=tcp cuda=() fault_rank=-1 fault= fault_exec= prefix=() timeout=60
standin=0
while [ $# -gt 0 ]; do
	case $1 in
	--model) model=$2; shift 2 ;;
	--from) from=$2; shift 2 ;;
	--to) to=$2; shift 2 ;;
	--np) np=$2; shift 2 ;;
	--back) back=1; shift ;;
	--budget) budget=$2; shift 2 ;;
	--global-batch) gb=$2; shift 2 ;;
	--keep) keep=$2; shift 2 ;;
	--transport) transport=$2; shift 2 ;;
	--cuda) cuda=(--cuda); shift ;;
	--standin) standin=1; shift ;;
	--fault-rank) fault_rank=$2; fault=$3; shift 3 ;;
	--exec-prefix) read -r -a prefix <<<"$2"; shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	--per-rank) per_rank=1; shift ;;
	--relay | --relay=* | --no-relay) relay=("$1"); shift ;;
	--topology) topology=(--topology "$2"); shift 2 ;;
	-h|--help) sed -n '2,43p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
export VPS_CONFIG_PATH=$top/configs
case $fault in
'' | stall:claim | exit:claim | kill-trainer:claim | cut:claim) ;;
stall:* | exit:* | kill-trainer:* | cut:*)
	[[ ${fault#*:} =~ ^[0-9]+$ ]] || { echo "demo.sh: --fault-rank: '$fault': a stage is a number or 'claim'" >&2; exit 2; } ;;
*) echo "demo.sh: --fault-rank: '$fault': expected stall, exit, kill-trainer or cut, ':', then a stage or 'claim'" >&2; exit 2 ;;
esac
[ -z "$fault" ] || [[ $fault_rank =~ ^[0-9]+$ ]] || { echo "demo.sh: --fault-rank: '$fault_rank' is not a rank" >&2; exit 2; }

# Sizes as the tools print them (vps(7) UNITS; lib/util/units.c's
# vps_format_bytes, _rate and _seconds): three significant digits,
# powers of 1024 for bytes, of 1000 for rates.
units_awk='
function three(v, u) { return v >= 99.95 ? sprintf("%.0f %s", v, u) : v >= 9.995 ? sprintf("%.1f %s", v, u) : sprintf("%.2f %s", v, u) }
function scaled(v, base, units, n,   k, u, sign) {
	if (v == 0) return "0 " units[1]
	sign = v < 0 ? "-" : ""; if (v < 0) v = -v
	for (k = 1; v >= 999.5 && k < n; k++) v /= base
	return sign three(v, units[k])
}
function bytes(b,   u) { if (b > -1000 && b < 1000) return sprintf("%d B", b); split("B KiB MiB GiB TiB PiB EiB", u, " "); return scaled(b, 1024, u, 7) }
function rate(r,   u) { split("B/s kB/s MB/s GB/s TB/s PB/s", u, " "); return scaled(r, 1000, u, 6) }
function secs(s) { return s == 0 ? "0 s" : s < 0.0009995 ? three(s * 1e6, "us") : s < 0.9995 ? three(s * 1e3, "ms") : three(s, "s") }
function plural(n, word) { return n " " word (n == 1 ? "" : "s") }
'

tag=demo$$
pids=() names=()
# Whatever happens, nothing of the job outlives it: a stopped process is
# continued so that it can die, a trainer is asked (SIGTERM: it removes its
# registry), then anything left is killed, and the job's objects in
# /dev/shm (all named $tag-...) are removed.
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null && kill -TERM "$p" 2>/dev/null || true; done
	for _ in $(seq 50); do
		local alive=0
		for p in "${pids[@]}"; do ! kill -0 "$p" 2>/dev/null || [ "$(proc_state "$p")" = Z ] || alive=1; done
		[ "$alive" = 1 ] || break
		sleep 0.1
	done
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -f /dev/shm/"$tag"-*
	[ -z "$dir" ] || [ -n "$keep" ] || [ "${keep_dir:-0}" = 1 ] || rm -rf "$dir"
}
# the one-letter state of process $1 (R, S, D, T, t, Z, ...), or "gone"
proc_state() {
	local line
	{ read -r line < "/proc/$1/stat"; } 2>/dev/null || { echo gone; return; }
	line=${line##*) }
	echo "${line%% *}"
}
dir=
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "$standin" = 1 ]; then
	# the plain build's, as bin/ is: a make that started this one (make
	# check, make asan) must not pass its settings on
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u BUILDDIR -u BINDIR -u SANITIZE -u CFLAGS -u LDFLAGS \
		make -s --no-print-directory -C "$top" standin >&2
	export VPS_CUDA_LIBRARY=$top/build/standin/libvps-cuda-standin.so
	export VPS_NCCL_LIBRARY=$top/build/standin/libnccl-standin.so
fi
if [ -n "$keep" ]; then
	mkdir -p "$keep"
	dir=$(cd "$keep" && pwd)
else
	dir=$(mktemp -d)
fi
cd "$dir"
# the trainers append to their sample logs: a kept directory run again
# must not count the last run's samples
rm -f samples.*
# a fresh secret per job: only this job's executors can join its switch
VPS_TOKEN=${VPS_TOKEN:-$("$bin/vps-exec" --new-token)}
export VPS_TOKEN
"$bin/vps-layout" -q --model "$model" --parallel "$from" --gpus-per-node "$np" -o a.layout
"$bin/vps-layout" -q --model "$model" --parallel "$to" --gpus-per-node "$np" -o b.layout
"$bin/vps-plan" -q "${relay[@]}" "${topology[@]}" a.layout b.layout --global-batch "$gb" -o ab.plan
"$bin/vps-stage" -q --budget "$budget" ab.plan -o ab.staged
plans=(ab.staged)
if [ "$back" = 1 ]; then
	"$bin/vps-plan" -q "${relay[@]}" "${topology[@]}" b.layout a.layout --global-batch "$gb" -o ba.plan
	"$bin/vps-stage" -q --budget "$budget" ba.plan -o ba.staged
	plans+=(ba.staged)
fi
"$bin/vps-verify" -q ab.staged
read -r world joining leaving moved lower < <("$bin/vps-plan" -q a.layout b.layout --stats |
	awk '{ v[$1] = $2 } END { print v["world:"], v["joining:"], v["leaving:"], v["bytes_moved:"], v["bytes_lower_bound:"] }')
if [ -n "$fault" ]; then
	[ "$fault_rank" -lt "$world" ] ||
		{ echo "demo.sh: --fault-rank $fault_rank: the transition world has ranks 0 to $((world - 1))" >&2; exit 2; }
	# a fault at a stage no plan reaches never fires, and the demo would
	# report a match as if the fault had been survived
	if [ "${fault#*:}" != claim ]; then
		most=0
		for f in "${plans[@]}"; do
			n=$("$bin/vps-verify" "$f" | sed -n 's/^[^:]*: ok: [^:]*: \([0-9][0-9]*\) stages within .*/\1/p')
			[ "$n" -le "$most" ] || most=$n
		done
		if [ "${fault#*:}" -ge "$most" ]; then
			echo "demo.sh: --fault-rank $fault_rank $fault: the staged plans have $most stages (0 to $((most - 1))) within --budget $budget: stage ${fault#*:} never comes; a smaller --budget makes more stages" >&2
			exit 2
		fi
	fi
	if [ -n "${VPS_FAULT_BIN:-}" ]; then
		fault_exec=$VPS_FAULT_BIN/vps-exec
		[ -x "$fault_exec" ] || { echo "demo.sh: --fault-rank: $fault_exec: not built (make fault-bin)" >&2; exit 2; }
	else
		# the plain build's, as bin/ is (see --standin)
		env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u BUILDDIR -u BINDIR -u SANITIZE -u CFLAGS \
			-u LDFLAGS make -s --no-print-directory -C "$top" fault-bin >&2
		fault_exec=$top/build/fault-bin/vps-exec
	fi
fi
there=" and back"
[ "$back" = 1 ] || there=
gpu=
[ "${#cuda[@]}" = 0 ] || gpu=", GPU memory"
[ "$standin" = 0 ] || gpu="$gpu (the host stand-ins of CUDA and NCCL)"
awk -v m="$model" -v f="$from" -v t="$to" -v th="$there" -v w="$world" -v j="$joining" -v l="$leaving" -v np="$np" \
	-v tr="$transport" -v gpu="$gpu" -v mv="$moved" -v lo="$lower" "$units_awk"'BEGIN {
	printf "== %s: (%s) -> (%s)%s, %s (%d joining, %d leaving), %d per node, over %s%s\n", m, f, t, th, plural(w, "device"), j, l, np, tr, gpu
	printf "plan: %s to move, %s\n", bytes(mv), mv == lo ? "the least any plan moves" : sprintf("%.3fx the least any plan moves", mv / lo) }'
# Room, before anything starts: during a switch each trainer holds its
# state under both layouts, all of it in /dev/shm (a registry besides, of
# vps-trainer's 1536 entries, under 512 KiB); each executor holds a
# connection to every peer, and a few files.
# (the stand-ins' device memory is shared memory too)
if [ ${#cuda[@]} = 0 ] || [ "$standin" = 1 ]; then
	a_bytes=$("$bin/vps-layout" -q -i a.layout --stats | awk '$1 == "total_bytes:" { print $2 }')
	b_bytes=$("$bin/vps-layout" -q -i b.layout --stats | awk '$1 == "total_bytes:" { print $2 }')
	free_shm=$(df -P -B1 /dev/shm | awk 'NR == 2 { print $4 }')
	need=$(awk -v a="$a_bytes" -v b="$b_bytes" -v w="$world" 'BEGIN { printf "%.0f", a + b + w * 524288 }')
	if awk -v n="$need" -v f="$free_shm" 'BEGIN { exit !(n > f) }'; then
		awk -v n="$need" -v f="$free_shm" -v m="$model" "$units_awk"'BEGIN {
			printf "demo.sh: %s needs %s in /dev/shm (every rank'"'"'s state under both layouts, held during the switch); %s is free there: a smaller --model, or a bigger /dev/shm (mount -o remount,size=SIZE /dev/shm)\n", m, bytes(n), bytes(f) }' >&2
		exit 2
	fi
fi
need_files=$((world + 64))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need_files" ]; then
	ulimit -n "$need_files" 2>/dev/null || {
		echo "demo.sh: each executor needs $need_files open files for a world of $world (a connection to every peer); the limit is $(ulimit -n) and its hard limit $(ulimit -Hn): raise it (ulimit -n, limits.conf)" >&2
		exit 2
	}
fi
# rank_plans R: the staged plans rank R's trainer and executor read
rank_plans() {
	if [ "$per_rank" = 0 ]; then
		echo "${plans[@]}"
	elif [ "$back" = 1 ]; then
		echo "ab.$1.staged ba.$1.staged"
	else
		echo "ab.$1.staged"
	fi
}
if [ "$per_rank" = 1 ]; then
	for ((r = 0; r < world; r++)); do
		"$bin/vps-plan" -q "${relay[@]}" "${topology[@]}" a.layout b.layout --rank "$r" --global-batch "$gb" | "$bin/vps-stage" -q --budget "$budget" - -o "ab.$r.staged"
		"$bin/vps-verify" -q "ab.$r.staged"
		[ "$back" = 0 ] || "$bin/vps-plan" -q "${relay[@]}" "${topology[@]}" b.layout a.layout --rank "$r" --global-batch "$gb" |
			"$bin/vps-stage" -q --budget "$budget" - -o "ba.$r.staged"
	done
fi
port=$("$top/scripts/free-port.sh")
# from here on the logs say what happened: kept unless the demo succeeds
keep_dir=1
for ((r = 0; r < world; r++)); do
	names+=("trainer $r")
	read -r -a mine <<<"$(rank_plans "$r")"
	"$bin/vps-trainer" --registry "$tag-$r" --rank "$r" --global-batch "$gb" --samples "samples.$r" \
		--timeout 120 "${cuda[@]}" "${mine[@]}" > "trainer.$r.log" 2>&1 &
	pids+=($!)
done
serve=()
[ "$back" = 1 ] && serve=(--serve)
for ((r = 0; r < world; r++)); do
	f= exe=$bin/vps-exec
	[ "$r" = "$fault_rank" ] && f=$fault exe=$fault_exec
	names+=("executor $r")
	read -r -a mine <<<"$(rank_plans "$r")"
	VPS_FAULT=$f "${prefix[@]}" "$exe" --registry "$tag-$r" --rank "$r" --world "$world" --master "127.0.0.1:$port" \
		--transport "$transport" --wait --check --timeout "$timeout" --report "report.$r.yaml" "${serve[@]}" "${mine[@]}" > "exec.$r.log" 2>&1 &
	pids+=($!)
done
# Wait for every process, but not with a plain wait: bash waits forever for
# a child that is stopped (SIGSTOP, VPS_FAULT=stall). A stopped process
# never goes on by itself, and everything else of the switch waits for
# executors, so once no executor runs any more, the stopped ones are named
# and killed (their trainers then see their executor gone and fail).
failed=0
declare -A done_=() stopped=()
# (bash's own "Killed" line for a process killed here is not wanted: the
# loop says it; its standard error goes nowhere)
while [ ${#done_[@]} -lt ${#pids[@]} ]; do
	running_exec=0
	for i in "${!pids[@]}"; do
		[ -z "${done_[$i]:-}" ] || continue
		case $(proc_state "${pids[$i]}") in
		gone | Z)
			st=0
			wait "${pids[$i]}" || st=$?
			done_[$i]=1
			if [ "$st" != 0 ]; then
				failed=1
				if [ -n "${stopped[$i]:-}" ]; then
					echo "${names[$i]} was stopped (SIGSTOP) and never went on: killed"
				else
					echo "${names[$i]} exited with status $st"
				fi
			fi ;;
		T | t)
			[ -n "${stopped[$i]:-}" ] || echo "${names[$i]} (pid ${pids[$i]}) is stopped (SIGSTOP); waiting for the other executors to give up (--timeout $timeout)"
			stopped[$i]=1 ;;
		*)
			[[ ${names[$i]} != executor* ]] || running_exec=1 ;;
		esac
	done
	if [ "$running_exec" = 0 ]; then
		for i in "${!stopped[@]}"; do
			[ -n "${done_[$i]:-}" ] || kill -KILL "${pids[$i]}" 2>/dev/null || true
		done
	fi
	[ ${#done_[@]} -ge ${#pids[@]} ] || sleep 0.1
done 2>/dev/null
cat trainer.*.log exec.*.log | grep -vE ': ok$|digest: match$' || true
# rank 0's own lines, then each switch over all ranks, from their reports
# (the numbers at full precision stay in report.R.yaml: --keep DIR)
grep -h 'digest: match$' exec.0.log 2>/dev/null || true
grep -h ': ok$' trainer.0.log 2>/dev/null || true
shopt -s nullglob
reports=(report.*.yaml)
[ ${#reports[@]} = 0 ] || cat "${reports[@]}" | awk "$units_awk"'
	/^- rank: / || /^  switch: / { if ($1 == "switch:") sw = $2; next }
	/^  bytes_sent: / { sent[sw] += $2; n = sw > n ? sw : n }
	/^  bytes_received: / { recv[sw] += $2 }
	/^  transfer_seconds: / { if ($2 > t[sw]) t[sw] = $2 }
	/^  pause_seconds: / { if ($2 > p[sw]) p[sw] = $2 }
	/^  digest: / { ranks[sw]++; if ($2 == "match") ok[sw]++ }
	END {
		for (s = 1; s <= n; s++)
			printf "switch %d, %s: sent %s, received %s in %s (%s); paused at most %s; digest: %s\n",
				s, ranks[s] == 1 ? "its 1 rank" : "all " ranks[s] " ranks", bytes(sent[s]), bytes(recv[s]), secs(t[s]),
				rate(t[s] > 0 ? sent[s] / t[s] : 0), secs(p[s]),
				(ok[s] == ranks[s] ? (ranks[s] == 1 ? "match" : "match on every rank") : sprintf("%s differ", plural(ranks[s] - ok[s], "rank")))
	}'
[ -z "$keep" ] || echo "files: $dir (each rank's report in report.R.yaml, its logs in exec.R.log and trainer.R.log)"
# every sample read exactly once, before and after the switches
samples=$(cat /dev/null samples.* | sort -n | uniq -c | awk '$1 != 1 { bad++ } END { print NR, bad + 0 }')
read -r distinct dups <<<"$samples"
steps_total=$(( 3 + 2 * ${#plans[@]} ))
if [ "$dups" != 0 ] || [ "$distinct" != $((steps_total * gb)) ]; then
	echo "samples: $distinct distinct, $dups read twice; expected $((steps_total * gb)) once each"
	failed=1
else
	echo "samples: $distinct read, each exactly once"
fi
if [ "$failed" = 0 ] && [ "$(cat exec.*.log | grep -c 'digest: match')" = $((world * ${#plans[@]})) ]; then
	echo "digest: match"
	keep_dir=0
	exit 0
fi
echo "digest: FAILED (logs in $dir)" >&2
exit 1
