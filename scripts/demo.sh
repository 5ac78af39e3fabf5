#!/usr/bin/env bash
# Run a real switch on this machine: one reference trainer (vps-trainer) and
# one executor (vps-exec) per device of the transition world, over TCP on
# loopback, host memory in /dev/shm. Exits 0 only when every rank's digest
# matches and every trainer found its state intact.
#
#   scripts/demo.sh [--model M] [--from SPEC] [--to SPEC] [--np N] [--back]
#                   [--budget SIZE] [--global-batch G] [--transport T] [--cuda]
#                   [--fault-rank R SPEC] [--exec-prefix CMD] [--keep DIR] [--per-rank]
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
#   --fault-rank R SPEC  rank R's executor fails (VPS_FAULT=SPEC: stall:STAGE or exit:STAGE)
#   --exec-prefix CMD    run each executor under CMD (compute-sanitizer, say)
#   --timeout S      the executors' --timeout (default 60)
#   --keep DIR       keep the files (plans, reports, logs) in DIR
#   --per-rank       each rank plans and stages only its own part (vps-plan --rank);
#                    the executors agree on the stages at the start
#
#   scripts/demo.sh --standin --cuda --transport nccl   a GPU-shaped switch on a laptop
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bin=$top/bin
model=tiny-llama from=tp=2,pp=2,dp=2,zero=1 to=tp=4,pp=1,dp=2,zero=1
per_rank=0 np=8 back=0 budget=64MiB gb=24 keep= transport=tcp cuda=() fault_rank=-1 fault= prefix=() timeout=60
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
	-h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
export VPS_CONFIG_PATH=$top/configs
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
	trap 'rm -rf "$dir"' EXIT
fi
cd "$dir"
# the trainers append to their sample logs: a kept directory run again
# must not count the last run's samples
rm -f samples.*
tag=demo$$
# a fresh secret per job: only this job's executors can join its switch
VPS_TOKEN=${VPS_TOKEN:-$("$bin/vps-exec" --new-token)}
export VPS_TOKEN
"$bin/vps-layout" -q --model "$model" --parallel "$from" --gpus-per-node "$np" -o a.layout
"$bin/vps-layout" -q --model "$model" --parallel "$to" --gpus-per-node "$np" -o b.layout
"$bin/vps-plan" -q a.layout b.layout --global-batch "$gb" -o ab.plan
"$bin/vps-stage" -q --budget "$budget" ab.plan -o ab.staged
plans=(ab.staged)
if [ "$back" = 1 ]; then
	"$bin/vps-plan" -q b.layout a.layout --global-batch "$gb" -o ba.plan
	"$bin/vps-stage" -q --budget "$budget" ba.plan -o ba.staged
	plans+=(ba.staged)
fi
"$bin/vps-verify" -q ab.staged
read -r world joining leaving moved lower < <("$bin/vps-plan" -q a.layout b.layout --stats |
	awk '{ v[$1] = $2 } END { print v["world:"], v["joining:"], v["leaving:"], v["bytes_moved:"], v["bytes_lower_bound:"] }')
there=" and back"
[ "$back" = 1 ] || there=
gpu=
[ "${#cuda[@]}" = 0 ] || gpu=", GPU memory"
[ "$standin" = 0 ] || gpu="$gpu (the host stand-ins of CUDA and NCCL)"
echo "== $model: ($from) -> ($to)$there, $world devices ($joining joining, $leaving leaving), $np per node, over $transport$gpu"
awk -v m="$moved" -v l="$lower" 'BEGIN { printf "plan: %.1f MiB to move, %s\n", m / 1048576,
	m == l ? "the least any plan moves" : sprintf("%.3fx the least any plan moves", m / l) }'
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
		"$bin/vps-plan" -q a.layout b.layout --rank "$r" --global-batch "$gb" | "$bin/vps-stage" -q --budget "$budget" - -o "ab.$r.staged"
		"$bin/vps-verify" -q "ab.$r.staged"
		[ "$back" = 0 ] || "$bin/vps-plan" -q b.layout a.layout --rank "$r" --global-batch "$gb" |
			"$bin/vps-stage" -q --budget "$budget" - -o "ba.$r.staged"
	done
fi
port=$("$top/scripts/free-port.sh")
pids=() names=()
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
	f=
	[ "$r" = "$fault_rank" ] && f=$fault
	names+=("executor $r")
	read -r -a mine <<<"$(rank_plans "$r")"
	VPS_FAULT=$f "${prefix[@]}" "$bin/vps-exec" --registry "$tag-$r" --rank "$r" --world "$world" --master "127.0.0.1:$port" \
		--transport "$transport" --wait --check --timeout "$timeout" --report "report.$r.yaml" "${serve[@]}" "${mine[@]}" > "exec.$r.log" 2>&1 &
	pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
	wait "${pids[$i]}" || { st=$?; echo "${names[$i]} exited with status $st"; failed=1; }
done
cat trainer.*.log exec.*.log | grep -vE ': ok$|digest: match$' || true
# rank 0's own lines, then each switch over all ranks, from their reports
# (the numbers at full precision stay in report.R.yaml: --keep DIR)
grep -h 'digest: match$' exec.0.log 2>/dev/null || true
grep -h ': ok$' trainer.0.log 2>/dev/null || true
cat report.*.yaml 2>/dev/null | awk '
	/^- rank: / || /^  switch: / { if ($1 == "switch:") sw = $2; next }
	/^  bytes_sent: / { sent[sw] += $2; n = sw > n ? sw : n }
	/^  bytes_received: / { recv[sw] += $2 }
	/^  transfer_seconds: / { if ($2 > t[sw]) t[sw] = $2 }
	/^  pause_seconds: / { if ($2 > p[sw]) p[sw] = $2 }
	/^  digest: / { ranks[sw]++; if ($2 == "match") ok[sw]++ }
	END {
		for (s = 1; s <= n; s++)
			printf "switch %d, all %d ranks: sent %.1f MiB, received %.1f MiB in %.3f s (%.2f GB/s); paused at most %.3f s; digest: %s\n",
				s, ranks[s], sent[s] / 1048576, recv[s] / 1048576, t[s], (t[s] > 0 ? sent[s] / t[s] / 1e9 : 0), p[s],
				(ok[s] == ranks[s] ? "match on every rank" : sprintf("%d ranks differ", ranks[s] - ok[s]))
	}'
[ -z "$keep" ] || echo "files: $dir (each rank's report in report.R.yaml, its logs in exec.R.log and trainer.R.log)"
# every sample read exactly once, before and after the switches
samples=$(cat samples.* 2>/dev/null | sort -n | uniq -c | awk '$1 != 1 { bad++ } END { print NR, bad + 0 }')
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
	exit 0
fi
echo "digest: FAILED (logs in $dir)" >&2
[ -n "$keep" ] || trap - EXIT
exit 1
