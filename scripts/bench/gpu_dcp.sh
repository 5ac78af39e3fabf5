#!/usr/bin/env bash
# vps against PyTorch's distributed checkpoint on the GPU, side by side in
# one run: the same state as scripts/bench/ckpt_restart.sh's (8 ranks,
# FROM -> TO, the same three models), held in GPU memory. vps: the pause of
# a switch over ipc (scripts/bench/gpu_switch.sh: the last rank's request to
# the slowest rank's resume, every element checked by the trainers). DCP:
# scripts/bench/gpu_dcp.py, CUDA tensors saved from A and loaded resharded
# into B, every element checked. One line per figure, as
# docs/bench/switch-vs-size.tsv has them: state bytes, method, seconds
# (gpu-vps-ipc, gpu-dcp-save, gpu-dcp-load, gpu-dcp-total).
#
#   scripts/bench/gpu_dcp.sh
#   env: MODELS (default ckpt-42m, ckpt-84m, bench-170m of scripts/bench/models),
#        FROM, TO (default as ckpt_restart.sh's), PYTHON (one with torch,
#        CUDA and torch.distributed.checkpoint; default python3),
#        CKPT_DIR (where DCP writes: a disk, not tmpfs; default /var/tmp),
#        DCP_DEVICE (cuda; cpu runs DCP's side on the CPU, for a dry run
#        where vps runs on the stand-ins)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
bin=${VPS_BIN:-$top/bin}
py=${PYTHON:-python3}
mdir=$top/scripts/bench/models
models=${MODELS:-"$mdir/ckpt-42m.yaml $mdir/ckpt-84m.yaml $mdir/bench-170m.yaml"}
from=${FROM:-tp=2,pp=2,dp=2,zero=1} to=${TO:-tp=4,pp=1,dp=2,zero=1}
export VPS_CONFIG_PATH=$top/configs
t=$(mktemp -d)
files=$(mktemp -d "${CKPT_DIR:-/var/tmp}/vps-gdcp.XXXXXX")
trap 'rm -rf "$t" "$files"' EXIT
for m in $models; do
	"$bin/vps-layout" -q --model "$m" --parallel "$from" -o "$t/a.layout"
	"$bin/vps-layout" -q --model "$m" --parallel "$to" -o "$t/b.layout"
	bytes=$("$bin/vps-layout" -i "$t/a.layout" --stats | awk '$1 == "total_bytes:" { print $2 }')
	"$top/scripts/bench/gpu_switch.sh" --budget 512MiB --memcpy 256 "$m" "$from" "$to" > "$t/vps.out"
	pause=$(sed -n 's/^pause (last request to resume[^:]*: \([0-9.]*\) s:.*/\1/p' "$t/vps.out")
	[ -n "$pause" ] || { cat "$t/vps.out" >&2; echo "gpu_dcp.sh: $m: no pause in gpu_switch.sh's output" >&2; exit 1; }
	rm -rf "${files:?}"/*
	"$py" "$top/scripts/bench/gpu_dcp.py" --device "${DCP_DEVICE:-cuda}" "$t/a.layout" "$t/b.layout" "$files" > "$t/dcp.out"
	save=$(awk '$1 == "save_seconds:" { print $2 }' "$t/dcp.out")
	load=$(awk '$1 == "load_seconds:" { print $2 }' "$t/dcp.out")
	printf '%s\tgpu-vps-ipc\t%s\n' "$bytes" "$pause"
	printf '%s\tgpu-dcp-save\t%s\n' "$bytes" "$save"
	printf '%s\tgpu-dcp-load\t%s\n' "$bytes" "$load"
	printf '%s\tgpu-dcp-total\t%s\n' "$bytes" "$(awk -v a="$save" -v b="$load" 'BEGIN { printf "%.4f", a + b }')"
done
