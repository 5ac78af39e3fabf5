#!/usr/bin/env bash
# The GPU section of docs/BENCHMARKS.md, made from the raw output of
# scripts/gpu-check.sh (by default the newest kept docs/gpu-check-*.txt), so
# its figures are the check's, never typed; and the check's rows of
# PyTorch's distributed checkpoint against vps on the GPU (gpu-* methods)
# merged into docs/bench/switch-vs-size.tsv, its plot redrawn where
# matplotlib is. With --run, runs scripts/gpu-check.sh first (needs a
# working nvidia-smi) and keeps its output as docs/gpu-check-GPU.txt.
#   scripts/bench/gpu_section.sh [--run] [FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
run=0
[ "${1:-}" = --run ] && { run=1; shift; }
src=${1:-}
if [ "$run" = 1 ]; then
	t=$(mktemp -d)
	trap 'rm -rf "$t"' EXIT
	scripts/gpu-check.sh "$t/gpu-check.txt" || true
	slug=$(sed -n 's/^gpu: //p' "$t/gpu-check.txt" | grep -oiE '[abhlv][0-9]{2,3}' | head -1 | tr 'A-Z' 'a-z')
	src=${src:-docs/gpu-check-${slug:-gpu}.txt}
	cp "$t/gpu-check.txt" "$src"
fi
# the newest by the date the check wrote in its first line (a clone's
# files all have the clone's time)
newest() {
	local f
	for f in docs/gpu-check-*.txt; do
		[ -r "$f" ] || continue
		printf '%s\t%s\n' "$(head -1 "$f" | grep -oE '[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]+Z' | head -1)" "$f"
	done | sort -r | head -1 | cut -f2
}
[ -n "$src" ] || src=$(newest)
[ -n "$src" ] && [ -r "$src" ] || { echo "gpu_section.sh: ${src:-docs/gpu-check-*.txt}: cannot read" >&2; exit 2; }
grep -q '^copy: ' "$src" || { echo "gpu_section.sh: $src: no copy benchmark lines (not gpu-check.sh output?)" >&2; exit 2; }
hdr=$(head -1 "$src")
gpu=$(sed -n 's/^gpu: //p' "$src")
{
	if [ "$run" = 1 ]; then
		scripts/bench/doc-stamp.sh "scripts/bench/gpu_section.sh --run"
	else
		echo "Made by \`scripts/bench/gpu_section.sh\` from the kept [$src](${src#docs/}) (no GPU here, nothing rerun): ${hdr#\# }; GPU: $gpu."
	fi
	echo
	awk '/^PASS / { p++ } /^FAIL / { f++ } /^SKIP / { s++ }
		END { printf "Checks: %d passed, %d failed, %d skipped (each named in the file).\n", p, f, s }' "$src"
	sed -n 's/^\(result: .*\)/\1./p' "$src"
	# the failed checks rerun after a fix, within the same lease
	# (VPS_CHECK_ONLY), kept beside the whole run as gpu-rerun-GPU.txt
	rerun=${src/gpu-check-/gpu-rerun-}
	if [ "$rerun" != "$src" ] && [ -r "$rerun" ]; then
		echo
		echo "Rerun after a fix, kept in [$rerun](${rerun#docs/}): $(head -1 "$rerun" | sed 's/^# //'):"
		echo
		sed -n 's/^\(PASS\|FAIL\|SKIP\) \(.*\)/- \1 \2/p' "$rerun" | grep -v '^- PASS build '
	fi
	echo
	echo "| kernel (\`build/bench/gpu_copy_bench 1024\`) | bytes | GB/s | vs cudaMemcpy | digest vs its floor |"
	echo "|---|---:|---:|---:|---:|"
	# copy: NAME   BYTES bytes  S s   R GB/s  X cudaMemcpy (M GB/s)[; F its floor (...)]
	awk '/^copy: / && / bytes / {
		line = substr($0, 7); i = match(line, / +[0-9]+ bytes/)
		name = substr(line, 1, i - 1); sub(/: /, ", ", name)
		nf = split(substr(line, i), f, " +")
		b = f[2]; u = "B"
		if (b % 1073741824 == 0) { b /= 1073741824; u = "GiB" } else if (b % 1048576 == 0) { b /= 1048576; u = "MiB" }
		else if (b >= 1048576) { b /= 1048576; u = "MiB" }
		fl = ""; for (k = 1; k + 2 <= nf; k++) if (f[k + 1] == "its" && f[k + 2] ~ /^floor/) fl = f[k]
		printf "| %s | %d %s | %.0f | %s | %s |\n", name, b, u, f[6], f[8], fl }' "$src"
	# the switches: each benchmark's lines, as the check wrote them
	for block in "switch|The switch (scripts/bench/gpu_switch.sh)" \
		"switch-check|The same switch with the digests on the GPU (vps-exec --check)" \
		"switch-big|A state of more than 8 GiB a rank" \
		"replay|Each rank's kernels alone on the GPU (gpu_copy_bench --replay)" \
		"switch-one|A world of one rank: the copy kernel with the GPU to itself" \
		"example|The PyTorch example with its state on the GPU (examples/torch --device cuda)" \
		"megatron|Megatron-Core's job on the GPU, each switch prepared while it trains (tests/gpu/megatron_job.py)" \
		"megatron-unprepared|The same job, each switch built in the pause (megatron_job.py --no-prepare)" \
		"megatron-failed|The same job, its switch failed by the executor's death (megatron_job.py --failed-switch)" \
		"megatron-pause|The CPU check of a Megatron-Core job's pause (tests/megatron/check_switch.py) on the GPU machine's cores"; do
		prefix=${block%%|*} title=${block#*|}
		# a benchmark that failed in the whole run and passed its rerun
		from=$src
		grep -q "^$prefix: " "$from" || from=${rerun:-}
		[ -n "$from" ] && [ -r "$from" ] && grep -q "^$prefix: " "$from" || continue
		echo
		echo "$title$([ "$from" = "$src" ] || echo ", from the rerun"):"
		echo
		sed -n "s/^$prefix: \(.*\)/- \1/p" "$from" | grep -v '^- vps-trainer: '
		# what any digest that checks apart from the copy must cost: it reads
		# the sources and the targets (twice the bytes moved) at best at the
		# memory traffic cudaMemcpy reached (a read and a write a byte)
		# (gpu_switch.sh says so itself since issue 42; kept files before
		# it get the line from here)
		[ "$prefix" != switch-check ] || grep -q '^switch-check: digest against its floor' "$src" ||
			awk '/^switch-check: bytes moved/ { for (i = 1; i <= NF; i++) if ($i == "GB") b = $(i - 1) }
			/^switch-check: cudaMemcpy D2D/ { for (i = 1; i <= NF; i++) if ($i == "GB/s;") m = $(i - 1) }
			/^switch-check: pause/ { for (i = 1; i <= NF; i++) if ($i == "transfer") t = $(i + 1) }
			END { if (b > 0 && m > 0 && t > 0)
				printf "- the least any digest apart from the copy can cost: reading %.1f GB (sources and targets) at the %.0f GB/s of memory traffic cudaMemcpy reached, %.1f ms, %.0f%% of the transfer\n", 2 * b, 2 * m, 1000 * b / m, 100 * b / m / t }' "$src"
	done
	if grep -q '^switch-vs-size: ' "$src"; then
		echo
		echo "| state (GB, 8 ranks) | vps ipc pause (s) | DCP save (s) | DCP load (s) | DCP save + load (s) | DCP / vps |"
		echo "|---:|---:|---:|---:|---:|---:|"
		sed -n 's/^switch-vs-size: //p' "$src" | awk -F'\t' '
			{ if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } v[$1, $2] = $3 }
			END { for (i = 1; i <= n; i++) { b = order[i]
				printf "| %.2f | %.3f | %.3f | %.3f | %.3f | %.1fx |\n", b / 1e9, v[b, "gpu-vps-ipc"], v[b, "gpu-dcp-save"],
					v[b, "gpu-dcp-load"], v[b, "gpu-dcp-total"], v[b, "gpu-dcp-total"] / v[b, "gpu-vps-ipc"] } }'
	fi
} | scripts/bench/doc-section.sh gpu docs/BENCHMARKS.md
echo "wrote the gpu section of docs/BENCHMARKS.md from $src"
# the GPU's rows of the switch-vs-size figure: the check's, replacing any
# kept before (ckpt_restart.sh writes the CPU's)
if grep -q '^switch-vs-size: ' "$src"; then
	tsv=docs/bench/switch-vs-size.tsv
	{
		awk -F'\t' '$2 !~ /^gpu-/' "$tsv"
		sed -n 's/^switch-vs-size: //p' "$src"
	} > "$tsv.tmp"
	mv "$tsv.tmp" "$tsv"
	py=/usr/bin/python3
	[ ! -x build/venv/bin/python ] || py=build/venv/bin/python # the Makefile's, where make check made it
	if "$py" -c 'import matplotlib' 2>/dev/null; then
		"$py" scripts/bench/plot_switch_size.py
		echo "merged the GPU's rows into $tsv and redrew docs/bench/switch-vs-size.svg"
	else
		echo "gpu_section.sh: python3-matplotlib is missing: merged the GPU's rows into $tsv, the plot not redrawn" >&2
	fi
fi
