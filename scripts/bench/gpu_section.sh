#!/usr/bin/env bash
# The GPU section of docs/BENCHMARKS.md, made from the raw output of
# scripts/gpu-check.sh (by default the kept docs/gpu-check-h100.txt), so its
# figures are the check's, never typed. With --run, runs scripts/gpu-check.sh
# first (needs a working nvidia-smi) and keeps its output in that file.
#   scripts/bench/gpu_section.sh [--run] [FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
run=0
[ "${1:-}" = --run ] && { run=1; shift; }
src=${1:-docs/gpu-check-h100.txt}
if [ "$run" = 1 ]; then
	t=$(mktemp -d)
	trap 'rm -rf "$t"' EXIT
	scripts/gpu-check.sh "$t/gpu-check.txt"
	cp "$t/gpu-check.txt" "$src"
fi
[ -r "$src" ] || { echo "gpu_section.sh: $src: cannot read" >&2; exit 2; }
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
	echo "| copy kernel (\`build/bench/gpu_copy_bench 1024\`) | bytes | GB/s | vs cudaMemcpy |"
	echo "|---|---:|---:|---:|"
	# copy: NAME   BYTES bytes  S s   R GB/s  X cudaMemcpy (M GB/s)
	awk '/^copy: / {
		line = substr($0, 7); i = match(line, / +[0-9]+ bytes/)
		name = substr(line, 1, i - 1); sub(/: /, ", ", name)
		split(substr(line, i), f, " +")
		b = f[2]; u = "B"
		if (b % 1073741824 == 0) { b /= 1073741824; u = "GiB" } else if (b % 1048576 == 0) { b /= 1048576; u = "MiB" }
		printf "| %s | %d %s | %.0f | %s |\n", name, b, u, f[6], f[8] }' "$src"
	echo
	sed -n "s/^switch: \(switch [^:]*\)$/- \1:/p; s/^switch: \(bytes moved.*\)/- \1;/p; s/^switch: \(cudaMemcpy.*\)/- \1;/p; s/^switch: \(pause.*\)/- \1./p" "$src"
} | scripts/bench/doc-section.sh gpu docs/BENCHMARKS.md
echo "wrote the gpu section of docs/BENCHMARKS.md from $src"
