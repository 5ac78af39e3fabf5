#!/usr/bin/env bats
# Usage errors: one line that says what is wrong and a pointer to -h, exit
# 2, before any file is read; which options go together, from each tool's
# table of rules.

load helpers

TOOLS="vps-layout vps-plan vps-stage vps-exec vps-trainer vps-verify vps-show"

# usage_error WANT TOOL ARG...: exit 2 and exactly two lines on standard
# error, "TOOL: WANT" and the pointer to -h.
usage_error() {
	local want=$1
	shift
	expect_status 2 "$@"
	if [ "${#lines[@]}" -ne 2 ] || [ "${lines[0]}" != "$1: $want" ] || [ "${lines[1]}" != "Try '$1 -h' for more." ]; then
		printf 'expected:\n%s: %s\nTry '\''%s -h'\'' for more.\ngot:\n%s\n' "$1" "$want" "$1" "$output" >&2
		return 1
	fi
}

@test "every tool: an unknown option, or a flag given a value, is one line and a pointer to -h" {
	local t
	for t in $TOOLS; do
		usage_error "unknown option --no-such-option" "$t" --no-such-option
		usage_error "unknown option -Z" "$t" -Z
		usage_error "unknown option --no-such-option" "$t" --no-such-option=3 x
		usage_error "--version takes no value" "$t" --version=1
	done
	usage_error "--quiet takes no value" vps-verify --quiet=yes x
	# a short option inside a cluster, after a long one
	usage_error "unknown option -Z" vps-plan --stats -Zq a b
	usage_error "unknown option -Z" vps-plan --stats -qZ a b
	# nothing on standard output
	expect_status 2 sh -c 'vps-plan --no-such-option 2>/dev/null'
	[ -z "$output" ]
}

@test "every tool: a value missing at the end of the line is named" {
	usage_error "--model needs a value" vps-layout --model
	usage_error "--rank needs a value" vps-plan --rank
	usage_error "--budget needs a value" vps-stage --budget
	usage_error "--registry needs a value" vps-exec --registry
	usage_error "--timeout needs a value" vps-trainer x --timeout
	usage_error "-o needs a value" vps-show x -o
	usage_error "--output needs a value" vps-show x --output
}

@test "-h prints the usage on standard output and exits 0; --version the version" {
	local t
	for t in $TOOLS; do
		run "$t" -h
		[ "$status" -eq 0 ] && [[ "${lines[0]}" == "usage: $t "* ]] || { echo "$t -h: $output" >&2; return 1; }
		run "$t" --help
		[ "$status" -eq 0 ] && [[ "${lines[0]}" == "usage: $t "* ]]
		[ -z "$("$t" -h 2>&1 >/dev/null)" ]
		run "$t" --version
		[ "$status" -eq 0 ] && [[ "$output" == "$t "[0-9]* ]]
	done
	# -h wins over what else the line holds
	run vps-stage --budget 1M -h a b c
	[ "$status" -eq 0 ] && [[ "${lines[0]}" == "usage: vps-stage "* ]]
}

@test "a prefix of two long options is ambiguous, and says which" {
	usage_error "--trans is ambiguous: --transition or --transfers?" vps-plan --trans x
	usage_error "--micro is ambiguous: --micro-batch or --micro-batch-before?" vps-plan --micro 2
	# an exact name is that option, though it begins another
	usage_error "--micro-batch needs a value" vps-plan --micro-batch
	# a prefix of one is that option, as getopt_long has it
	run vps-plan --transit gpt3-1.3b-tp-up --stats
	[ "$status" -eq 0 ]
}

@test "the wrong operands: what was expected, or the first one too many" {
	usage_error "expected one plan file, or - for standard input" vps-stage --budget 1M
	usage_error "b: unexpected argument (expected one plan file, or - for standard input); to write it: vps-stage --budget 1M a -o b" vps-stage --budget 1M a b
	usage_error "expected one file, or - for standard input" vps-show
	usage_error "expected one or more files" vps-show -t
	usage_error "expected one or more files" vps-verify -q
	usage_error "expected a staged plan" vps-exec --rank 0
	usage_error "several staged plans need --serve" vps-exec a.staged b.staged
	usage_error "expected a staged plan" vps-trainer --rank 0
	usage_error "extra: unexpected argument (expected options only); to write it: vps-layout --model tiny-llama -o extra" vps-layout --model tiny-llama extra
	usage_error "expected two layouts or --transition NAME" vps-plan a.layout
	usage_error "c.layout: unexpected argument (expected two layouts or --transition NAME); to write it: vps-plan a b -o c.layout" vps-plan a b c.layout
	usage_error "a: unexpected argument (expected two layouts or --transition NAME); to write it: vps-plan --transition llama2-7b-s1-s2 -o a" vps-plan --transition llama2-7b-s1-s2 a
	# both layouts from standard input: refused before either is read
	usage_error "only one of the layouts can be standard input" vps-plan - - </dev/null
}

@test "a file where the tool takes none, or -i where it takes operands: the command that was likely meant" {
	vps-layout --model tiny-llama --parallel tp=2 -q -o a.layout
	vps-layout --model tiny-llama --parallel dp=2 -q -o b.layout
	vps-plan a.layout b.layout -q -o ab.plan
	# a layout named as an operand of vps-layout, which reads one with -i
	usage_error "a.layout: unexpected argument (expected options only); to read it: vps-layout -i a.layout --tensor 'layers.0.*'" \
		vps-layout a.layout --tensor 'layers.0.*'
	usage_error "a.layout: unexpected argument (expected options only); to read it: vps-layout -i a.layout --stats" \
		vps-layout --stats a.layout
	usage_error "-: unexpected argument (expected options only); to read it: vps-layout -i -" vps-layout - < a.layout
	# computing a layout, the operand is where it was meant to go, though it exists
	usage_error "a.layout: unexpected argument (expected options only); to write it: vps-layout --model tiny-llama --parallel tp=2 -o a.layout" \
		vps-layout --model tiny-llama --parallel tp=2 a.layout
	# with -i and -o both given, nothing to suggest
	usage_error "b.layout: unexpected argument (expected options only)" vps-layout -i a.layout -o x.layout b.layout
	# an output named as one more operand; an existing file is no output to suggest
	usage_error "ab.staged: unexpected argument (expected one plan file, or - for standard input); to write it: vps-stage --budget 1M ab.plan -o ab.staged" \
		vps-stage --budget 1M ab.plan ab.staged
	usage_error "b.layout: unexpected argument (expected one plan file, or - for standard input)" vps-stage --budget 1M ab.plan b.layout
	usage_error "a b.yaml: unexpected argument (expected one file, or - for standard input); to write it: vps-show ab.plan -o 'a b.yaml'" \
		vps-show ab.plan 'a b.yaml'
	[ ! -e ab.staged ] && [ ! -e 'a b.yaml' ] && [ ! -e x.layout ]
	# -i to a tool that reads operands
	usage_error "unknown option -i; vps-stage reads the files named as operands: vps-stage --budget 1M ab.plan" \
		vps-stage --budget 1M -i ab.plan
	usage_error "unknown option --input; vps-verify reads the files named as operands: vps-verify -q a.layout" \
		vps-verify -q --input=a.layout
	usage_error "unknown option -i; vps-show reads the files named as operands: vps-show ab.plan" vps-show -i ab.plan
	usage_error "unknown option -i; vps-plan reads the files named as operands: vps-plan a.layout b.layout" \
		vps-plan -i a.layout b.layout
}

@test "vps-plan: each rule of what goes with what, before a file is read" {
	local transfers="--peer, --tensor, --state, --stage and --format go with --transfers"
	usage_error "$transfers" vps-plan --peer 1 no.layout no.layout
	usage_error "$transfers" vps-plan --tensor x no.layout no.layout
	usage_error "$transfers" vps-plan --state param no.layout no.layout
	usage_error "$transfers" vps-plan --stage 0 no.layout no.layout
	usage_error "--format goes with --transfers or --lost" vps-plan --format json no.layout no.layout
	usage_error "--allow-loss goes with --lost" vps-plan --allow-loss no.layout no.layout
	usage_error "--load goes with --stats" vps-plan --load no.layout no.layout
	usage_error "--load goes with --stats" vps-plan --load --transfers --rank 0 no.plan
	local query="--transfers is a query: --stats, --yaml and --svg do not apply (--format yaml)"
	usage_error "$query" vps-plan --transfers --rank 0 --stats no.layout no.layout
	usage_error "$query" vps-plan --transfers --rank 0 --yaml no.plan
	usage_error "$query" vps-plan --transfers --rank 0 --svg t.svg no.plan
	usage_error "--svg draws a global plan's traffic: it does not go with --rank" vps-plan --svg t.svg --rank 0 no.layout no.layout
	usage_error "--svg and -o name the same file 'x'" vps-plan --svg x -o x no.layout no.layout
	local data="--step and --consumed-samples go together (the data position is both)"
	usage_error "$data" vps-plan --step 3 no.layout no.layout
	usage_error "$data" vps-plan --consumed-samples 3 no.layout no.layout
	usage_error "--scheduler-step needs --step and --consumed-samples" vps-plan --scheduler-step 3 no.layout no.layout
	local batch="--micro-batch and --micro-batch-before need --global-batch"
	usage_error "$batch" vps-plan --micro-batch 2 no.layout no.layout
	usage_error "$batch" vps-plan --micro-batch-before 2 no.layout no.layout
	usage_error "--lost plans: it goes with two layouts or a transition, not a plan file" vps-plan --transfers --lost 1 no.plan
	usage_error "--transfers needs --rank R with two layouts or a transition" vps-plan --transfers no.layout no.layout
	# and what they allow goes on to read the files
	expect_status 2 vps-plan --transfers --rank 0 --format json --lost 1 no.layout no.layout
	[ "$output" = "vps-plan: no.layout: No such file or directory" ]
}

@test "vps-layout, vps-show and vps-trainer: their rules" {
	usage_error "--state, --box and --format go with --tensor" vps-layout -i a.layout --format json
	usage_error "--tensor is a query: --rank, --stats and --yaml do not apply (--format yaml)" \
		vps-layout -i a.layout --tensor x --rank 0
	usage_error "-i reads a layout: --model, --parallel and --devices do not apply" vps-layout -i a.layout --parallel tp=2
	usage_error "--model is required" vps-layout --parallel tp=2
	usage_error "-t prints one line per file: no --yaml, --json, --binary, -o or -q with it" vps-show -t -o x a
	usage_error "--yaml does not go with --json" vps-show --yaml --json a
	usage_error "--json does not go with --binary" vps-show --binary --json a
	usage_error "--device goes with --cuda" vps-trainer --device 0 --rank 0 a.staged
}

@test "a flag's value that is not one says what it must be" {
	local s
	for s in nan inf -1 0 1x ''; do
		usage_error "--timeout: '$s' is not a positive number of seconds" vps-exec --timeout "$s" a.staged
		usage_error "--timeout: '$s' is not a positive number of seconds" vps-trainer --timeout "$s" a.staged
	done
	usage_error "--request-timeout: 'NaN' is not a positive number of seconds" vps-exec --request-timeout NaN a.staged
	usage_error "--world: 0 is not a world size" vps-exec --world 0 a.staged
	usage_error "--rank: '-1' is not a rank" vps-exec --rank -1 a.staged
	usage_error "--rank: 'one' is not a rank" vps-stage --budget 1M --rank one a.plan
	usage_error "--device: '1024' is not a GPU number" vps-exec --device 1024 a.staged
	usage_error "--master: 'nohost' is not HOST:PORT" vps-exec --master nohost a.staged
	usage_error "--master: 'h:70000' is not HOST:PORT" vps-exec --master h:70000 a.staged
	usage_error "--gpus-per-node: 0 is not a positive integer" vps-layout --model tiny-llama --gpus-per-node 0
	usage_error "--rank: '1,x' is not a rank list (0,3,5-7 or all)" vps-layout --model tiny-llama --rank 1,x
	usage_error "--steps: '2.5' is not a non-negative integer" vps-trainer --steps 2.5 a.staged
	usage_error "--state: unknown state 'momentum' (param, main_param, exp_avg, exp_avg_sq or grad)" \
		vps-layout -i a.layout --tensor x --state momentum
	usage_error "--lost: '1-' is not a list of ranks (0,3,5-7)" vps-plan --transition gpt3-1.3b-tp-up --lost 1-
}

@test "no rank from flags or the launcher: a usage error that says where a rank comes from" {
	expect_status 2 env -u RANK -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK vps-trainer a.staged
	[ "${lines[0]}" = "vps-trainer: no rank: give --rank, or run under torchrun (RANK), Slurm (SLURM_PROCID) or Open MPI (OMPI_COMM_WORLD_RANK)" ]
	[ "${lines[1]}" = "Try 'vps-trainer -h' for more." ]
	expect_status 2 env -u MASTER_ADDR -u MASTER_PORT vps-exec --rank 0 no.staged
	[ "${lines[0]}" = "vps-exec: no rendezvous: give --master HOST:PORT or set MASTER_ADDR and MASTER_PORT" ]
}
