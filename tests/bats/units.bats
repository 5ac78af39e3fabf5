#!/usr/bin/env bats
# Numbers for people (vps(7) UNITS): sizes typed as budgets, human units on
# a terminal or with -H, exact numbers in pipes and files, the summary line
# on standard error, vps-exec's line in the units of the budgets.

load helpers

# The rule of vps(7) UNITS, computed here apart from the library: bytes in
# powers of 1024 with three significant digits, below 1000 exact.
human() { # BYTES
	awk -v b="$1" 'BEGIN {
		if (b < 1000) { printf "%d B\n", b; exit }
		split("B KiB MiB GiB TiB PiB EiB", u, " "); i = 1; v = b
		while (v >= 999.5 && i < 7) { v /= 1024; i++ }
		if (v >= 99.95) printf "%.0f %s\n", v, u[i]
		else if (v >= 9.995) printf "%.1f %s\n", v, u[i]
		else printf "%.2f %s\n", v, u[i] }'
}
seconds() { # SECONDS (above 1 ms)
	awk -v s="$1" 'BEGIN {
		if (s < 0.9995) { v = s * 1000; u = "ms" } else { v = s; u = "s" }
		if (v >= 99.95) printf "%.0f %s\n", v, u
		else if (v >= 9.995) printf "%.1f %s\n", v, u
		else printf "%.2f %s\n", v, u }'
}
sig3() { # SECONDS: with three significant digits, an integer from 100 on
	awk -v s="$1" 'BEGIN {
		if (s >= 99.95) { printf "%.0f\n", s; exit }
		r = sprintf("%.3g", s) + 0; d = 0
		while (r < 100 && d < 12) { r *= 10; d++ }
		printf "%.*f\n", d, s }'
}
key() { # KEY FILE: the value of "KEY: value"
	awk -v k="$1:" '$1 == k { sub(/^[^:]*: /, ""); print; exit }' "$2"
}
# Run a command under a pseudo-terminal (standard output a terminal).
on_tty() {
	script -qec "$*" /dev/null | tr -d '\r'
}

@test "budgets: 2G and 2GiB are 2^31 bytes, 2GB is 2*10^9, 512M is 2^29: one staged plan for one size" {
	vps-plan --transition llama2-7b-s1-s2 -q -o ab.plan
	vps-stage --budget 2147483648 ab.plan -q -o bytes.staged
	for b in 2G 2GiB 2Gi 2g "2 GiB" 2048M 2097152K 0.001953125T; do
		vps-stage --budget "$b" ab.plan -q -o s.staged
		cmp bytes.staged s.staged || { echo "--budget $b differs from 2147483648" >&2; return 1; }
	done
	[ "$(vps-stage --budget 2GB --stats ab.plan | key budget /dev/stdin)" = 2000000000 ]
	[ "$(vps-stage --budget 512M --stats ab.plan | key budget /dev/stdin)" = 536870912 ]
	[ "$(vps-stage --budget 1.5GiB --stats ab.plan | key budget /dev/stdin)" = 1610612736 ]
	# a budgets document takes the same sizes
	printf 'vps: budgets\nversion: 1\nbudgets: [80G, 40GB, "2 G"]\n' > budgets.yaml
	[ "$(vps-stage --budgets budgets.yaml --stats ab.plan | key budget /dev/stdin)" = 2147483648 ]
}

# The table of sizes in vps(7) UNITS, as "SIZE<TAB>BYTES" lines (BYTES
# "refused" for a size the page says is refused): read from the page, so
# that the page and the parser cannot say different things.
page_sizes() {
	awk '/^\.\\" example: .*tests\/bats\/units\.bats reads it/ { m = 1; next }
		m && /^\.EX/ { inside = 1; next }
		inside && /^\.EE/ { exit }
		inside && !/^size / {
			n = split($0, col, /   +/)
			bytes = col[n] ~ /^refused/ ? "refused" : col[n]
			k = split(col[1], size, /, /)
			for (i = 1; i <= k; i++) { gsub(/"/, "", size[i]); print size[i] "\t" bytes }
		}' "$TOP/man/vps.7"
}

@test "vps(7) UNITS: every size of its table is the bytes it says, or refused as it says" {
	vps-layout --model tiny-llama --parallel tp=2 -q -o a.layout
	vps-layout --model tiny-llama --parallel dp=2 -q -o b.layout
	vps-plan a.layout b.layout -q -o ab.plan
	page_sizes > sizes.tsv
	# the table is there, with the spellings of each case
	[ "$(wc -l < sizes.tsv)" -ge 20 ]
	local s want n=0
	for s in 2gib 2GIB 2Gib 2g 2GB 2Gb; do
		grep -q "^$s	" sizes.tsv || { echo "vps(7) UNITS has no row for $s" >&2; return 1; }
	done
	while IFS=$'\t' read -r s want; do
		if [ "$want" = refused ]; then
			expect_status 2 vps-stage --budget "$s" ab.plan
			[ "${lines[0]}" = "vps-stage: --budget: '$s': a lowercase b is bits; a size is in bytes (B)" ] ||
				{ echo "$s: $output" >&2; return 1; }
		else
			run vps-stage --budget "$s" --stats ab.plan
			[ "$status" -eq 0 ] && [ "$(key budget <(echo "$output"))" = "$want" ] ||
				{ echo "vps(7) says $s is $want bytes; vps-stage: $output" >&2; return 1; }
		fi
		n=$((n + 1))
	done < sizes.tsv
	[ "$n" -ge 20 ]
}

@test "a size that is not one exits 2 naming it and what is wrong" {
	vps-plan --transition llama2-7b-s1-s2 -q -o ab.plan
	for b in 2Gb 1e9 -1 nan inf 0x1000 2X 99999999999999999999 8E 8192PiB "" " 2G" 1.5.5G; do
		expect_status 2 vps-stage --budget "$b" ab.plan -o s.staged
		[[ "$output" == "vps-stage: --budget: '$b'"* ]] || { echo "--budget '$b': $output" >&2; return 1; }
		[ ! -e s.staged ]
	done
	expect_status 2 vps-stage --budget 2Gb ab.plan
	[ "${lines[0]}" = "vps-stage: --budget: '2Gb': a lowercase b is bits; a size is in bytes (B)" ]
	expect_status 2 vps-stage --budget 18446744073709551616 ab.plan
	[[ "${lines[0]}" == *"is too large (at most 9223372036854775807 bytes)" ]]
	# a size split at its blank is one size, not a size and an operand
	for u in GiB G MB KiB B; do
		expect_status 2 vps-stage --budget 2 "$u" ab.plan -o s.staged
		[ "${lines[0]}" = "vps-stage: --budget: '2 $u' is one size in two arguments: write 2$u, without the blank" ]
		[ "${lines[1]}" = "Try 'vps-stage -h' for more." ] && [ "${#lines[@]}" -eq 2 ]
		[ ! -e s.staged ]
	done
	# with its blank inside one argument it is a size
	[ "$(vps-stage --budget "2 GiB" --stats ab.plan | key budget /dev/stdin)" = 2147483648 ]
	printf 'vps: budgets\nversion: 1\nbudgets: [80G, 2Gb]\n' > budgets.yaml
	expect_status 2 vps-stage --budgets budgets.yaml ab.plan
	[[ "$output" == "vps-stage: budgets.yaml"*"item 1: '2Gb' is not a size"* ]]
}

@test "--stats: exact in a pipe, human units with -H and on a terminal, the same numbers" {
	vps-plan --transition llama2-7b-s1-s2 --stats --topology a800-testbed > exact.txt
	vps-plan --transition llama2-7b-s1-s2 --stats --topology a800-testbed -H > human.txt
	on_tty vps-plan --transition llama2-7b-s1-s2 --stats --topology a800-testbed > tty.txt
	cmp human.txt tty.txt
	[ "$(key bytes_moved exact.txt)" = 87233363968 ]
	local k n=0
	for k in bytes_moved bytes_retained bytes_lower_bound bytes_intra_node bytes_inter_node max_send_bytes \
		max_recv_bytes balanced_send_bound balanced_bound; do
		[ "$(key $k human.txt)" = "$(human "$(key $k exact.txt)")" ] ||
			{ echo "$k: $(key $k human.txt) for $(key $k exact.txt)" >&2; return 1; }
		n=$((n + 1))
	done
	# a key that says seconds holds seconds, with three significant digits
	for k in estimate_seconds time_bound_seconds time_floor_seconds paper_seconds paper_mcp_save_seconds \
		paper_mcp_load_seconds; do
		[ "$(key $k human.txt)" = "$(sig3 "$(key $k exact.txt)")" ] ||
			{ echo "$k: $(key $k human.txt) for $(key $k exact.txt)" >&2; return 1; }
	done
	[ "$(key estimate_seconds human.txt)" = 0.472 ]
	[ "$(key paper_seconds human.txt)" = 0.818 ]
	[ "$(key paper_mcp_save_seconds human.txt)" = 14.6 ]
	# no key names a unit its value is not in: seconds are never ms or us
	! grep -E '_seconds: .*[0-9] ?(s|ms|us)$' human.txt
	# ratios and counts are the same in both
	diff <(grep -vE '_bytes|^bytes_|_bound:|_seconds:|^estimate_by:' exact.txt) \
		<(grep -vE '_bytes|^bytes_|_bound:|_seconds:|^estimate_by:' human.txt)
	# what sets the estimate names its bytes in the listing's units
	grep -qF ', 11794153472, and 7 peers"' exact.txt
	grep -qF ", $(human 11794153472), and 7 peers\"" human.txt
	# the layout's and the staging's too
	vps-plan --transition llama2-7b-s1-s2 -q -o ab.plan
	vps-stage --budget 2G --stats ab.plan > s.exact
	vps-stage --budget 2G --stats -H ab.plan > s.human
	[ "$(key budget s.human)" = "2.00 GiB" ]
	[ "$(key peak_max s.human)" = "$(human "$(key peak_max s.exact)")" ]
	[ "$(key bytes_moved s.human)" = "$(human "$(key bytes_moved s.exact)")" ]
	vps-layout --model llama2-7b --parallel tp=2,pp=2,dp=2,zero=1 --stats > l.exact
	vps-layout --model llama2-7b --parallel tp=2,pp=2,dp=2,zero=1 --stats -H > l.human
	for k in logical_bytes total_bytes rank_bytes_max rank_bytes_min; do
		[ "$(key $k l.human)" = "$(human "$(key $k l.exact)")" ]
	done
}

@test "the summary line: on standard error when the document goes to a file or a pipe, from the tools' own numbers" {
	vps-plan --transition llama2-7b-s1-s2 --stats --topology a800-testbed > st.txt
	vps-plan --transition llama2-7b-s1-s2 --topology a800-testbed -o ab.plan 2> err
	local moved busiest est
	moved=$(human "$(key bytes_moved st.txt)")
	busiest=$(human "$(awk '$1 == "max_send_bytes:" { s = $2 } $1 == "max_recv_bytes:" { r = $2 } END { print (s > r ? s : r) }' st.txt)")
	est=$(seconds "$(key estimate_seconds st.txt)")
	devices="$(key joining st.txt) joining, $(key leaving st.txt) leaving"
	[ "$(cat err)" = "plan: $moved moved, the lower bound; busiest device $busiest (1.00x balanced); $est on a800-testbed; $devices" ]
	# into a pipe: the same sentence, and the plan unchanged by it (the
	# topology too: the relays' choice weighs its bandwidths)
	vps-plan --transition llama2-7b-s1-s2 --topology a800-testbed 2> err2 | cmp - ab.plan
	[ "$(cat err2)" = "$(cat err)" ]
	vps-plan --transition llama2-7b-s1-s2 2> err2 > bytes.plan
	[ "$(cat err2)" = "plan: $moved moved, the lower bound; busiest device $busiest (1.00x balanced); $devices" ]
	# -q: nothing; on a terminal with -o: the sentence (the plan is in a file)
	vps-plan --transition llama2-7b-s1-s2 --topology a800-testbed -q -o q.plan 2> err3
	[ ! -s err3 ]
	cmp q.plan ab.plan
	# --stats is its own summary
	vps-plan --transition llama2-7b-s1-s2 --stats 2> err4 > /dev/null
	[ ! -s err4 ]
	# YAML to the terminal: no sentence (the document is what the user sees)
	on_tty "vps-layout --model tiny-llama --parallel tp=2 --yaml 2> $PWD/err5" > tty.yaml
	grep -q '^vps: layout' tty.yaml
	[ ! -s err5 ]
	on_tty "vps-layout --model tiny-llama --parallel tp=2 -o t.layout 2> $PWD/err5"
	[[ "$(cat err5)" == "layout: tiny-llama on 2 ranks"* ]]

	# one rank's plan: its sends and receives, as --stats counts them
	vps-plan --transition llama2-7b-s1-s2 --rank 3 --stats > r3.txt
	vps-plan --transition llama2-7b-s1-s2 --rank 3 -o r3.plan 2> err6
	[ "$(cat err6)" = "plan: rank 3 sends $(human "$(key send_bytes r3.txt)"), receives $(human "$(key recv_bytes r3.txt)"), keeps $(human "$(key retained_bytes r3.txt)") in place ($(key pieces r3.txt) pieces)" ]

	# vps-stage: stages, budget, peak
	vps-stage --budget 2GiB --stats ab.plan > sst.txt
	vps-stage --budget 2GiB ab.plan -o ab.staged 2> err7
	[ "$(cat err7)" = "staged: $(key stages sst.txt) stages within a 2.00 GiB budget, peak $(human "$(key peak_max sst.txt)") a rank; $(human "$(key bytes_moved sst.txt)") moved in $(key transfers sst.txt) transfers" ]
	vps-stage --budget 2GiB -q ab.plan -o q.staged 2> err8
	[ ! -s err8 ]

	# vps-layout: ranks and bytes a rank
	vps-layout --model llama2-7b --parallel tp=4,pp=4,dp=1,zero=1 --stats > lst.txt
	vps-layout --model llama2-7b --parallel tp=4,pp=4,dp=1,zero=1 > b.layout 2> err9
	[[ "$(cat err9)" == "layout: llama2-7b on $(key world lst.txt) ranks ($(key parallel lst.txt | tr -d '"')); $(human "$(key rank_bytes_min lst.txt)") to $(human "$(key rank_bytes_max lst.txt)") a rank, $(human "$(key total_bytes lst.txt)") in all ("*"x the state)" ]]
}

@test "tcp: vps-exec reports in the units of the budgets; --report keeps the exact bytes" {
	vps-layout --model tiny-llama --parallel tp=2 --gpus-per-node 2 -q -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2 --gpus-per-node 2 -q -o b.layout
	vps-plan a.layout b.layout -q | vps-stage --budget 1MiB -q - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	for r in 0 1; do vps-trainer --registry "u$$-$r" --rank $r --timeout 20 s.staged > t.$r 2>&1 & done
	for r in 0 1; do
		vps-exec --registry "u$$-%r" --rank $r --master 127.0.0.1:$port --check --timeout 10 \
			--report rep.$r s.staged > e.$r 2>&1 &
	done
	wait
	local r line sent recv copied
	for r in 0 1; do
		line=$(grep "^vps-exec: rank $r: switch" e.$r)
		sent=$(human "$(awk '$1 == "bytes_sent:" { print $2; exit }' rep.$r)")
		recv=$(human "$(awk '$1 == "bytes_received:" { print $2; exit }' rep.$r)")
		copied=$(human "$(awk '$1 == "bytes_copied:" { print $2; exit }' rep.$r)")
		[[ "$line" == "vps-exec: rank $r: switch "*": sent $sent, received $recv, copied $copied in "*" ("*"B/s) over tcp; pause "*"s, setup "*"s; digest: match" ]] ||
			{ echo "rank $r: $line; report: $sent, $recv, $copied" >&2; return 1; }
		# the report's bytes are exact integers
		awk '$1 == "bytes_sent:" { exit !($2 ~ /^[0-9]+$/ && $2 > 0) }' rep.$r
	done
}
