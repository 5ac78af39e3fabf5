#!/usr/bin/env bash
# Build vps and run every GPU test and GPU benchmark, in one call, on a bare
# GPU machine with CUDA, NCCL and PyTorch but no package registry. What the
# build lacks there (libyaml, libzstd headers) travels as Debian packages in
# .debs/ (make gpu-debs here) and is unpacked under /tmp, not into /.
#
#   scripts/gpu-check.sh [RESULTS]     (default: $OUT/gpu-check.txt, else build/gpu-check.txt)
#
# The results file gets one line per check (PASS/FAIL/SKIP and seconds) and
# the benchmark figures; the full log goes beside it (gpu-check.log). Exits
# 1 if any check failed.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
# the real CUDA and NCCL, never the host stand-ins (make check runs those)
for v in VPS_CUDA_LIBRARY VPS_NCCL_LIBRARY; do
	case ${!v:-} in
	*standin*) echo "gpu-check.sh: $v names a stand-in (${!v}): make check-gpu runs the real CUDA and NCCL" >&2; exit 2 ;;
	esac
done

res=${1:-${OUT:-$top/build}/gpu-check.txt}
mkdir -p "$(dirname "$res")"
log=${res%.txt}.log
: > "$res"
: > "$log"
say() { echo "$*" | tee -a "$res"; }
failed=0
check() {
	local name=$1 t0 rc
	shift
	t0=$(date +%s.%N)
	echo "=== $name: $*" >> "$log"
	# a hang costs one check, not the call: shell functions run under bash
	timeout "${VPS_CHECK_TIMEOUT:-150}" bash -c '"$@"' check "$@" >> "$log" 2>&1
	rc=$?
	local dt
	dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
	if [ $rc = 0 ]; then say "PASS $name (${dt%.*}s)"; else say "FAIL $name (exit $rc, ${dt%.*}s)"; failed=1; fi
	return $rc
}

say "# vps GPU check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo none)"
say "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
say "nvcc: $("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | tail -1)"

# what the build lacks: Debian's -dev packages, unpacked beside the tree
if ! echo '#include <yaml.h>' | cc -E - >/dev/null 2>&1 || ! echo '#include <zstd.h>' | cc -E - >/dev/null 2>&1; then
	deps=/tmp/vps-deps
	mkdir -p "$deps"
	for d in .debs/*.deb; do dpkg -x "$d" "$deps"; done
	export CPATH=$deps/usr/include${CPATH:+:$CPATH}
	export LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
	export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	say "deps: libyaml/libzstd unpacked from .debs"
fi
# NCCL: with CUDA, or PyTorch's wheel
if [ ! -f "$CUDA_HOME/include/nccl.h" ]; then
	nccl=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null || true)
	if [ -n "$nccl" ] && [ -f "$nccl/include/nccl.h" ]; then
		export NCCL_HOME=$nccl
		export VPS_NCCL_LIBRARY=$(ls "$nccl"/lib/libnccl.so* | head -1)
	fi
fi
say "nccl: ${NCCL_HOME:-$CUDA_HOME} ${VPS_NCCL_LIBRARY:-}"
say "torch: $(python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>/dev/null || echo none)"

mkdir -p build && touch build/.deps-ok   # no apt-get here: the deps are above
check build make -j"$(nproc)" all build/tests/test_gpu build/bench/gpu_copy_bench NCCL_HOME="${NCCL_HOME:-}" || {
	tail -30 "$log"; exit 1; }

check unit-gpu build/tests/test_gpu
grep -E "skipped|failed" "$log" | grep test_gpu -A0 | tee -a "$res" >/dev/null

# every family and dimension over ipc with GPU memory, W = 2, 4, 6, 8
demo() { scripts/demo.sh --transport ipc --cuda "$@"; }
export -f demo
check "ipc W=8 tiny-llama TP+PP, ZeRO-1, and back (serve)" demo --back
check "ipc W=8 tiny-llama DP<->PP" demo --from tp=2,pp=2,dp=2,zero=1 --to tp=2,pp=1,dp=4,zero=1 --back
check "ipc W=4 tiny-gpt VPP" demo --model tiny-gpt --np 4 --from tp=1,pp=2,dp=2,vpp=2,zero=1 --to tp=2,pp=2,dp=1,zero=1 --back
check "ipc W=8 tiny-qwen3-moe EP" demo --model tiny-qwen3-moe --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=2,pp=1,dp=4,ep=4,etp=2,zero=1 --back
check "ipc W=6 tiny-qwen3-moe EP, uneven stages" demo --model tiny-qwen3-moe --from tp=2,pp=1,dp=3,ep=2,etp=1,zero=1 --to tp=2,pp=3,dp=1,first=2,last=2,zero=0
check "ipc W=2->4 tiny-gpt join" demo --model tiny-gpt --np 4 --from tp=2,pp=1,dp=1,zero=1 --to tp=2,pp=1,dp=2,zero=1
check "ipc W=4->2 tiny-gpt leave" demo --model tiny-gpt --np 4 --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=1,dp=1,zero=1
check "ipc W=2 tiny-llama TP->DP" demo --np 2 --from tp=2,pp=1,dp=1,zero=1 --to tp=1,pp=1,dp=2,zero=1 --back
check "ipc W=6 tiny-llama not a power of two" demo --from tp=2,pp=1,dp=3,zero=1 --to tp=1,pp=2,dp=3,zero=1
check "nccl W=1 (self), GPU memory" demo --np 1 --transport nccl --from tp=1,pp=1,dp=1 --to tp=1,pp=1,dp=1,zero=1 --back
check "auto W=8 one node (ipc)" demo --transport auto

# a rank killed mid-stage: every rank stops, named, and sources are intact
killed() {
	local d=/tmp/vps-killed
	rm -rf "$d"
	if scripts/demo.sh --transport ipc --cuda --budget 1MiB --timeout 5 --fault-rank 1 exit:1 --keep "$d"; then return 1; fi
	grep -h . "$d"/exec.*.log | grep -v '^$' | head -20
	grep -q "sources intact" "$d"/trainer.0.log && ! grep -q DAMAGED "$d"/trainer.*.log &&
		[ "$(grep -l "rank" "$d"/exec.*.log | wc -l)" -ge 7 ]
}
export -f killed
check "ipc killed rank mid-stage stops everyone, sources intact" killed

# PyTorch's allocator: tensors registered by device pointer through ctypes
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
	check "PyTorch CUDA tensors registered via ctypes and switched" tests/gpu/torch_switch.sh
else
	say "SKIP PyTorch test: no torch with CUDA"
fi

if command -v compute-sanitizer >/dev/null; then
	check "compute-sanitizer memcheck: copy kernel tests" compute-sanitizer --report-api-errors no --error-exitcode 9 build/tests/test_gpu
	check "compute-sanitizer memcheck: executors of one ipc switch" demo --np 2 --from tp=2,pp=1,dp=1,zero=1 \
		--to tp=1,pp=1,dp=2,zero=1 --exec-prefix "compute-sanitizer --report-api-errors no --error-exitcode 9"
else
	say "SKIP compute-sanitizer: not installed"
fi

say "## benchmarks"
if build/bench/gpu_copy_bench 1024 > /tmp/vps-copy-bench.txt 2>> "$log"; then
	sed 's/^/copy: /' /tmp/vps-copy-bench.txt | tee -a "$res"
else
	say "FAIL copy benchmark"; failed=1
fi
if timeout 400 scripts/bench/gpu_switch.sh > /tmp/vps-switch-bench.txt 2>> "$log"; then
	sed 's/^/switch: /' /tmp/vps-switch-bench.txt | tee -a "$res"
else
	say "FAIL switch benchmark"; failed=1
fi
say "result: $([ $failed = 0 ] && echo all passed || echo FAILURES)"
exit $failed
