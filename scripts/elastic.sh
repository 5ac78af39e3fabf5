#!/usr/bin/env bash
# Devices join and leave a running job (vps(7), DEVICES JOIN AND LEAVE), on
# this machine over gloo: the PyTorch example (examples/torch/launch.py)
# trains micro-llama on 4 processes in tp=2,dp=2, grows to 8 in dp=8 after
# K steps and shrinks back to 4 in tp=2,pp=2 after 2K, 3K steps in all,
# each new world made while the job trains on; with the launcher's
# --check-switch (the whole state gathered before and after each switch,
# compared bit for bit), vps-exec --check (every executor's digest), its
# check that every sample is read once at the global batch, and
# --compare-static (a static run in tp=2,dp=2 on the same data).
# Prints launch.py's report and, last, one line:
#
#   elastic: N switches, worlds 4->8->4, bit for bit, loss within R of static, overlap P%
#
# R being the largest relative deviation of a step's loss from the static
# run's, and P the share of the time the new worlds took to make that the
# job hid behind training: hidden / (hidden + pause), summed over the
# switches (launch.py's per-switch figure, from its switches.tsv).
#
#   scripts/elastic.sh [--short] [--switch-every K] [--max-rel R] [--keep DIR] [--doc]
#
#   --short            K = 2 (6 steps), for the tests
#   --switch-every K   steps between the switches (default 8: 24 steps)
#   --max-rel R        the largest relative deviation of the loss from the
#                      static run's allowed (default 1e-3, the bound of
#                      launch.py --compare-static, which holds as well)
#   --keep DIR         keep the runs (DIR/elastic, DIR/same-world: plans,
#                      logs, switches.tsv, reports); a temporary directory
#                      otherwise, kept when a run fails
#   --doc              also run the same first switch in a world of 8 from
#                      the start (4 spares that hold nothing, no world made:
#                      the same plan, the same bytes moved), and the same
#                      worlds asked for through launch.py --control (the job
#                      trains on until each new world is made, where a
#                      scheduled switch waits for it at its step); write the
#                      table of the three into docs/BENCHMARKS.md (section
#                      elastic), with the joins against the issue's targets
#
# The runs use PYTHON (default build/venv/bin/python, the test environment
# that make venv makes). Exit 0 when every switch happened and was equal bit
# for bit with every digest a match, every sample was read once and the
# loss is within R of the static run's at every step; 1 when not, or when a
# run failed; 2 on bad arguments.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
me=elastic.sh
py=${PYTHON:-$top/build/venv/bin/python}
configs=tp=2:dp=2,dp=8,tp=2:pp=2
every=8 max_rel=1e-3 keep='' doc=0
while [ $# -gt 0 ]; do
	case $1 in
	--switch-every|--max-rel|--keep)
		[ $# -ge 2 ] || { echo "$me: $1: needs a value" >&2; exit 2; }
		case $1 in
		--switch-every) every=$2 ;;
		--max-rel) max_rel=$2 ;;
		--keep) keep=$2 ;;
		esac
		shift 2 ;;
	--short) every=2; shift ;;
	--doc) doc=1; shift ;;
	-h|--help) sed -n '2,43p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "$me: unknown argument '$1' (see --help)" >&2; exit 2 ;;
	esac
done
[[ $every =~ ^[1-9][0-9]{0,5}$ ]] || { echo "$me: --switch-every: '$every' is not a positive integer" >&2; exit 2; }
[[ $max_rel =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] ||
	{ echo "$me: --max-rel: '$max_rel' is not a number" >&2; exit 2; }
[ -x "$py" ] || command -v "$py" >/dev/null ||
	{ echo "$me: $py not found: make venv makes the test environment, or set PYTHON" >&2; exit 2; }
for t in vps-layout vps-plan vps-stage vps-exec; do
	[ -x "$top/bin/$t" ] || { echo "$me: bin/$t missing: run make" >&2; exit 2; }
done
steps=$((3 * every))

if [ -n "$keep" ]; then
	mkdir -p "$keep"
	dir=$keep
else
	dir=$(mktemp -d "${TMPDIR:-/tmp}/vps-elastic.XXXXXX")
	trap 'rm -rf "$dir"' EXIT
fi
rm -rf "$dir/elastic" "$dir/same-world" "$dir/asked" "$dir/control"
export VPS_TOKEN=${VPS_TOKEN:-$("$top/bin/vps-exec" --new-token)}
common=(--model micro-llama --gpus-per-node 8 --switch-every "$every" --check-switch)
fail() {
	echo "$me: $*" >&2
	[ -n "$keep" ] || { trap - EXIT; echo "$me: the runs are kept in $dir" >&2; }
	exit 1
}
launch() { # NAME LAUNCH-ARGS...
	local name=$1 rc=0
	shift
	mkdir -p "$dir/$name"
	"$py" "$top/examples/torch/launch.py" "${common[@]}" --dir "$dir/$name" "$@" 2>&1 |
		tee "$dir/$name/launch.out" || rc=$?
	[ "$rc" = 0 ] || fail "the $name run failed (launch.py exited $rc; its logs: $dir/$name)"
}

launch elastic --nproc 4 --steps "$steps" --configs "$configs" --compare-static
out=$dir/elastic/launch.out
tsv=$dir/elastic/switches.tsv
# what the run did, from its own files: the worlds it went through, the
# checks launch.py counted, the loss against the static run
[ -s "$tsv" ] || fail "the run switched no world ($tsv is empty)"
n=$(wc -l < "$tsv")
worlds=$(awk -F'\t' 'NR == 1 { w = $5 } $6 != last { w = w "->" $6; last = $6 } END { print w }' "$tsv")
[ "$n" = 2 ] && [ "$worlds" = "4->8->4" ] || fail "$n switches through worlds $worlds; the run asked for 4->8->4"
grep -q "(--check-switch): $n of $n\$" "$out" || fail "not every switch was equal bit for bit (--check-switch)"
grep -Eq "\(vps-exec --check\): ([1-9][0-9]*) of \\1\$" "$out" ||
	fail "not every executor's digest matched (vps-exec --check)"
grep -q "every sample read exactly once, .*: $((8 * steps)) samples in $steps steps\$" "$out" ||
	fail "not every sample was read once at the global batch"
dev=$(awk -v a="$dir/elastic/static/loss.txt" '
	FILENAME == a { ref[$1] = $2; next }
	!ref[$1] { missing = 1; next }
	{ d = ($2 - ref[$1]) / ref[$1]; if (d < 0) d = -d; if (d > m) m = d; n++ }
	END { if (n && !missing) printf "%.3g\n", m }' "$dir/elastic/static/loss.txt" "$dir/elastic/loss.txt")
[ -n "$dev" ] || fail "a step without a loss to compare with the static run's"
awk -v d="$dev" -v r="$max_rel" 'BEGIN { exit !(d <= r) }' ||
	fail "the loss deviates $dev from the static run's, over --max-rel $max_rel"
overlap=$(awk -F'\t' '$5 != $6 { h += $9; p += $12 } END { printf "%.0f\n", (h + p > 0 ? 100 * h / (h + p) : 100) }' "$tsv")

if [ "$doc" = 1 ]; then
	# the join's plan without the join: 8 processes from the start, 4 of them
	# spares holding nothing, one switch tp=2,dp=2 -> dp=8 in that world
	launch same-world --nproc 8 --steps $((2 * every)) --configs "${configs%,*}"
	same=$dir/same-world/switches.tsv
	[ "$(wc -l < "$same")" = 1 ] || fail "the same-world run did not switch once ($same)"
	# the same worlds asked for through --control, as a scheduler would: the
	# job trains on until the new world is made, where the scheduled switch
	# waits for it at its step (steps to spare for the asked ones to happen)
	printf '%s\n' "${configs#*,}" | tr ',' '\n' > "$dir/control"
	asked_steps=$((6 * every > 48 ? 6 * every : 48))
	launch asked --nproc 4 --steps "$asked_steps" --configs "${configs%%,*}" --control "$dir/control"
	asked=$dir/asked/switches.tsv
	[ "$(wc -l < "$asked")" = 2 ] || fail "the asked run did not switch twice ($asked)"
	bytes() { # DIR K: the bytes every rank's executor received or copied in switch K
		cat "$1"/report."$2".*.yaml | awk '/^  bytes_(received|copied):/ { s += $2 } END { print s + 0 }'
	}
	# bytes as the tools print them (vps(7) UNITS)
	units='function size(n,  k, u) { split("B KiB MiB GiB TiB", u, " "); k = 1
		while (n >= 999.5 && k < 5) { n /= 1024; k++ }
		return k == 1 ? sprintf("%d B", n) : sprintf(n >= 99.95 ? "%.0f %s" : n >= 9.995 ? "%.1f %s" : "%.2f %s", n, u[k]) } '
	rows() { # RUN HOW: a row of the table for each switch of RUN
		while IFS= read -r line; do
			awk -F'\t' -v b="$(bytes "$dir/$1" "${line%%$'\t'*}")" -v how="$2" "$units"'{
				if ($5 == $6)
					printf "| %s: %s -> %s at step %d | %d (4 spares) | - | - | %.2f | %.2f | %.2f | - | %s |\n",
						how, $3, $4, $2, $5, $10, $11, $12, size(b)
				else
					printf "| %s: %s -> %s at step %d | %d -> %d (%d %s) | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f%% | %s |\n",
						how, $3, $4, $2, $5, $6, ($5 < $6 ? $6 - $5 : $5 - $6), ($5 < $6 ? "join" : "leave"), $8, $9,
						$10, $11, $12, ($9 + $12 > 0 ? 100 * $9 / ($9 + $12) : 100), size(b) }' <<< "$line"
		done < "$dir/$1/switches.tsv"
	}
	verdict() { # RUN HOW: the join of RUN against the targets
		awk -F'\t' -v same="$(cut -f12 "$same")" -v jb="$(bytes "$dir/$1" 1)" -v sb="$(bytes "$dir/same-world" 1)" \
			-v how="$2" "$units"'NR == 1 {
			o = ($9 + $12 > 0 ? 100 * $9 / ($9 + $12) : 100)
			printf "The %s join: %.0f%% of the new world'"'"'s making hidden (target >= 90%%: %s); its pause %.2f s, %.1fx",
				how, o, (o >= 90 ? "met" : "not met"), $12, $12 / same
			printf " that of the same switch in a world of 8 from the start, %.2f s (target <= 1.5x: %s)", same,
				($12 <= 1.5 * same ? "met" : "not met")
			printf "%s.\n", (jb == sb ? "; both moved " size(jb) : "; they moved " size(jb) " and " size(sb))
		}' "$dir/$1/switches.tsv"
	}
	{
		echo
		"$top/scripts/bench/doc-stamp.sh" "scripts/elastic.sh --switch-every $every --doc"
		echo
		echo "micro-llama over gloo, a process per rank, 8 samples a step. *Scheduled*: $steps steps, a switch"
		echo "every $every (launch.py --configs). *Same world*: the first of them in a world of 8 from the start."
		echo "*Asked*: the same worlds written to launch.py --control at the start, $asked_steps steps."
		echo "Seconds. *New world made*: the joining processes' start where they were up before the switch"
		echo "was asked for (a scheduled join starts them with the job), then the world made with them."
		echo "*Pause*: the job stood still at the switch, waiting for the new world, then in the"
		echo "switch itself (vps-exec), the slowest rank's. *Overlap*: hidden / (hidden + pause)."
		echo
		echo "| switch | processes | new world made | of it hidden | waited for it | switch | pause | overlap | bytes moved |"
		echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
		rows elastic scheduled
		rows same-world "same world"
		rows asked asked
		echo
		verdict elastic scheduled
		echo
		verdict asked asked
		echo
	} > "$dir/table.md"
	cat "$dir/table.md"
	"$top/scripts/bench/doc-section.sh" elastic "$top/docs/BENCHMARKS.md" < "$dir/table.md"
fi
echo "elastic: $n switches, worlds $worlds, bit for bit, loss within $dev of static, overlap $overlap%"
