#!/usr/bin/env bash
# One rank's sub-VPS of Qwen3-235B-A22B: the paper's (4,8,4,16) at 128 ranks
# next to the same configuration with DP grown to 512 (16,384 ranks). The
# per-rank cost must not depend on the world size.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s all
P=tp=4,pp=8,ep=16,etp=1,first=11,last=11,zero=1
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
small="bin/vps-layout --model qwen3-235b-a22b --parallel $P,dp=4 --rank 77 -o $t/out"
large="bin/vps-layout --model qwen3-235b-a22b --parallel $P,dp=512 --rank 9877 -o $t/out"
hyperfine -N --warmup 3 --runs "${RUNS:-30}" --export-markdown "${OUT:-/dev/stdout}" "$small" "$large"
