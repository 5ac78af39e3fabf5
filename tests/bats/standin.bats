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
	moe_own) echo "2 --model tiny-qwen3-moe --from tp=2,pp=1,dp=2,zero=1 --to tp=2,pp=1,dp=2,ep=2,etp=1,zero=1" ;;
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
@test "auto: MoE: experts move from the dense buffer to their own, two nodes" { gpu_case auto moe_own; }

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
