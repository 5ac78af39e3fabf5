#!/usr/bin/env bash
# Convergence, the paper's section 6.5 in small: the PyTorch example
# (examples/torch) trains micro-llama on 4 ranks from the same seed on the
# same global batches in the same order, three times:
#   static    in the first configuration throughout;
#   switched  switching through vps every K steps, cycling through
#             configurations that change TP, PP, DP and ZeRO-1, with the
#             trainer's --check-switch (rank 0 gathers the whole state
#             before and after each switch and compares it bit for bit) and
#             vps-exec --check (each executor digests what it moved);
#   control   statically in another configuration.
# Reports the largest relative deviation of the loss from the static run's
# over all steps and where, the largest deviation of the gathered fp32
# master weights at the end (switched and control against static), the
# switches equal bit for bit and vps-exec's digests; draws the curves.
#
# A run in another configuration adds its rounding in another order (TP, PP
# and DP reduce differently), and trajectories that differ in their last bits
# separate over the steps: the control shows how long two static
# configurations agree. The switched run's loss must be within --max-rel of
# the static run's at every step before the control's first leaves that
# bound (at every step with --control none).
#
#   scripts/convergence.sh [--steps N] [--switch-every K] [--configs A,B,...]
#                          [--control CFG|none] [--global-batch B]
#                          [--micro-batch M] [--seq S] [--seed X]
#                          [--max-rel R] [--keep DIR] [--doc]
#
# The runs use PYTHON (default build/venv/bin/python, the test environment
# that make venv makes).
#
#   --steps N          optimizer steps of each run (default 300)
#   --switch-every K   the switched run switches every K steps (default 50)
#   --configs LIST     the configurations the switched run cycles through, in
#                      order, each with ':' for ',' (default
#                      tp=2:dp=2:zero=1,pp=2:dp=2,tp=2:pp=2,dp=4:zero=1); the
#                      static run stays in the first
#   --control CFG      the control run's configuration (default the second
#                      of --configs); none: no control run
#   --global-batch B   samples a step (default 16)
#   --micro-batch M    samples a micro-batch (default 2)
#   --seq S            tokens a sample (default 32)
#   --seed X           model and corpus seed (default 1234)
#   --max-rel R        the largest relative loss deviation allowed (default 1e-3)
#   --keep DIR         keep the runs (DIR/static, DIR/switched, DIR/control:
#                      plans, logs, loss.txt, master.pt) and the figure; a
#                      temporary directory otherwise
#   --doc              write the table into docs/convergence.md, the headline
#                      into docs/BENCHMARKS.md, the figure to docs/convergence.svg
#
# Exit 0 when the loss is within --max-rel as above and every switch was
# equal bit for bit with matching digests; 1 when not, or when a run failed;
# 2 on bad arguments. The figure needs matplotlib (python3-matplotlib): without
# it the figure is left out, said at the start, and the numbers still
# checked; --doc refuses to start without it.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
me=convergence.sh
py=${PYTHON:-$top/build/venv/bin/python}
ranks=4
steps=300 every=50 configs=tp=2:dp=2:zero=1,pp=2:dp=2,tp=2:pp=2,dp=4:zero=1 control=''
gb=16 mb=2 seq=32 seed=1234 max_rel=1e-3 keep='' doc=0
while [ $# -gt 0 ]; do
	case $1 in
	--steps|--switch-every|--configs|--control|--global-batch|--micro-batch|--seq|--seed|--max-rel|--keep)
		[ $# -ge 2 ] || { echo "$me: $1: needs a value" >&2; exit 2; }
		case $1 in
		--steps) steps=$2 ;;
		--switch-every) every=$2 ;;
		--configs) configs=$2 ;;
		--control) control=$2 ;;
		--global-batch) gb=$2 ;;
		--micro-batch) mb=$2 ;;
		--seq) seq=$2 ;;
		--seed) seed=$2 ;;
		--max-rel) max_rel=$2 ;;
		--keep) keep=$2 ;;
		esac
		shift 2 ;;
	--doc) doc=1; shift ;;
	-h|--help) sed -n '2,52p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "$me: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
pos() { [[ $2 =~ ^[1-9][0-9]{0,8}$ ]] || { echo "$me: $1: '$2' is not a positive integer" >&2; exit 2; }; }
pos --steps "$steps"
pos --switch-every "$every"
pos --global-batch "$gb"
pos --micro-batch "$mb"
pos --seq "$seq"
[[ $seed =~ ^[0-9]{1,9}$ ]] || { echo "$me: --seed: '$seed' is not a non-negative integer" >&2; exit 2; }
[[ $max_rel =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] ||
	{ echo "$me: --max-rel: '$max_rel' is not a number" >&2; exit 2; }
[[ $configs =~ ^[a-z0-9=:]+(,[a-z0-9=:]+)+$ ]] ||
	{ echo "$me: --configs: '$configs': at least two configurations, comma-separated, ':' within one" >&2; exit 2; }
[ "$every" -lt "$steps" ] || { echo "$me: --switch-every: $every leaves no switch in $steps steps" >&2; exit 2; }
IFS=, read -r -a cfg <<< "$configs"
control=${control:-${cfg[1]}}
[ "$control" = none ] || [[ $control =~ ^[a-z0-9=:]+$ ]] ||
	{ echo "$me: --control: '$control': one configuration, ':' within it, or none" >&2; exit 2; }
[ "${control//:/,}" != "${cfg[0]//:/,}" ] ||
	{ echo "$me: --control: $control is the static run's configuration" >&2; exit 2; }
[ -x "$py" ] || command -v "$py" >/dev/null ||
	{ echo "$me: $py not found: make venv makes the test environment, or set PYTHON" >&2; exit 2; }
# the figure needs matplotlib, the numbers do not: said before minutes are
# spent, not as the run ends
plot=1
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
	if [ "$doc" = 1 ]; then
		echo "$me: --doc draws docs/convergence.svg, which needs matplotlib for $py (pip install matplotlib into it, or PYTHON= a Python that has it)" >&2
		exit 2
	fi
	echo "$me: no matplotlib for $py: the figure is left out (matplotlib for it draws it); the numbers are checked all the same"
	plot=0
fi
for t in vps-layout vps-plan vps-stage vps-exec; do
	[ -x "$top/bin/$t" ] || { echo "$me: bin/$t missing: run make" >&2; exit 2; }
done
# every configuration must be one of micro-llama on this world before minutes are spent
checks=("${cfg[@]}")
[ "$control" = none ] || checks+=("$control")
for c in "${checks[@]}"; do
	out=$("$top/bin/vps-layout" --model micro-llama --parallel "${c//:/,}" --gpus-per-node $ranks --stats 2>&1) ||
		{ echo "$me: $c: $out" >&2; exit 2; }
	out=$(sed -n 's/^world: //p' <<< "$out")
	[ "$out" = $ranks ] || { echo "$me: $c has a world of $out, the runs have $ranks ranks" >&2; exit 2; }
done

if [ -n "$keep" ]; then
	mkdir -p "$keep"
	dir=$keep
else
	dir=$(mktemp -d "${TMPDIR:-/tmp}/vps-convergence.XXXXXX")
	trap 'rm -rf "$dir"' EXIT
fi
rm -rf "$dir/static" "$dir/switched" "$dir/control"
export VPS_TOKEN=${VPS_TOKEN:-$("$top/bin/vps-exec" --new-token)}
common=(--nproc "$ranks" --model micro-llama --gpus-per-node "$ranks" --steps "$steps" --global-batch "$gb"
	--micro-batch "$mb" --seq "$seq" --seed "$seed")
launch() { # NAME LAUNCH-ARGS...
	local name=$1 t0 rc=0
	shift
	t0=$(date +%s)
	"$py" "$top/examples/torch/launch.py" "${common[@]}" --dir "$dir/$name" --loss-log "$dir/$name/loss.txt" \
		--save-master "$dir/$name/master.pt" "$@" || rc=$?
	echo "$name run: $(($(date +%s) - t0)) s, exit $rc"
	if [ $rc != 0 ]; then
		echo "$me: the $name run failed (its logs: $dir/$name)" >&2
		trap - EXIT # keep the logs
		exit 1
	fi
}
launch static --configs "${cfg[0]}"
launch switched --configs "$configs" --switch-every "$every" --check-switch
ctrl=()
if [ "$control" != none ]; then
	launch control --configs "$control"
	ctrl=(--control "$dir/control" --control-config "$control")
fi

svg=$dir/convergence.svg
[ "$doc" = 1 ] && svg=$top/docs/convergence.svg
figure=()
[ "$plot" = 0 ] || figure=(--svg "$svg")
rc=0
"$py" "$top/scripts/convergence_report.py" --static "$dir/static" --switched "$dir/switched" "${ctrl[@]}" \
	--steps "$steps" --every "$every" --configs "$configs" --ranks "$ranks" --max-rel "$max_rel" \
	"${figure[@]}" --pointer "$dir/pointer.txt" > "$dir/table.md" || rc=$?
[ $rc -le 1 ] || exit 1 # a run's files missing or malformed: that run failed
cat "$dir/table.md"
if [ "$plot" = 1 ]; then echo "figure: $svg"; else echo "figure: none (no matplotlib)"; fi
if [ "$doc" = 1 ]; then
	{
		echo
		echo "    scripts/convergence.sh --steps $steps --switch-every $every --configs $configs \\"
		echo "        --control $control --global-batch $gb --micro-batch $mb --seq $seq --seed $seed --doc"
		echo
		cat "$dir/table.md"
		echo
	} | "$top/scripts/bench/doc-section.sh" convergence "$top/docs/convergence.md"
	{ echo; cat "$dir/pointer.txt"; echo; } | "$top/scripts/bench/doc-section.sh" convergence "$top/docs/BENCHMARKS.md"
fi
exit $rc
