#!/usr/bin/env bash
# The scale benchmarks' transition: Qwen3-235B-A22B (4,8,dp,16) ->
# (8,16,dp/4,8), ZeRO-1, at the paper's 128 ranks (dp 4 -> 1) or any
# multiple of 128 (DP grown). Writes the two layouts to A_FILE and B_FILE.
#   scripts/bench/qwen235b-layouts.sh WORLD A_FILE B_FILE
set -euo pipefail
cd "$(dirname "$0")/../.."
W=$1
if [ $((W % 128)) -ne 0 ]; then
	echo "qwen235b-layouts.sh: $W: the world is a multiple of 128" >&2
	exit 2
fi
M=qwen3-235b-a22b
bin/vps-layout --model $M --parallel tp=4,pp=8,ep=16,etp=1,first=11,last=11,zero=1,dp=$((W / 32)) -o "$2"
bin/vps-layout --model $M --parallel tp=8,pp=16,ep=8,etp=1,first=5,last=5,zero=1,dp=$((W / 128)) -o "$3"
