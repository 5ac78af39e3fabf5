#!/usr/bin/env bash
# PyTorch-allocated GPU state switched over ipc: tiny-gpt (1,1,2) -> (2,1,1)
# and back, two PyTorch trainers (tests/gpu/torch_trainer.py) and two
# executors. Needs a GPU and python3 with torch (PYTHON, default python3).
#
#   tests/gpu/torch_switch.sh [--cpu]
#
# --cpu: the trainers' state in host memory, no GPU: the same ctypes
# mirror of struct vps_trainer_opts, which make check runs (standin.bats).
set -euo pipefail
cpu=()
[ "${1:-}" = --cpu ] && cpu=(--cpu)
py=${PYTHON:-python3}
export VPS_TOKEN=${VPS_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
top=$(cd "$(dirname "$0")/../.." && pwd)
bin=$top/bin
export VPS_CONFIG_PATH=$top/configs
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
"$bin/vps-layout" --model tiny-gpt --parallel tp=1,pp=1,dp=2,zero=1 -o a.layout
"$bin/vps-layout" --model tiny-gpt --parallel tp=2,pp=1,dp=1,zero=1 -o b.layout
"$bin/vps-plan" a.layout b.layout -o ab.plan && "$bin/vps-stage" --budget 1MiB ab.plan -o ab.staged
"$bin/vps-plan" b.layout a.layout -o ba.plan && "$bin/vps-stage" --budget 1MiB ba.plan -o ba.staged
port=$("$top/scripts/free-port.sh")
pids=()
for r in 0 1; do
	timeout 120 "$py" "$top/tests/gpu/torch_trainer.py" ${cpu[@]+"${cpu[@]}"} "$top/build/libvps.so" "torch$$-$r" "$r" ab.staged ba.staged &
	pids+=($!)
done
for r in 0 1; do
	timeout 120 "$bin/vps-exec" --registry "torch$$-$r" --rank "$r" --world 2 --master "127.0.0.1:$port" --transport ipc \
		--wait --check --serve ab.staged ba.staged &
	pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
