#!/usr/bin/env bash
# vps's switch against checkpoint-and-restart of the same state, side by
# side: 8 ranks go from layout A to layout B (FROM, TO) of models of
# growing size. vps: the pause of vps-trainer + vps-exec (the trainers'
# request to their resume, slowest rank; every element checked) over tcp
# and over host ipc. The baseline (build/bench/ckpt_bench): every rank of A
# saves its state to its own file and fsyncs it, then every rank of B reads
# back exactly the byte ranges its state needs and checks every element.
# PyTorch's distributed checkpoint (scripts/bench/ckpt_dcp.py): 8 gloo
# processes save the same state with torch.distributed.checkpoint, each
# rank's regions as DCP shards at their global offsets, and the ranks of B
# load it resharded, every element checked. Megatron-LM's distributed
# checkpoint, the paper's baseline (MCP, scripts/bench/ckpt_mcp.py): 8
# Megatron-LM jobs of megatron.training on the CPU hold the same state in
# their own model and DistributedOptimizer; A's save it with save_checkpoint
# (torch_dist, fully parallel save) and B's load it with load_checkpoint
# (fully parallel load, the optimizer's fully_reshardable format), every
# element checked. Runs alternate (vps, baseline, DCP, MCP) RUNS times;
# medians. Where the page cache can be dropped, a second load after
# dropping it gives the cold-cache figures.
# Then a PyTorch-native job's state (DT_MODELS: torchtitan's llama3 under
# FSDP2 and TP, AdamW's moments, vps's family=dtensor layouts) goes from
# DT_FROM to DT_TO two ways, runs alternating: vps's switch as above, and
# PyTorch's DCP as a PyTorch job checkpoints (scripts/bench/ckpt_dtensor.py:
# dcp.save of get_state_dict(model, optimizer), real DTensors, by A's ranks;
# dcp.load and set_state_dict by B's, parallelized as B), every element
# checked.
#
#   scripts/bench/ckpt_restart.sh [--doc]
#   env: RUNS (default 1), MODELS (default three sizes; LARGE=1 adds a
#        fourth, 5.4 GB), FROM, TO,
#        BUDGET (staging, default 512MiB), CKPT_DIR (where the files go:
#        a disk, not tmpfs; default a temporary under /var/tmp),
#        DT_MODELS (default models/ckpt-llama3-63m.yaml, 0.75 GB on 4 ranks;
#        none: no PyTorch-native job), DT_FROM (default dp_shard=4), DT_TO
#        (default dp_shard=2,tp=2),
#        PYTHON (a Python with PyTorch 2, megatron-core and torchtitan;
#        default the test environment, build/venv, made by make venv when
#        absent)
# --doc writes the tables into docs/BENCHMARKS.md (section ckpt), the
# figures into docs/bench/switch-vs-size.tsv and redraws the plot.
set -euo pipefail
export VPS_TOKEN=${VPS_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
doc=0
case ${1:-} in
--doc) doc=1 ;;
'') ;;
*) echo "usage: scripts/bench/ckpt_restart.sh [--doc]" >&2; exit 2 ;;
esac
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" && make -s all build/bench/ckpt_bench
bin=$top/bin ckpt=$top/build/bench/ckpt_bench
py=${PYTHON:-$top/build/venv/bin/python}
[ -n "${PYTHON:-}" ] || make -s venv
"$py" -c 'import torch.distributed.checkpoint' ||
	{ echo "ckpt_restart.sh: $py: no torch.distributed.checkpoint (PyTorch 2): set PYTHON" >&2; exit 2; }
"$py" -c 'import megatron.training' 2>/dev/null ||
	{ echo "ckpt_restart.sh: $py: no megatron.training (megatron-core 0.19, the test environment's): set PYTHON" >&2; exit 2; }
"$py" -c 'import torchtitan' 2>/dev/null ||
	{ echo "ckpt_restart.sh: $py: no torchtitan (0.3.0, the test environment's): set PYTHON" >&2; exit 2; }
runs=${RUNS:-1}
from=${FROM:-tp=2,pp=2,dp=2,zero=1} to=${TO:-tp=4,pp=1,dp=2,zero=1}
mdir=$top/scripts/bench/models
models=${MODELS:-"$mdir/ckpt-42m.yaml $mdir/ckpt-84m.yaml $mdir/bench-170m.yaml"}
# 5.4 GB of state fits this machine (A and B at once, plus the page cache)
# but takes as long as the three smaller sizes together
[ "${LARGE:-0}" = 0 ] || models="$models $mdir/ckpt-337m.yaml"
dt_models=${DT_MODELS:-$mdir/ckpt-llama3-63m.yaml}
[ "$dt_models" != none ] || dt_models=
dt_from=${DT_FROM:-dp_shard=4} dt_to=${DT_TO:-dp_shard=2,tp=2}
t=$(mktemp -d)
files=$(mktemp -d "${CKPT_DIR:-/var/tmp}/vps-ckpt.XXXXXX")
tag=ck$$
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$t" "$files"
	rm -f /dev/shm/"$tag"-* 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# one vps switch over $1; prints the slowest rank's pause (call it in an
# assignment: there set -e ends the script when it fails, in a command's
# arguments nothing does)
vps_switch() {
	local transport=$1 port r failed=0
	port=$("$top/scripts/free-port.sh")
	pids=()
	# a run of another world left more
	rm -f "$t"/report.* "$t"/trainer.*.log "$t"/exec.*.log
	for ((r = 0; r < world; r++)); do
		"$bin/vps-trainer" --registry "$tag-$r" --rank "$r" --steps 0 --steps-after 0 --timeout 600 "$t/s.staged" \
			> "$t/trainer.$r.log" 2>&1 &
		pids+=($!)
	done
	for ((r = 0; r < world; r++)); do
		"$bin/vps-exec" --registry "$tag-$r" --rank "$r" --world "$world" --master "127.0.0.1:$port" \
			--transport "$transport" --wait --timeout 300 --report "$t/report.$r.yaml" -q "$t/s.staged" \
			> "$t/exec.$r.log" 2>&1 &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || failed=1; done
	pids=()
	if [ $failed != 0 ]; then
		cat "$t"/trainer.*.log "$t"/exec.*.log >&2
		echo "ckpt_restart.sh: the vps switch over $transport failed" >&2
		exit 1
	fi
	# every trainer checked every element it received
	[ "$(grep -l ': ok$' "$t"/trainer.*.log | wc -l)" = "$world" ] || { cat "$t"/trainer.*.log >&2; exit 1; }
	awk '/^  pause_seconds:/ { if ($2 > m) m = $2 } END { printf "%.4f\n", m }' "$t"/report.*.yaml
}

# drop the page cache (root, and a kernel that lets us); 0 when it did
drop_cache() { sync && { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; }
cold=0
if drop_cache; then cold=1; fi

# one checkpoint and restart by method $1 into directory $2: the command
# after $3 and $4 run as `CMD save $3 $2`, then `CMD load $4 $2` (and the
# load again from a cold cache where it can be dropped); their seconds go to
# the results as $1-save, $1-load, $1-total (and -load-cold, -total-cold),
# their output to $t/$1.save.out and $t/$1.load.out
save_load() {
	local method=$1 dir=$2 a=$3 b=$4 save load lc
	shift 4
	"$@" save "$a" "$dir" > "$t/$method.save.out"
	"$@" load "$b" "$dir" > "$t/$method.load.out"
	save=$(awk '$1 == "seconds:" { print $2 }' "$t/$method.save.out")
	load=$(awk '$1 == "seconds:" { print $2 }' "$t/$method.load.out")
	{
		echo "$bytes $method-save $save"
		echo "$bytes $method-load $load"
		echo "$bytes $method-total $(awk -v a="$save" -v b="$load" 'BEGIN { printf "%.4f", a + b }')"
	} >> "$res"
	if [ $cold = 1 ] && drop_cache; then
		"$@" load "$b" "$dir" > "$t/$method.cold.out"
		lc=$(awk '$1 == "seconds:" { print $2 }' "$t/$method.cold.out")
		{
			echo "$bytes $method-load-cold $lc"
			echo "$bytes $method-total-cold $(awk -v a="$save" -v b="$lc" 'BEGIN { printf "%.4f", a + b }')"
		} >> "$res"
	fi
}

# model $1 from layout $2 to $3: $t/a.layout, $t/b.layout, the staged
# switch $t/s.staged; A's bytes of state, the world and the model's name in
# bytes, world and name
switch_of() {
	"$bin/vps-layout" --model "$1" --parallel "$2" -o "$t/a.layout" -q
	"$bin/vps-layout" --model "$1" --parallel "$3" -o "$t/b.layout" -q
	"$bin/vps-plan" "$t/a.layout" "$t/b.layout" -o "$t/ab.plan"
	"$bin/vps-stage" --budget "${BUDGET:-512MiB}" "$t/ab.plan" -o "$t/s.staged"
	bytes=$("$bin/vps-layout" -i "$t/a.layout" --stats | awk '$1 == "total_bytes:" { print $2 }')
	world=$("$bin/vps-plan" "$t/a.layout" "$t/b.layout" --stats | awk '$1 == "world:" { print $2 }')
	name=$(awk '$1 == "name:" { print $2 }' "$1")
}

began=$SECONDS
res=$t/results
: > "$res"
for m in $models; do
	switch_of "$m" "$from" "$to"
	for ((run = 1; run <= runs; run++)); do
		pause=$(vps_switch tcp)
		echo "$bytes vps-tcp $pause" >> "$res"
		pause=$(vps_switch ipc)
		echo "$bytes vps-ipc $pause" >> "$res"
		rm -rf "${files:?}"/*
		save_load ckpt "$files" "$t/s.staged" "$t/s.staged" "$ckpt"
		written=$(awk '$1 == "bytes_written:" { print $2 }' "$t/ckpt.save.out")
		read -r readb preads < <(awk '$1 == "rank" { b += $3; n += $4 } END { printf "%.0f %.0f\n", b, n }' \
			"$t/ckpt.load.out")
		rm -rf "${files:?}"/*
		mkdir "$files/dcp"
		save_load dcp "$files/dcp" "$t/a.layout" "$t/b.layout" "$py" "$top/scripts/bench/ckpt_dcp.py"
		dwritten=$(awk '$1 == "bytes_written:" { print $2 }' "$t/dcp.save.out")
		rm -rf "${files:?}"/*
		mkdir "$files/mcp"
		save_load mcp "$files/mcp" "$t/a.layout" "$t/b.layout" "$py" "$top/scripts/bench/ckpt_mcp.py"
		mwritten=$(awk '$1 == "bytes_written:" { print $2 }' "$t/mcp.save.out")
		echo "$name run $run: $bytes bytes of state; wrote $written, read $readb in $preads preads; DCP wrote" \
			"$dwritten, MCP $mwritten; $((SECONDS - began)) s so far" >&2
	done
	rm -rf "${files:?}"/*
done
mworld=$world

# the PyTorch-native job's: results of their own (its states are not the
# Megatron job's, whatever their sizes)
res=$t/dt-results
: > "$res"
for m in $dt_models; do
	switch_of "$m" "$dt_from" "$dt_to"
	for ((run = 1; run <= runs; run++)); do
		pause=$(vps_switch tcp)
		echo "$bytes vps-tcp $pause" >> "$res"
		pause=$(vps_switch ipc)
		echo "$bytes vps-ipc $pause" >> "$res"
		rm -rf "${files:?}"/*
		mkdir "$files/dtensor"
		save_load dcp "$files/dtensor" "$t/a.layout" "$t/b.layout" "$py" "$top/scripts/bench/ckpt_dtensor.py"
		dwritten=$(awk '$1 == "bytes_written:" { print $2 }' "$t/dcp.save.out")
		echo "$name ($dt_from to $dt_to, DTensors) run $run: $bytes bytes of state; DCP wrote $dwritten;" \
			"$((SECONDS - began)) s so far" >&2
	done
	rm -rf "${files:?}"/*
done
dworld=$world

# medians per (bytes, method) of results $1, in the order measured
medians() {
	awk '
		{ k = $1 SUBSEP $2; if (!(k in n)) order[++K] = k; v[k, ++n[k]] = $3 }
		END {
			for (i = 1; i <= K; i++) {
				k = order[i]; c = n[k]
				for (a = 1; a <= c; a++) x[a] = v[k, a]
				for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++) if (x[b] < x[a]) { y = x[a]; x[a] = x[b]; x[b] = y }
				split(k, p, SUBSEP)
				printf "%s\t%s\t%s\n", p[1], p[2], x[int((c + 1) / 2)]
			}
		}' "$1"
}
medians "$t/results" > "$t/medians.tsv"
medians "$t/dt-results" > "$t/dt-medians.tsv"

# the table of vps against a restart: $1 the restart's columns' prefix
# ("" or "DCP "), $2 its name in the ratios, $3 its key in the results, $4
# the medians
table() {
	printf '| state (GB) | vps tcp (s) | vps ipc (s) | %ssave (s) | %sload (s) | %ssave + load (s) | %s / vps tcp | %s / vps ipc |' \
		"$1" "$1" "$1" "$2" "$2"
	[ $cold = 1 ] && printf ' %sload, cold cache (s) | cold %s / vps ipc |' "$1" "$2"
	printf '\n|---:|---:|---:|---:|---:|---:|---:|---:|'
	[ $cold = 1 ] && printf -- '---:|---:|'
	printf '\n'
	awk -F'\t' -v cold=$cold -v m="$3" '
		{ if (!($1 in seen)) { seen[$1] = 1; order[++N] = $1 } s[$1, $2] = $3 }
		END {
			for (i = 1; i <= N; i++) {
				b = order[i]; tot = s[b, m "-total"]
				printf "| %.2f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1fx | %.1fx |", b / 1e9, s[b, "vps-tcp"], s[b, "vps-ipc"],
					s[b, m "-save"], s[b, m "-load"], tot, tot / s[b, "vps-tcp"], tot / s[b, "vps-ipc"]
				if (cold) printf " %.3f | %.1fx |", s[b, m "-load-cold"], s[b, m "-total-cold"] / s[b, "vps-ipc"]
				printf "\n"
			}
		}' "$4"
}

# the table of a checkpoint of Python's: $1 its name in the table, $2 in the results
python_table() {
	printf '| state (GB) | %s save (s) | %s load (s) | %s save + load (s) | %s / files | %s / vps tcp | %s / vps ipc |' \
		"$1" "$1" "$1" "$1" "$1" "$1"
	[ $cold = 1 ] && printf ' %s load, cold cache (s) | cold %s / vps ipc |' "$1" "$1"
	printf '\n|---:|---:|---:|---:|---:|---:|---:|'
	[ $cold = 1 ] && printf -- '---:|---:|'
	printf '\n'
	awk -F'\t' -v cold=$cold -v m="$2" '
		{ if (!($1 in seen)) { seen[$1] = 1; order[++N] = $1 } s[$1, $2] = $3 }
		END {
			for (i = 1; i <= N; i++) {
				b = order[i]; tot = s[b, m "-total"]
				printf "| %.2f | %.3f | %.3f | %.3f | %.1fx | %.1fx | %.1fx |", b / 1e9, s[b, m "-save"], s[b, m "-load"],
					tot, tot / s[b, "ckpt-total"], tot / s[b, "vps-tcp"], tot / s[b, "vps-ipc"]
				if (cold) printf " %.3f | %.1fx |", s[b, m "-load-cold"], s[b, m "-total-cold"] / s[b, "vps-ipc"]
				printf "\n"
			}
		}' "$t/medians.tsv"
}
machine="$(nproc) cores, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), load average $(cut -d' ' -f1-3 /proc/loadavg)"
{
	printf '`RUNS=%s scripts/bench/ckpt_restart.sh --doc` (%s to %s, %s ranks, medians of %s), %s, on %s.\n' \
		"$runs" "$from" "$to" "$mworld" "$runs" "$(date -u +%Y-%m-%d)" "$machine"
	[ $cold = 1 ] || printf 'The page cache could not be dropped here: every load read files the save had just written, from memory.\n'
	printf '\n'
	table "" ckpt ckpt "$t/medians.tsv"
	printf '\nPyTorch %s, torch.distributed.checkpoint over gloo, the same run (DCP / files: against the save + load above):\n\n' \
		"$("$py" -c 'import torch; print(torch.__version__)')"
	python_table DCP dcp
	printf "\nMegatron-LM's distributed checkpoint (MCP, the paper's baseline: megatron-core %s, torch_dist, fully parallel save and load, the optimizer fully_reshardable) over gloo, the same run (MCP / vps: how many times as long the save and load take as the switch):\n\n" \
		"$("$py" -c 'from importlib.metadata import version; print(version("megatron-core"))')"
	python_table MCP mcp
	if [ -n "$dt_models" ]; then
		printf "\nA PyTorch-native job's state, the same run: %s, torchtitan's llama3 under FSDP2 and TP with AdamW's moments (%s to %s, %s ranks, vps's family=dtensor layouts). vps's switch against PyTorch's DCP as a PyTorch job checkpoints: dcp.save of get_state_dict(model, optimizer), DTensors, by the ranks of A; dcp.load and set_state_dict by those of B (DCP / vps: how many times as long the save and load take as the switch):\n\n" \
			"$(for m in $dt_models; do awk '$1 == "name:" { print $2 }' "$m"; done | paste -sd, - | sed 's/,/, /g')" \
			"$dt_from" "$dt_to" "$dworld"
		table "DCP " DCP dcp "$t/dt-medians.tsv"
	fi
} > "$t/section.md"
cat "$t/section.md"
if [ $doc = 1 ]; then
	"$top/scripts/bench/doc-section.sh" ckpt "$top/docs/BENCHMARKS.md" < "$t/section.md"
	mkdir -p "$top/docs/bench"
	# the GPU's rows (gpu-*, scripts/bench/gpu_section.sh merges them from the kept GPU check) stay
	tsv=$top/docs/bench/switch-vs-size.tsv
	{
		printf 'state_bytes\tmethod\tseconds\n'
		cat "$t/medians.tsv"
		[ ! -f "$tsv" ] || awk -F'\t' '$2 ~ /^gpu-/' "$tsv"
	} > "$tsv.tmp"
	mv "$tsv.tmp" "$tsv"
	# the figure (docs/bench/switch-vs-size.svg) needs matplotlib: Debian's python3-matplotlib, or the
	# test environment's
	if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
		/usr/bin/python3 "$top/scripts/bench/plot_switch_size.py"
	elif "$py" -c 'import matplotlib' 2>/dev/null; then
		"$py" "$top/scripts/bench/plot_switch_size.py"
	else
		echo "ckpt_restart: python3-matplotlib is missing: docs/bench/switch-vs-size.svg not redrawn" >&2
	fi
fi
