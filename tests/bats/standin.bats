#!/usr/bin/env bats
# Every GPU path on the host stand-ins of libvps-cuda.so and NCCL
# (tests/standin/, docs/exec.md "The stand-ins"): --cuda trainers, whose
# state is "device" memory, switched over --transport ipc (CUDA IPC handles
# and the copy kernel), nccl (grouped sends and receives between the
# executors) and auto (both), at W = 2 to 8; the fault tests over nccl; the
# Python module's registration of device pointers; a long --serve.
# What these runs prove and what they cannot: vps-exec(1), GPU VALIDATION.

load helpers

# The plain build's stand-ins, as scripts/demo.sh uses the plain build's
# tools; the tools of VPS_BIN get the stand-ins built with them.
setup_file() {
	plain_make -s --no-print-directory standin
}

STANDIN=${VPS_STANDIN:-$TOP/build/standin}

# demo.sh with GPU memory on the stand-ins; every switch of every rank
# over `over` (default: the transport)
gdemo() { # TRANSPORT demo.sh arguments...
	local transport=$1 dir=$BATS_TEST_TMPDIR/demo
	shift
	VPS_CUDA_LIBRARY=$TOP/build/standin/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$TOP/build/standin/libnccl-standin.so \
		run timeout 300 "$TOP/scripts/demo.sh" --cuda --budget 1MiB --timeout 30 --transport "$transport" --keep "$dir" "$@"
	if [ "$status" -ne 0 ] || [[ "${lines[-1]}" != "digest: match" ]]; then
		echo "$output" | tail -30 >&2
		return 1
	fi
	local want=${over:-$transport} all n
	all=$(cat "$dir"/exec.*.log | grep -c 'digest: match$' || true)
	n=$(cat "$dir"/exec.*.log | grep -c " over $want; .*digest: match$" || true)
	if [ "$all" -eq 0 ] || [ "$all" -ne "$n" ]; then
		echo "$n of $all switches over $want:" >&2
		cat "$dir"/exec.*.log >&2
		return 1
	fi
}

# ---- the end-to-end matrix of exec.bats, GPU memory ----
# Each case runs over nccl and over ipc with every device on one node (ipc
# reaches one node only), and over auto with the devices on two nodes, so
# that auto carries each switch over ipc within a node and nccl between.

cases() { # NAME: the case's demo.sh arguments, the devices per node under auto
	case $1 in
	dense_back) echo "4 --model tiny-llama --from tp=2,pp=2,dp=2,zero=1 --to tp=4,pp=1,dp=2,zero=1 --back" ;;
	dense_vpp) echo "4 --model tiny-llama --from tp=1,pp=2,dp=2,vpp=2,zero=1 --to tp=2,pp=3,dp=1,first=2,last=2,zero=0" ;;
	dense_grad) echo "2 --model tiny-llama --from tp=2,dp=2,zero=1,grad=1 --to tp=1,pp=2,dp=2,zero=1,grad=1" ;;
	gpt_tied) echo "4 --model tiny-gpt --from tp=2,pp=2,dp=2,zero=1 --to tp=4,pp=1,dp=2,zero=1 --back" ;;
	moe_ep) echo "4 --model tiny-qwen3-moe --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=2,pp=1,dp=4,ep=4,etp=2,zero=1" ;;
	moe_own) echo "1 --model tiny-qwen3-moe --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=1,dp=2,ep=2,etp=1,zero=1" ;;
	cp_change) echo "4 --model tiny-llama --from tp=2,cp=2,pp=1,dp=2,zero=1 --to tp=4,cp=1,pp=2,dp=1,zero=1 --back" ;;
	cp_moe) echo "4 --model tiny-qwen3-moe --from tp=2,cp=2,pp=1,dp=2,ep=4,etp=1,zero=1 --to tp=2,cp=1,pp=2,dp=2,ep=2,etp=1,zero=1" ;;
	moe_grouped) echo "4 --model tiny-qwen3-moe --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=2,pp=1,dp=4,ep=4,etp=1,zero=1,grouped_gemm=1 --back" ;;
	deepseek) echo "4 --model tiny-deepseek --from tp=2,pp=2,dp=2,ep=2,etp=1,zero=1 --to tp=4,pp=1,dp=2,ep=8,etp=1,zero=1 --back" ;;
	join) echo "4 --model tiny-llama --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=2,dp=2,zero=1" ;;
	leave) echo "4 --model tiny-gpt --from tp=2,pp=2,dp=2,zero=1 --to tp=1,pp=1,dp=3,zero=1" ;;
	world6) echo "3 --model tiny-qwen3-moe --from tp=2,pp=1,dp=3,ep=2,etp=1,zero=1 --to tp=1,pp=2,dp=3,ep=1,etp=1,zero=0 --back" ;;
	per_rank) echo "3 --per-rank --model tiny-qwen3-moe --from tp=2,pp=1,dp=3,ep=2,etp=1,zero=1 --to tp=1,pp=2,dp=3,ep=1,etp=1,zero=0 --back" ;;
	world2) echo "1 --model tiny-llama --from tp=2,zero=1 --to tp=1,dp=2,zero=1 --back" ;;
	world3) echo "2 --model tiny-gpt --from tp=1,pp=1,dp=3,zero=1 --to tp=1,pp=3,dp=1,first=2,last=2,zero=0 --back" ;;
	world7) echo "4 --model tiny-llama --global-batch 28 --from tp=1,dp=7,zero=1 --to pp=7,first=2,last=0,zero=0" ;;
	relay) echo "4 --relay --model tiny-llama --from tp=1,pp=1,dp=1,zero=1 --to tp=1,pp=1,dp=8,zero=1" ;;
	relay_hops) echo "2 --relay --model tiny-llama --from tp=1,pp=1,dp=1,zero=1 --to tp=1,pp=1,dp=8,zero=1" ;;
	relay_from_a) echo "4 --model tiny-llama --from tp=1,pp=4,dp=2,zero=0 --to tp=1,pp=4,dp=4,zero=0" ;;
	esac
}

gpu_case() { # TRANSPORT NAME
	local args
	read -r -a args <<<"$(cases "$2")"
	case $1 in
	auto) over=ipc+nccl gdemo auto --np "${args[0]}" "${args[@]:1}" ;;
	*) gdemo "$1" --np 8 "${args[@]:1}" ;;
	esac
}

@test "nccl: dense LLaMA: tp, pp, dp with ZeRO-1, and back on the same communicator" { gpu_case nccl dense_back; }
@test "ipc: dense LLaMA: tp, pp, dp with ZeRO-1, and back, GPU memory" { gpu_case ipc dense_back; }
@test "auto: dense LLaMA: tp, pp, dp with ZeRO-1, and back, two nodes" { gpu_case auto dense_back; }

@test "nccl: dense LLaMA: virtual pipeline chunks, uneven stages, ZeRO on to off" { gpu_case nccl dense_vpp; }
@test "ipc: dense LLaMA: virtual pipeline chunks, uneven stages, ZeRO on to off, GPU memory" { gpu_case ipc dense_vpp; }
@test "auto: dense LLaMA: virtual pipeline chunks, uneven stages, ZeRO on to off, two nodes" { gpu_case auto dense_vpp; }

@test "nccl: dense LLaMA: fp32 gradients travel too" { gpu_case nccl dense_grad; }
@test "ipc: dense LLaMA: fp32 gradients travel too, GPU memory" { gpu_case ipc dense_grad; }
@test "auto: dense LLaMA: fp32 gradients travel too, two nodes" { gpu_case auto dense_grad; }

@test "nccl: GPT with tied embeddings across pipeline stages" { gpu_case nccl gpt_tied; }
@test "ipc: GPT with tied embeddings across pipeline stages, GPU memory" { gpu_case ipc gpt_tied; }
@test "auto: GPT with tied embeddings across pipeline stages, two nodes" { gpu_case auto gpt_tied; }

@test "nccl: MoE: expert parallelism and expert tensor parallelism" { gpu_case nccl moe_ep; }
@test "ipc: MoE: expert parallelism and expert tensor parallelism, GPU memory" { gpu_case ipc moe_ep; }
@test "auto: MoE: expert parallelism and expert tensor parallelism, two nodes" { gpu_case auto moe_ep; }

@test "nccl: MoE: experts move from the dense buffer to their own" { gpu_case nccl moe_own; }
@test "ipc: MoE: experts move from the dense buffer to their own, GPU memory" { gpu_case ipc moe_own; }
@test "auto: MoE: experts move from the dense buffer to their own, one device a node" { gpu_case auto moe_own; }

@test "nccl: context parallelism: cp, tp, pp and dp change at once, and back" { gpu_case nccl cp_change; }
@test "ipc: context parallelism: cp, tp, pp and dp change at once, and back, GPU memory" { gpu_case ipc cp_change; }
@test "auto: context parallelism: cp, tp, pp and dp change at once, and back, two nodes" { gpu_case auto cp_change; }

@test "nccl: context parallelism with experts" { gpu_case nccl cp_moe; }
@test "ipc: context parallelism with experts, GPU memory" { gpu_case ipc cp_moe; }
@test "auto: context parallelism with experts, two nodes" { gpu_case auto cp_moe; }

@test "nccl: MoE: sequential experts become grouped-GEMM ones, and back" { gpu_case nccl moe_grouped; }
@test "ipc: MoE: sequential experts become grouped-GEMM ones, and back, GPU memory" { gpu_case ipc moe_grouped; }
@test "auto: MoE: sequential experts become grouped-GEMM ones, and back, two nodes" { gpu_case auto moe_grouped; }

@test "nccl: DeepSeek-V3-style: tp, pp, ep change, and back" { gpu_case nccl deepseek; }
@test "ipc: DeepSeek-V3-style: tp, pp, ep change, and back, GPU memory" { gpu_case ipc deepseek; }
@test "auto: DeepSeek-V3-style: tp, pp, ep change, and back, two nodes" { gpu_case auto deepseek; }

@test "nccl: a relayed join: dp=1 becomes dp=8, receivers pass pieces on from their targets" { gpu_case nccl relay; }
@test "ipc: a relayed join: dp=1 becomes dp=8, receivers read the relays' targets, GPU memory" { gpu_case ipc relay; }
@test "auto: a relayed join: dp=1 becomes dp=8 on two nodes" { gpu_case auto relay; }
# four nodes: ranges leave the holder's node once and pass between the
# other nodes (hops 1 to 3), nccl between the nodes, ipc within
@test "auto: a relayed join: dp=1 becomes dp=8 on four nodes, hops up to 3" { gpu_case auto relay_hops; }
# by default devices of A that hold none of a stage relay it too (16
# ranks: over nccl on two nodes, under auto on four)
@test "nccl: devices that do not join relay by default: pp=4, dp=2 becomes dp=4" { gpu_case nccl relay_from_a; }
@test "auto: devices that do not join relay by default: pp=4, dp=2 becomes dp=4 on four nodes" { gpu_case auto relay_from_a; }

@test "nccl: devices join: 4 become 8" { gpu_case nccl join; }
@test "ipc: devices join: 4 become 8, GPU memory" { gpu_case ipc join; }
@test "auto: devices join: 4 on one node become 8 on two" { gpu_case auto join; }

@test "nccl: devices leave: 8 become 3" { gpu_case nccl leave; }
@test "ipc: devices leave: 8 become 3, GPU memory" { gpu_case ipc leave; }
@test "auto: devices leave: 8 on two nodes become 3" { gpu_case auto leave; }

@test "nccl: a world of 6, TP and DP both change, and back" { gpu_case nccl world6; }
@test "ipc: a world of 6, TP and DP both change, and back, GPU memory" { gpu_case ipc world6; }
@test "auto: a world of 6 on two nodes, TP and DP both change, and back" { gpu_case auto world6; }

@test "nccl: every rank plans and stages its own part, a world of 6, and back" { gpu_case nccl per_rank; }
@test "ipc: every rank plans and stages its own part, a world of 6, and back, GPU memory" { gpu_case ipc per_rank; }
@test "auto: every rank plans and stages its own part, a world of 6 on two nodes, and back" { gpu_case auto per_rank; }

@test "nccl: a world of 2, TP to DP and back" { gpu_case nccl world2; }
@test "ipc: a world of 2, TP to DP and back, GPU memory" { gpu_case ipc world2; }
@test "auto: a world of 2, one device on each of two nodes, and back" { gpu_case auto world2; }

@test "nccl: a world of 3, DP to uneven PP and back" { gpu_case nccl world3; }
@test "ipc: a world of 3, DP to uneven PP and back, GPU memory" { gpu_case ipc world3; }
@test "auto: a world of 3 on two nodes, DP to uneven PP and back" { gpu_case auto world3; }

@test "nccl: a world of 7, DP to PP" { gpu_case nccl world7; }
@test "ipc: a world of 7, DP to PP, GPU memory" { gpu_case ipc world7; }
@test "auto: a world of 7 on two nodes, DP to PP" { gpu_case auto world7; }

# ---- scripts/demo.sh --standin, as docs/exec.md and vps-exec(1) give it ----

standin_demo() { # TRANSPORT
	run timeout 300 "$TOP/scripts/demo.sh" --standin --cuda --transport "$1"
	echo "$output" | tail -5
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "== tiny-llama: (tp=2,pp=2,dp=2,zero=1) -> (tp=4,pp=1,dp=2,zero=1), 8 devices (0 joining, 0 leaving), 8 per node, over $1, GPU memory (the host stand-ins of CUDA and NCCL)" ]
	[ "${lines[-1]}" = "digest: match" ]
}

@test "scripts/demo.sh --standin --cuda --transport nccl ends with digest: match" {
	unset VPS_CUDA_LIBRARY VPS_NCCL_LIBRARY
	standin_demo nccl
}
@test "scripts/demo.sh --standin --cuda --transport ipc ends with digest: match" {
	unset VPS_CUDA_LIBRARY VPS_NCCL_LIBRARY
	standin_demo ipc
}
@test "scripts/demo.sh --standin --cuda --transport auto ends with digest: match" {
	unset VPS_CUDA_LIBRARY VPS_NCCL_LIBRARY
	standin_demo auto
}

# ---- faults over nccl: every rank stops within --timeout, naming the
# rank, sources intact (exec.bats's, with GPU memory) ----

setup_plan() {
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 --gpus-per-node 4 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=4,zero=1 --gpus-per-node 4 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 64KiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	tag=sbats$$
	export VPS_CUDA_LIBRARY=$STANDIN/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$STANDIN/libnccl-standin.so
}

show_logs() {
	tail -n 5 e.* t.* 2>/dev/null || true
}

# rank 1's executor, the tests' (helpers.bash), gets VPS_FAULT=$1; the
# others' exit statuses in st[]
nccl_fault() { # FAULT
	setup_plan
	for r in 0 1 2 3; do
		vps-trainer --cuda --registry "$tag-$r" --rank $r --timeout 10 s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for r in 0 1 2 3; do
		f= exe=vps-exec
		[ $r = 1 ] && f=$1 exe=$VPS_FAULT_BIN/vps-exec
		VPS_FAULT=$f "$exe" --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport nccl --timeout 3 \
			s.staged > e.$r 2>&1 &
		ep[$r]=$!
	done
	start=$SECONDS
	for r in 0 2 3; do
		st[$r]=0
		wait ${ep[$r]} || st[$r]=$?
	done
	took=$((SECONDS - start))
	case $1 in stall:*) ;; *) for _ in $(seq 50); do kill -0 ${ep[1]} 2>/dev/null || break; sleep 0.1; done ;; esac
	kill -CONT ${ep[1]} 2>/dev/null || true
	kill ${ep[1]} 2>/dev/null || true
	for r in 0 1 2 3; do wait ${ep[$r]} 2>/dev/null || true; wait ${tp[$r]} 2>/dev/null || true; done
	show_logs
	# each stopped by its own error, none by a crash
	for r in 0 2 3; do
		[ "${st[$r]}" -eq 1 ] || [ "${st[$r]}" -eq 2 ]
		grep -q "vps-exec: rank $r: " e.$r
		! grep -q "switch 1: sent" e.$r
		grep -q "sources intact" t.$r
	done
}

@test "nccl: a peer that stops answering mid-transfer: every rank stops within the timeout, naming it, sources intact" {
	nccl_fault stall:5
	[ "$took" -lt 15 ]
	# rank 1's partners name it: NCCL does not say whom it waits for, the
	# executor names the peers of the stage's group
	grep -h "stage 5 of" e.0 e.2 e.3 | grep -q "(NCCL group with rank 1): the GPU made no progress for 3.0 s"
}

@test "nccl: a peer that dies mid-transfer: every rank stops, naming it, sources intact" {
	nccl_fault exit:5
	[ "$took" -lt 15 ]
	grep -h "stage 5 of" e.0 e.2 e.3 | grep -q "rank 1 (pid [0-9]*) exited"
	grep -q "its executor (pid [0-9]*) is gone; sources intact" t.1
}

@test "nccl: a rank stopped as the switch starts: every rank stops within the timeout, naming it" {
	nccl_fault stall:claim
	[ "$took" -lt 15 ]
	grep -q "rank 1 gave no sign of life for 3 s while the ranks waited for the switch" e.0
	for r in 2 3; do grep -q "vps-exec: rank $r: rank 0: rank 1 gave no sign of life" e.$r; done
}

# a trainer killed by SIGKILL leaves its registry (stale, for the next
# trainer of that name to replace): this test's goes
teardown() {
	[ -z "${tag:-}" ] || rm -f "/dev/shm/$tag-1" "/dev/shm/$tag-1".*
}

@test "nccl: a trainer killed mid-switch fails the switch on every rank" {
	nccl_fault kill-trainer:2
	[ "$took" -lt 15 ]
	grep -q "vps-exec: rank 1: the trainer (pid [0-9]*) of registry $tag-1 died during the switch" e.1
	for r in 0 2 3; do grep -q "vps-exec: rank $r: rank 1 failed: the trainer (pid [0-9]*) of registry $tag-1 died" e.$r; done
	for r in 0 1 2 3; do ! grep -q "digest: match" e.$r; ! grep -q "switch 1: sent" e.$r; done
	for r in 0 2 3; do grep -q "sources intact" t.$r; done
}

# ---- the Python module: device buffers registered by pointer ----

python_device_buffers() { # TRANSPORT
	PY=${VPS_PYTHON:-/usr/bin/python3}
	"$PY" -c 'import torch' 2>/dev/null || skip "$PY has no torch (make venv makes the test environment, which has it)"
	vps-layout --model tiny-llama --parallel tp=2,zero=1 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2,zero=1 --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 256KiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	# the plain build's libvps.so (the module's), so the plain stand-in
	export VPS_CUDA_LIBRARY=$TOP/build/standin/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$TOP/build/standin/libnccl-standin.so
	timeout 120 "$PY" "$TOP/tests/python/standin_trainer.py" "py$$" a.layout b.layout > t.log 2>&1 &
	pt=$!
	for r in 0 1; do
		VPS_CUDA_LIBRARY=$STANDIN/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$STANDIN/libnccl-standin.so \
			timeout 120 vps-exec --registry "py$$-%r" --rank $r --master 127.0.0.1:$port --transport "$1" --wait \
			--check --timeout 30 s.staged > e.$r 2>&1 &
		pe[$r]=$!
	done
	st=0
	wait $pt || st=$?
	for r in 0 1; do wait ${pe[$r]} || st=$?; done
	cat t.log e.0 e.1
	[ "$st" -eq 0 ]
	grep -q "standin_trainer: 2 ranks, .* logical tensors switched in device memory registered by pointer; 0 wrong elements" t.log
	for r in 0 1; do grep -q "over $1; .*digest: match" e.$r; done
}

@test "python: device buffers registered by pointer through the module switch over ipc" { python_device_buffers ipc; }

# The pause is the transfer: what the executors read (their rank's buffers,
# the peers' sources) is open before the trainers ask, so the pause opens
# nothing. The trainers ask only once the executors hold every allocation
# (tests/python/standin_trainer.py --opened-by): a run that opened them in
# the pause could not get there.
@test "ipc: GPU memory is opened while the trainers train: the pause opens no IPC handle" {
	PY=${VPS_PYTHON:-/usr/bin/python3}
	"$PY" -c 'import torch' 2>/dev/null || skip "$PY has no torch (make venv makes the test environment, which has it)"
	vps-layout --model tiny-llama --parallel tp=2,zero=1 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2,zero=1 --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 256KiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	export VPS_CUDA_LIBRARY=$TOP/build/standin/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$TOP/build/standin/libnccl-standin.so
	timeout 120 "$PY" "$TOP/tests/python/standin_trainer.py" --opened-by pids "py$$" a.layout b.layout > t.log 2>&1 &
	pt=$!
	for r in 0 1; do
		VPS_CUDA_LIBRARY=$STANDIN/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$STANDIN/libnccl-standin.so \
			timeout 120 vps-exec --registry "py$$-%r" --rank $r --master 127.0.0.1:$port --transport ipc --wait \
			--check --timeout 30 --report report.$r.yaml s.staged > e.$r 2>&1 &
		pe[$r]=$!
	done
	echo "${pe[0]} ${pe[1]}" > pids.tmp && mv pids.tmp pids
	st=0
	wait $pt || st=$?
	for r in 0 1; do wait ${pe[$r]} || st=$?; done
	cat t.log e.0 e.1
	[ "$st" -eq 0 ]
	grep -q "0 wrong elements" t.log
	for r in 0 1; do
		grep -q "over ipc; .*digest: match" e.$r
		grep -qx "  opened_in_pause: 0" report.$r.yaml
		grep -qx "  mapped_in_pause_bytes: 0" report.$r.yaml
		# the peer's source was read, and it was opened ahead too
		[ "$(awk '$1 == "bytes_received:" { print $2; exit }' report.$r.yaml)" -gt 0 ]
	done
}
@test "python: device buffers registered by pointer through the module switch over nccl" { python_device_buffers nccl; }

# ---- optimizer state in host memory beside parameters on the GPU ----
# (Megatron's optimizer_cpu_offload): one registry holds both; ipc copies
# each piece where its buffers are, the retains too, and the digest adds
# the host's part to the kernel's. tcp and nccl reach one kind each and
# refuse, naming the transport that moves both.

mixed_switch() { # TRANSPORT [FROM TO]: FROM and TO with offload= need no --host
	PY=${VPS_PYTHON:-/usr/bin/python3}
	"$PY" -c 'import torch' 2>/dev/null || skip "$PY has no torch (make venv makes the test environment, which has it)"
	local from=${2:-tp=2,zero=1} to=${3:-tp=1,dp=2,zero=1} host=(--host main_param,exp_avg,exp_avg_sq)
	[ -z "${2:-}" ] || host=()
	vps-layout --model tiny-llama --parallel "$from" --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel "$to" --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 256KiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	export VPS_CUDA_LIBRARY=$TOP/build/standin/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$TOP/build/standin/libnccl-standin.so
	timeout 120 "$PY" "$TOP/tests/python/standin_trainer.py" "${host[@]}" "mx$$" \
		a.layout b.layout > t.log 2>&1 &
	pt=$!
	for r in 0 1; do
		VPS_CUDA_LIBRARY=$STANDIN/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$STANDIN/libnccl-standin.so \
			timeout 120 vps-exec --registry "mx$$-%r" --rank $r --master 127.0.0.1:$port --transport "$1" --wait \
			--check --timeout 30 s.staged > e.$r 2>&1 &
		pe[$r]=$!
	done
	st=0
	wait $pt || st=$?
	for r in 0 1; do wait ${pe[$r]} || st=$?; done
	cat t.log e.0 e.1
	return $st
}

@test "ipc: parameters in GPU memory and optimizer state in host memory switch in one registry" {
	mixed_switch ipc
	grep -q "standin_trainer: 2 ranks, .* logical tensors switched in device memory registered by pointer, main_param,exp_avg,exp_avg_sq in host memory; 0 wrong elements" t.log
	for r in 0 1; do grep -q "over ipc; .*digest: match" e.$r; done
}

# The CPU-offloaded optimizer (offload=F): each shard's host part and GPU
# part differ between the layouts, so pieces go from host memory to GPU
# memory and back, retains and ipc pulls alike (staged through both sides).
@test "ipc: the CPU-offloaded optimizer's host parts meet GPU parts: pieces between host and GPU memory" {
	mixed_switch ipc tp=2,zero=1,offload=0.5 tp=1,dp=2,zero=1,offload=0.3
	grep -q "standin_trainer: 2 ranks, .* logical tensors switched in device memory registered by pointer, 12 offloaded buffers in host memory; 0 wrong elements" t.log
	for r in 0 1; do grep -q "over ipc; .*digest: match" e.$r; done
	# exp_avg's buffers are 2 on the GPU and 5 on the host, in both
	# layouts: pieces go both ways between the kinds
	vps-plan a.layout b.layout -q -o ab.plan
	for r in 0 1; do vps-plan --transfers --rank $r --state exp_avg --format tsv ab.plan; done |
		awk -F'\t' '$1 != "rank" { n[$8 "->" $10]++ } END { exit !(n["5->2"] > 0 && n["2->5"] > 0) }'
}

# Across nodes tcp carries such a registry: its GPU views go through host
# bounce buffers, packed and unpacked on the GPU.
@test "tcp: parameters in GPU memory and optimizer state in host memory switch in one registry" {
	mixed_switch tcp
	grep -q "standin_trainer: 2 ranks, .* logical tensors switched in device memory registered by pointer, main_param,exp_avg,exp_avg_sq in host memory; 0 wrong elements" t.log
	for r in 0 1; do grep -q "over tcp; .*digest: match" e.$r; done
}

@test "tcp: the CPU-offloaded optimizer's host parts meet GPU parts across nodes' transport" {
	mixed_switch tcp tp=2,zero=1,offload=0.5 tp=1,dp=2,zero=1,offload=0.3
	grep -q "standin_trainer: 2 ranks, .* logical tensors switched in device memory registered by pointer, 12 offloaded buffers in host memory; 0 wrong elements" t.log
	for r in 0 1; do grep -q "over tcp; .*digest: match" e.$r; done
}

@test "nccl refuses a registry of host and GPU memory, naming ipc and tcp" {
	run mixed_switch nccl
	[ "$status" -ne 0 ]
	[[ "$output" == *"the nccl transport moves GPU memory; the trainer registered host and GPU memory, which --transport ipc (one node) and tcp move in one switch"* ]]
}

# ---- a long --serve: every switch opens and closes IPC handles ----
# scripts/bench/longrun.sh samples every process's mappings and fds (a
# device allocation of the stand-in is two mappings, an open handle two);
# judged here by switch counts, whatever the machine's speed: the floor
# over switches 140-199 lies no higher than the peak over switches 20-80.

@test "ipc: 200 switches back and forth in one --serve, GPU memory: mappings and fds stay flat" {
	export VPS_CUDA_LIBRARY=$STANDIN/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$STANDIN/libnccl-standin.so
	# under AddressSanitizer (make asan) a freed large block stays mapped in
	# its quarantine, and a --cuda trainer frees its host copies of each
	# switch's buffers: a small quarantine, so that mappings settle
	! grep -qa __asan_init "$VPS_BIN/vps-trainer" || export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=4
	VPS_BIN=$VPS_BIN run timeout 300 "$TOP/scripts/bench/longrun.sh" --switches 200 --warmup 20 \
		--rows 6 --model "$TOP/scripts/bench/models/micro-llama.yaml" --from tp=2 --to pp=2 --transport ipc --cuda \
		--keep lr
	echo "$output"
	for r in 0 1; do grep -q "^vps-trainer: rank $r: 200 switches, .*: ok$" lr/trainer.$r.log; done
	# every switch took its step: 4 samples each, each read once
	[ "$(cat lr/ids.* | sort -n | uniq | wc -l)" -eq 800 ]
	[ "$(cat lr/ids.* | wc -l)" -eq 800 ]
	awk '
	$2 >= 20 && $2 <= 80 { w = 1 } $2 >= 140 && $2 < 200 { w = 2 } !($2 >= 20 && $2 <= 80) && !($2 >= 140 && $2 < 200) { next }
	{
		key = $3 " " $4
		for (m = 5; m <= ($3 == "shm" ? 6 : 7); m++) {
			if ($3 != "shm" && m == 5) continue # RSS: host memory the stand-in churns
			k = key SUBSEP m
			n[w, k]++
			if (w == 1 && (!(k in peak) || $m > peak[k])) peak[k] = $m
			if (w == 2 && (!(k in floor) || $m < floor[k])) floor[k] = $m
			keys[k] = 1
		}
	}
	END {
		for (k in keys) {
			split(k, p, SUBSEP)
			if (n[1, k] < 3 || n[2, k] < 3) { printf "%s column %d: %d and %d samples\n", p[1], p[2], n[1, k], n[2, k]; bad = 1 }
			else if (floor[k] > peak[k]) { printf "%s column %d grows: peak %d over switches 20-80, floor %d over 140-199\n", p[1], p[2], peak[k], floor[k]; bad = 1 }
			count++
		}
		exit bad || count != 12
	}' lr/samples.tsv
}

@test "make check-gpu runs the real CUDA and NCCL: scripts/gpu-check.sh refuses the stand-ins" {
	expect_status 2 env VPS_CUDA_LIBRARY="$STANDIN/libvps-cuda-standin.so" "$TOP/scripts/gpu-check.sh" "$PWD/r.txt"
	[[ "$output" == *"gpu-check.sh: VPS_CUDA_LIBRARY names a stand-in ($STANDIN/libvps-cuda-standin.so): make check-gpu runs the real CUDA and NCCL"* ]]
	expect_status 2 env VPS_NCCL_LIBRARY="$STANDIN/libnccl-standin.so" "$TOP/scripts/gpu-check.sh" "$PWD/r.txt"
	[ ! -e r.txt ]
}

# lost.bats's survivors, over nccl: the communicator has the three
# surviving ranks, numbered without the lost one
@test "nccl: a device's trainer killed before the switch: the survivors switch around it, GPU memory" {
	export VPS_CUDA_LIBRARY=$STANDIN/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$STANDIN/libnccl-standin.so
	printf 'vps: devices\nversion: 1\ndevices: [[0, 0], [0, 2], [0, 3]]\n' > bdev.yaml
	vps-layout -q --model tiny-llama --parallel tp=2,dp=2,zero=1 --gpus-per-node 4 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=1,dp=3,zero=1 --devices bdev.yaml -o b.layout
	tag=slost$$
	port=$("$TOP/scripts/free-port.sh")
	vps-plan -q --lost 1 --allow-loss --global-batch 12 a.layout b.layout -o ab.plan
	vps-stage -q --budget 1MiB ab.plan -o ab.staged
	for r in 0 1 2 3; do
		vps-trainer --cuda --registry "$tag-$r" --rank $r --global-batch 12 --timeout 60 ab.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	for i in $(seq 100); do [ -e "/dev/shm/$tag-1" ] && break; sleep 0.1; done
	kill -9 ${tp[1]}
	wait ${tp[1]} || true
	rm -f /dev/shm/"$tag"-1*
	for r in 0 2 3; do
		vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --transport nccl --wait --check --timeout 30 \
			ab.staged > e.$r 2>&1 &
		ep[$r]=$!
	done
	failed=0
	for r in 0 2 3; do wait ${ep[$r]} || failed=1; wait ${tp[$r]} || failed=1; done
	tail -n 3 e.* t.*
	[ "$failed" = 0 ]
	for r in 0 2 3; do
		grep -q "over nccl; .*digest: match$" e.$r
		grep -q "0 wrong elements, 0 dirty padding, training state carried: ok" t.$r
	done
}

# ---- the GPU benchmarks' scripts, on the stand-ins: their plumbing and
# arithmetic (their figures say nothing of a GPU) ----

@test "scripts/bench/gpu_switch.sh on the stand-ins: the pause from the last request, its parts, the digest's share" {
	export VPS_CUDA_LIBRARY=$STANDIN/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$STANDIN/libnccl-standin.so
	export VPS_BENCH=$STANDIN/../bench # the bench of the stand-ins' build
	run timeout 300 "$TOP/scripts/bench/gpu_switch.sh" --check --memcpy 4 --budget 1MiB tiny-llama tp=2,pp=2,dp=2 \
		tp=4,pp=1,dp=2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"switch tiny-llama (tp=2,pp=2,dp=2) -> (tp=4,pp=1,dp=2), 8 ranks on one GPU over ipc, digests on the GPU (--check)"* ]]
	[[ "$output" == *"state: "*" MiB, then "*" MiB a rank"* ]]
	grep -qE '^pause \(last request to resume, slowest rank [0-7]\): [0-9.]+ s: arrive [0-9.]+ s, attach [0-9.]+ s, agree [0-9.]+ s, transfer [0-9.]+ s, digest [0-9.]+ s, other -?[0-9.]+ s; opened in the pause: [0-9]+;' <<< "$output"
	grep -qE '^after the pause \(the trainers going on\): mappings let go in [0-9.]+ s \(slowest rank [0-7]\)$' <<< "$output"
	grep -qE '^digest on the GPU: [0-9.]+ s \(slowest rank [0-7]\), [0-9.]+% of its transfer; digest: match$' <<< "$output"
	# against its floor: both sides read at cudaMemcpy's memory traffic,
	# twice the bytes moved at twice cudaMemcpy's rate
	grep -qE '^digest against its floor: reading [0-9.]+ GB \(sources and targets\) at the [0-9]+ GB/s of memory traffic cudaMemcpy reached takes [0-9.]+ ms, [0-9]+% of the transfer; the digests took [0-9.]+x that \(target: at most 1\.5x\)$' <<< "$output"
	# the bytes moved are the plan's: every byte once, received or kept
	moved=$(sed -n 's/^bytes moved (received + copied in place): \([0-9.]*\) GB in .*/\1/p' <<< "$output")
	vps-layout -q --model tiny-llama --parallel tp=2,pp=2,dp=2 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=4,pp=1,dp=2 -o b.layout
	bytes=$(vps-plan a.layout b.layout --stats | awk '$1 == "bytes_moved:" { m = $2 } $1 == "bytes_retained:" { r = $2 } END { printf "%.3f", (m + r) / 1e9 }')
	[ "$moved" = "$bytes" ]
}

@test "gpu_copy_bench --replay on the stand-ins: every rank's copies of a switch, one rank at a time" {
	export VPS_CUDA_LIBRARY=$STANDIN/libvps-cuda-standin.so VPS_NCCL_LIBRARY=$STANDIN/libnccl-standin.so
	vps-layout -q --model tiny-llama --parallel tp=2,dp=2,zero=1 --gpus-per-node 4 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=1,pp=2,dp=2,zero=1 --gpus-per-node 4 -o b.layout
	vps-plan -q a.layout b.layout | vps-stage -q --budget 1MiB - -o s.staged
	# the bench of the stand-ins' build (make asan's loads only its own)
	run "$STANDIN/../bench/gpu_copy_bench" --replay s.staged 4
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "${lines[0]}" == "replay s.staged: 4 ranks, "*" stages; each rank alone on the GPU, cudaMemcpy "*" GB/s" ]]
	[ "$(grep -cE '^rank [0-3]: [0-9]+ bytes ' <<< "$output")" -eq 4 ]
	# what the ranks receive or keep, together: the state of B
	sum=$(awk '/^rank / { s += $3 } END { print s }' <<< "$output")
	moved=$(vps-plan a.layout b.layout --stats | awk '$1 == "bytes_moved:" { m = $2 } $1 == "bytes_retained:" { r = $2 } END { print m + r }')
	[ "$sum" -eq "$moved" ]
	[[ "${lines[-1]}" == "slowest rank alone: "* ]]
}

# tests/gpu/torch_trainer.py mirrors struct vps_trainer_opts in ctypes and
# runs only on a GPU machine; its --cpu form takes the same path here, so
# that the mirror cannot drift from include/vps/trainer.h between GPU runs
@test "tests/gpu/torch_switch.sh --cpu: the PyTorch trainer's ctypes mirror of vps_trainer_opts, switched and back" {
	PYTHON=$PY run timeout 200 "$TOP/tests/gpu/torch_switch.sh" --cpu
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$(grep -o 'torch_trainer: rank [01]: 2 switches of host memory, 0 wrong elements, 0 dirty padding, training state carried' <<< "$output" | sort -u | wc -l)" -eq 2 ]
	[ "$(grep -c 'digest: match$' <<< "$output")" -eq 4 ]
}
