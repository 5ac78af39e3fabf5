#!/usr/bin/env bash
# Build vps and run every GPU test and GPU benchmark, in one call, on a bare
# GPU machine with CUDA, NCCL and PyTorch but no package registry. What the
# build lacks there (libyaml, libzstd) travels as Debian packages in .debs/,
# and the Python packages it lacks (megatron-core) as wheels in .whl/ (make
# gpu-debs here, then carry .debs and .whl); both unpacked under /tmp, not
# into /.
#
#   scripts/gpu-check.sh [--digest] [RESULTS]
#   (default: $OUT/gpu-check-GPU.txt, else build/gpu-check-GPU.txt; GPU is
#   h100, h200, ... from nvidia-smi's name)
#
# --digest: only what the digest needs (a few minutes): the build, the GPU
# unit tests (the digest kernel against the host's), compute-sanitizer on
# them, the kernel benchmarks (each digest against its floor) and the
# eight-rank switch with --check (its digest against its floor); results
# in gpu-digest-GPU.txt.
#
# The results file names the commit and the GPU, and gets one line per
# check (PASS/FAIL/SKIP and seconds) and the benchmark figures; the full log
# goes beside it (.log). Keep it as docs/gpu-check-GPU.txt and run
# scripts/bench/gpu_section.sh on it: that writes docs/BENCHMARKS.md's GPU
# section and merges its switch-vs-size rows into docs/bench/. Each check
# runs under a timeout (VPS_CHECK_TIMEOUT, default 150 s, longer for the
# long ones), and the whole keeps to a budget (VPS_CHECK_BUDGET, default
# 540 s): what would start past it is SKIPped, so that one call of at most
# ten minutes brings back results. Exits 1 if any check failed or was
# skipped for time. VPS_CHECK_ONLY (an extended regular expression) runs
# only the checks whose names it matches, after the build: a rerun of what
# failed, within what is left of a lease.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
# the real CUDA and NCCL, never the host stand-ins (make check runs those)
for v in VPS_CUDA_LIBRARY VPS_NCCL_LIBRARY; do
	case ${!v:-} in
	*standin*) echo "gpu-check.sh: $v names a stand-in (${!v}): make check-gpu runs the real CUDA and NCCL" >&2; exit 2 ;;
	esac
done

only=check
[ "${1:-}" = --digest ] && { only=digest; shift; }
began=$(date +%s)
budget=${VPS_CHECK_BUDGET:-540}
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
slug=$(echo "$gpu" | grep -oiE '[abhlv][0-9]{2,3}' | head -1 | tr 'A-Z' 'a-z')
res=${1:-${OUT:-$top/build}/gpu-$only-${slug:-gpu}.txt}
mkdir -p "$(dirname "$res")"
log=${res%.txt}.log
: > "$res"
: > "$log"
say() { echo "$*" | tee -a "$res"; }
failed=0
# check NAME SECONDS COMMAND...: PASS, FAIL or SKIP (past the budget)
check() {
	local name=$1 limit=$2 t0 rc left
	shift 2
	[ "$name" = build ] || [ -z "${VPS_CHECK_ONLY:-}" ] || [[ $name =~ $VPS_CHECK_ONLY ]] || return 0
	left=$((budget - ($(date +%s) - began)))
	if [ "$left" -lt $((limit / 4)) ]; then
		say "SKIP $name (${left}s of the ${budget}s budget left)"
		failed=1
		return 1
	fi
	[ "$limit" -le "$left" ] || limit=$left
	t0=$(date +%s.%N)
	echo "=== $name: $*" >> "$log"
	# a hang costs one check, not the call: shell functions run under bash
	timeout "$limit" bash -c '"$@"' check "$@" >> "$log" 2>&1
	rc=$?
	local dt
	dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
	if [ $rc = 0 ]; then say "PASS $name (${dt%.*}s)"; else say "FAIL $name (exit $rc, ${dt%.*}s)"; failed=1; fi
	return $rc
}
# bench NAME SECONDS PREFIX COMMAND...: a check whose output goes to the
# results, each line after PREFIX
bench() {
	local name=$1 limit=$2 prefix=$3 out
	shift 3
	out=$(mktemp)
	if check "$name" "$limit" bash -c '"$@" > '"$out" bench "$@"; then
		sed "s/^/$prefix: /" "$out" | tee -a "$res"
	else
		cat "$out" >> "$log"
	fi
	rm -f "$out"
}
t=${VPS_CHECK_TIMEOUT:-150}

# a copy of the tree without .git (the GPU machine's) names its commit in VPS_COMMIT
if [ -n "${VPS_COMMIT:-}" ]; then
	commit=$VPS_COMMIT
else
	commit=$(git rev-parse --short HEAD 2>/dev/null || echo none)
	[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit (with uncommitted changes)"
fi
say "# vps GPU check, $(date -u +%Y-%m-%dT%H:%MZ), commit $commit"
say "gpu: $gpu"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
say "nvcc: $("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | tail -1)"

# what the build lacks: Debian's packages, unpacked beside the tree
if ! echo '#include <yaml.h>' | cc -E - >/dev/null 2>&1 || ! echo '#include <zstd.h>' | cc -E - >/dev/null 2>&1; then
	deps=/tmp/vps-deps
	mkdir -p "$deps"
	ls .debs/*.deb >/dev/null 2>&1 || { say "FAIL deps: no yaml.h or zstd.h here and no .debs/ (make gpu-debs, and carry .debs)"; exit 1; }
	for d in .debs/*.deb; do dpkg -x "$d" "$deps"; done
	export CPATH=$deps/usr/include${CPATH:+:$CPATH}
	export LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
	export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	say "deps: libyaml/libzstd unpacked from .debs"
fi
py=${PYTHON:-python3}
# Python packages the machine lacks (megatron-core, emerging_optimizers:
# pure Python), carried as wheels in .whl/ (pip download ... -d .whl here)
if ls .whl/*.whl >/dev/null 2>&1; then
	site=/tmp/vps-site
	if "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl >> "$log" 2>&1; then
		export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
		say "wheels: $(cd .whl && ls *.whl | sed 's/-py3.*//; s/-cp3.*//' | tr '\n' ' ')from .whl"
	else
		say "FAIL wheels: pip could not install .whl/ (the log says why)"
		failed=1
	fi
fi
# NCCL: with CUDA, or PyTorch's wheel
if [ ! -f "$CUDA_HOME/include/nccl.h" ]; then
	nccl=$("$py" -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null || true)
	if [ -n "$nccl" ] && [ -f "$nccl/include/nccl.h" ]; then
		export NCCL_HOME=$nccl
		export VPS_NCCL_LIBRARY=$(ls "$nccl"/lib/libnccl.so* | head -1)
	fi
fi
say "nccl: ${NCCL_HOME:-$CUDA_HOME} ${VPS_NCCL_LIBRARY:-}"
torch_cuda=$("$py" -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>/dev/null || echo none)
say "torch: $torch_cuda ($py)"
export PYTHON=$py

mkdir -p build && touch build/.deps-ok # no apt-get here: the deps are above
check build 240 make -j"$(nproc)" all fault-bin build/tests/test_gpu build/bench/gpu_copy_bench NCCL_HOME="${NCCL_HOME:-}" || {
	tail -30 "$log"; exit 1; }

check unit-gpu 60 build/tests/test_gpu
grep -E "test_gpu: |skipped" "$log" | tee -a "$res" >/dev/null
# past here everything needs the GPU: a machine without a usable one stops
# (a --cuda trainer that cannot start leaves its executor waiting)
if why=$(grep -m1 "skipped, no GPU here" "$log"); then
	say "FAIL no usable GPU: ${why#*skipped, no GPU here }"
	say "result: FAILURES"
	exit 1
fi
finish() {
	say "took: $(($(date +%s) - began)) s"
	say "result: $([ $failed = 0 ] && echo all passed || echo FAILURES)"
	if [ "$only" = check ]; then
		echo "gpu-check.sh: keep it: cp $res docs/gpu-check-${slug:-gpu}.txt && scripts/bench/gpu_section.sh docs/gpu-check-${slug:-gpu}.txt" >&2
	else # a part of the check: kept beside the whole ones, not made the section
		echo "gpu-check.sh: keep it: cp $res docs/gpu-digest-${slug:-gpu}.txt" >&2
	fi
	exit $failed
}
if [ "$only" = digest ]; then
	if command -v compute-sanitizer >/dev/null; then
		check "compute-sanitizer memcheck: copy and digest kernel tests" 90 compute-sanitizer --report-api-errors no --error-exitcode 9 build/tests/test_gpu
	fi
	say "## benchmarks"
	bench "copy and digest kernels" 90 copy build/bench/gpu_copy_bench 1024
	bench "switch W=8 gpt3-1.3b, digests on the GPU" 150 switch-check scripts/bench/gpu_switch.sh --check gpt3-1.3b \
		tp=4,pp=2,dp=1 tp=2,pp=4,dp=1
	finish
fi

# Megatron-Core's own model, DDP and distributed optimizer on CUDA tensors,
# its state switched by vps.megatron.Job over ipc (a world of one GPU: what
# it proves and what not, tests/gpu/megatron_job.py)
if [[ $torch_cuda == *True* ]] && "$py" -c 'import megatron.core' >/dev/null 2>&1; then
	bench "Megatron-Core job on the GPU switched by vps, prepared while it trains" 200 megatron \
		"$py" tests/gpu/megatron_job.py -v
	bench "Megatron-Core job on the GPU switched by vps, built in the pause" 150 megatron-unprepared \
		"$py" tests/gpu/megatron_job.py --no-prepare
	bench "Megatron-Core job on the GPU whose switch fails: the hand-over undone, the job trains on" 150 \
		megatron-failed env VPS_BIN="$PWD/build/fault-bin" VPS_FAULT=exit:0 "$py" tests/gpu/megatron_job.py --failed-switch
else
	say "SKIP Megatron-Core on the GPU: no megatron-core here (carry it: pip download megatron-core==0.19.2 emerging_optimizers==0.3.0 -d .whl) or no torch with CUDA"
	failed=1
fi

# every family and dimension over ipc with GPU memory, W = 2, 4, 6, 8
demo() { scripts/demo.sh --transport ipc --cuda "$@"; }
export -f demo
check "ipc W=8 tiny-llama TP+PP, ZeRO-1, and back (serve)" "$t" demo --back
check "ipc W=8 tiny-llama DP<->PP" "$t" demo --from tp=2,pp=2,dp=2,zero=1 --to tp=2,pp=1,dp=4,zero=1 --back
check "ipc W=4 tiny-gpt VPP" "$t" demo --model tiny-gpt --np 4 --from tp=1,pp=2,dp=2,vpp=2,zero=1 --to tp=2,pp=2,dp=1,zero=1 --back
check "ipc W=8 tiny-qwen3-moe EP" "$t" demo --model tiny-qwen3-moe --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=2,pp=1,dp=4,ep=4,etp=2,zero=1 --back
check "ipc W=6 tiny-qwen3-moe EP, uneven stages" "$t" demo --model tiny-qwen3-moe --from tp=2,pp=1,dp=3,ep=2,etp=1,zero=1 --to tp=2,pp=3,dp=1,first=2,last=2,zero=0
check "ipc W=2->4 tiny-gpt join" "$t" demo --model tiny-gpt --np 4 --from tp=2,pp=1,dp=1,zero=1 --to tp=2,pp=1,dp=2,zero=1
check "ipc W=4->2 tiny-gpt leave" "$t" demo --model tiny-gpt --np 4 --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=1,dp=1,zero=1
check "ipc W=2 tiny-llama TP->DP" "$t" demo --np 2 --from tp=2,pp=1,dp=1,zero=1 --to tp=1,pp=1,dp=2,zero=1 --back
check "ipc W=6 tiny-llama not a power of two" "$t" demo --from tp=2,pp=1,dp=3,zero=1 --to tp=1,pp=2,dp=3,zero=1
# one holder, seven joiners: the receivers pass on what it sent them
# (vps-plan --relay), their forwards read from the GPU memory they received into
check "ipc W=1->8 tiny-llama join, relayed" "$t" demo --relay --from tp=1,pp=1,dp=1,zero=1 --to tp=1,pp=1,dp=8,zero=1
# Not here: transit (vps-plan --topology), which needs two nodes, and only
# nccl reaches another node; NCCL refuses two ranks of one communicator on
# one device, and vps-trainer puts every rank on device 0. It runs on the
# stand-ins (tests/bats/exec.bats).
check "nccl W=1 (self), GPU memory" "$t" demo --np 1 --transport nccl --from tp=1,pp=1,dp=1 --to tp=1,pp=1,dp=1,zero=1 --back
check "auto W=8 one node (ipc)" "$t" demo --transport auto

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
check "ipc killed rank mid-stage stops everyone, sources intact" "$t" killed

# PyTorch's allocator: tensors registered by device pointer through ctypes,
# and the example trainer with its state on the GPU against the CPU's
if [[ $torch_cuda == *True* ]]; then
	check "PyTorch CUDA tensors registered via ctypes and switched" "$t" tests/gpu/torch_switch.sh
	bench "examples/torch on CUDA over ipc, losses against the CPU run" 240 example \
		"$py" examples/torch/launch.py --nproc 4 --model micro-llama --gpus-per-node 4 --steps 20 --switch-every 5 \
		--global-batch 8 --micro-batch 2 --configs tp=2:dp=2:zero=1,pp=2:dp=2,tp=2:pp=2 --check-switch \
		--device cuda --transport ipc --compare-cpu
else
	say "SKIP PyTorch tests: no torch with CUDA ($torch_cuda)"
	failed=1
fi

if command -v compute-sanitizer >/dev/null; then
	check "compute-sanitizer memcheck: copy and digest kernel tests" 90 compute-sanitizer --report-api-errors no --error-exitcode 9 build/tests/test_gpu
	check "compute-sanitizer memcheck: executors of one ipc switch, --check" "$t" demo --np 2 --from tp=2,pp=1,dp=1,zero=1 \
		--to tp=1,pp=1,dp=2,zero=1 --exec-prefix "compute-sanitizer --report-api-errors no --error-exitcode 9"
else
	say "SKIP compute-sanitizer: not installed"
fi

say "## benchmarks"
bench "copy and digest kernels" 90 copy build/bench/gpu_copy_bench 1024
# the pause of a synchronous job, and the digest's cost (gpu_switch.sh)
sw=scripts/bench/gpu_switch.sh
bench "switch W=8 gpt3-1.3b" 150 switch $sw gpt3-1.3b tp=4,pp=2,dp=1 tp=2,pp=4,dp=1
bench "switch W=8 gpt3-1.3b, digests on the GPU" 150 switch-check $sw --check gpt3-1.3b tp=4,pp=2,dp=1 tp=2,pp=4,dp=1
bench "switch W=2 gpt3-1.3b, 8.6 GiB a rank" 200 switch-big $sw gpt3-1.3b tp=2 pp=2
# what one GPU can say about eight: each rank's kernels with the GPU to
# themselves, and a world of one copying its whole state
replay() {
	local d
	d=$(mktemp -d)
	bin/vps-layout -q --model gpt3-1.3b --parallel tp=4,pp=2,dp=1 -o "$d/a.layout" &&
		bin/vps-layout -q --model gpt3-1.3b --parallel tp=2,pp=4,dp=1 -o "$d/b.layout" &&
		bin/vps-plan -q "$d/a.layout" "$d/b.layout" | bin/vps-stage -q --budget 4GiB - -o "$d/s.staged" &&
		build/bench/gpu_copy_bench --replay "$d/s.staged" 1024
	local rc=$?
	rm -rf "$d"
	return $rc
}
export -f replay
bench "replay W=8 gpt3-1.3b, one rank at a time" 120 replay replay
bench "switch W=1 bench-170m, the whole state copied in place" 120 switch-one $sw --steps 0 \
	"$top/scripts/bench/models/bench-170m.yaml" tp=1 tp=1,zero=1
# PyTorch's distributed checkpoint of the same state, on the GPU
if [[ $torch_cuda == *True* ]]; then
	bench "PyTorch DCP on the GPU against vps ipc" 240 switch-vs-size scripts/bench/gpu_dcp.sh
fi
# the Megatron pause's CPU check (4 ranks and their 4 executors, gloo),
# here with a core for each process: on the 2 cores of the CI machine what
# the pause holds beyond the transfer is mostly a woken trainer waiting for
# a core (docs/BENCHMARKS.md, "A Megatron-Core job's pause"); last, so
# that it takes only what the budget has left
if "$py" -c 'import megatron.core' >/dev/null 2>&1; then
	bench "Megatron-Core pause on the CPUs, a core a process (check_switch.py)" 120 megatron-pause \
		env VPS_LIBRARY="$PWD/build/libvps.so" VPS_BIN="$PWD/bin" "$py" tests/megatron/check_switch.py --optimizer adam
fi
finish
