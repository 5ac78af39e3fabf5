#!/usr/bin/env bats
# Queries: vps-layout --tensor (who holds what) and vps-plan --transfers
# (what one rank sends and receives), each answer checked against one
# computed here from the full documents: the regions of every rank's
# `vps-layout --rank all --yaml`, the pieces of the plan's YAML, the copies
# of the staged plan's YAML.

load helpers

# The columns the man pages document, in order.
HOLDER_COLUMNS="tensor state ranks base stride count buffer box offset strides bytes"
TRANSFER_COLUMNS="rank direction peer tensor state box bytes src_buffer src_offset dst_buffer dst_offset stage chunk forward piece"

# holders.py RECORDS.jsonl RANKS.yaml GLOB STATE BOX: the records, their
# ranks expanded from base/stride/count, must be exactly the regions of the
# listed ranks whose tensor GLOB matches (and of STATE, unless "-"), clipped
# to BOX (unless "-") with the offset of the clipped box's first element.
write_holders_py() {
	cat >holders.py <<'PY'
import fnmatch, json, sys, yaml
recs = [json.loads(l) for l in open(sys.argv[1])]
doc = yaml.safe_load(open(sys.argv[2]))
glob, state, box = sys.argv[3], sys.argv[4], sys.argv[5]
box = None if box == "-" else [[int(v) for v in ax.split(":")] for ax in box.split(",")]
size = lambda st: 2 if st == "param" else 4
def vol(b):
    v = 1
    for lo, hi in b:
        v *= hi - lo
    return v
def ranks_text(b, s, c):
    return str(b) if c == 1 else f"{b}-{b + c - 1}" if s == 1 else f"{b}-{b + (c - 1) * s}:{s}"
got = []
for r in recs:
    assert r["ranks"] == ranks_text(r["base"], r["stride"], r["count"]), r
    assert r["bytes"] == vol(r["box"]) * size(r["state"]), r
    for i in range(r["count"]):
        got.append((r["base"] + i * r["stride"], r["tensor"], r["state"], r["buffer"],
                    json.dumps(r["box"]), r["offset"], json.dumps(r["strides"])))
want = []
for rank in doc["ranks"]:
    for g in rank["regions"]:
        if not fnmatch.fnmatchcase(g["tensor"], glob) or state not in ("-", g["state"]):
            continue
        b, off = g["box"], g["offset"]
        if box is not None:
            if len(box) != len(b):
                continue
            c = [[max(lo, blo), min(hi, bhi)] for (lo, hi), (blo, bhi) in zip(b, box)]
            if any(lo >= hi for lo, hi in c):
                continue
            off += sum((cl - lo) * s for (cl, _), (lo, _), s in zip(c, b, g["strides"]))
            b = c
        want.append((rank["rank"], g["tensor"], g["state"], g["buffer"], json.dumps(b), off,
                     json.dumps(g["strides"])))
got.sort()
want.sort()
if got != want:
    print("records:", len(got), "regions:", len(want), file=sys.stderr)
    print("only in records:", sorted(set(got) - set(want))[:5], file=sys.stderr)
    print("only in regions:", sorted(set(want) - set(got))[:5], file=sys.stderr)
    sys.exit(1)
assert want, "the query was to match something"
print(len(recs), len(want))
PY
}

# check_holders LAYOUT-ARGS... -- GLOB STATE BOX
check_holders() {
	local args=() glob state box
	while [ "$1" != -- ]; do
		args+=("$1")
		shift
	done
	glob=$2 state=$3 box=$4
	local q=(--tensor "$glob" --format json)
	[ "$state" = - ] || q+=(--state "$state")
	[ "$box" = - ] || q+=(--box "$box")
	vps-layout "${args[@]}" "${q[@]}" >rec.jsonl
	vps-layout "${args[@]}" --rank all --yaml >ranks.yaml
	"$PY" holders.py rec.jsonl ranks.yaml "$glob" "$state" "$box"
}

@test "vps-layout --tensor: the holders of a name or a glob are every rank's regions of it" {
	write_holders_py
	local L=(--model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1)
	check_holders "${L[@]}" -- decoder.layers.5.mlp.linear_fc1.weight - -
	check_holders "${L[@]}" -- 'decoder.layers.[17].*fc1*' - -
	check_holders "${L[@]}" -- '*' - -
	check_holders "${L[@]}" -- 'embedding.*' exp_avg -
	# experts in their own buffer, and a tied output copy on the last stage
	check_holders --model tiny-qwen3-moe --parallel tp=2,pp=2,ep=2,dp=2,zero=1 -- '*' - -
	check_holders --model tiny-gpt --parallel tp=2,pp=2,vpp=2,dp=2,grad=1 -- 'decoder.layers.*' grad -
	# ranks listed in a layout file are holders of their own
	vps-layout "${L[@]}" --rank 1,6 --yaml >explicit.yaml
	check_holders -i explicit.yaml -- 'decoder.layers.[06].*' - -
}

@test "vps-layout --tensor --box: who holds which part of a box, at which offset" {
	write_holders_py
	local L=(--model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1)
	# linear_qkv is [groups, rows, head_dim, hidden]: the box crosses the TP cut
	check_holders "${L[@]}" -- decoder.layers.2.self_attention.linear_qkv.weight - 1:3,1:3,5:30,7:200
	check_holders "${L[@]}" -- embedding.word_embeddings.weight main_param 500:520,3:4
	# a glob with a box: only the tensors of two axes, each clipped
	check_holders "${L[@]}" -- 'decoder.layers.3.*' param 0:100,0:100
	run vps-layout "${L[@]}" --tensor 'decoder.layers.3.*' --box 0:100,0:100 --format json
	[ "$status" -eq 0 ]
	! grep -q layer_norm <<<"$output"
}

@test "vps-layout --tensor: ranks are a sequence, never a list of the world" {
	expect_status 0 vps-layout --model tiny-llama --parallel tp=2,dp=4194304 --tensor output_layer.weight \
		--state param --format tsv
	[ "${#lines[@]}" -eq 3 ]
	[ "$(cut -f 3-6 <<<"${lines[1]}")" = "$(printf '0-8388606:2\t0\t2\t4194304')" ]
	[ "$(cut -f 3-6 <<<"${lines[2]}")" = "$(printf '1-8388607:2\t1\t2\t4194304')" ]
}

# records.py JSONL TSV YAML COLUMNS: the three formats carry the same
# records, the TSV header is the documented columns, and each JSON and TSV
# record is one line.
write_records_py() {
	cat >records.py <<'PY'
import json, sys, yaml
cols = sys.argv[4].split()
js = [json.loads(l) for l in open(sys.argv[1])]
lines = open(sys.argv[2]).read().split("\n")
assert lines[-1] == "" and lines[0].split("\t") == cols, lines[0]
def cell(name, text):
    if name in ("box",):
        return [[int(v) for v in ax.split(":")] for ax in text.split(",")]
    if name == "strides":
        return [int(v) for v in text.split(",")]
    if name in ("tensor", "state", "ranks", "direction"):
        return text
    return int(text)
tsv = [{c: cell(c, v) for c, v in zip(cols, l.split("\t"))} for l in lines[1:-1]]
ym = yaml.safe_load(open(sys.argv[3]))
assert all(list(r) == cols for r in js)
assert js == tsv, (js[:2], tsv[:2])
assert js == ym, (js[:2], ym[:2])
assert len(js) == len(open(sys.argv[3]).read().splitlines())
print(len(js))
PY
}

@test "--format: yaml, tsv and json carry the same records, one a line, under the documented columns" {
	write_records_py
	local L=(--model tiny-qwen3-moe --parallel tp=2,pp=2,ep=2,dp=2,zero=1) f c
	for f in json tsv yaml; do
		vps-layout "${L[@]}" --tensor 'decoder.layers.1.*' --format $f >h.$f
	done
	[ "$(vps-layout "${L[@]}" --tensor 'decoder.layers.1.*')" = "$(cat h.yaml)" ]
	"$PY" records.py h.json h.tsv h.yaml "$HOLDER_COLUMNS"
	vps-layout "${L[@]}" >a.layout
	vps-layout --model tiny-qwen3-moe --parallel tp=1,pp=2,ep=4,dp=4,zero=1 >b.layout
	for f in json tsv yaml; do
		vps-plan a.layout b.layout --rank 5 --transfers --format $f >t.$f
	done
	"$PY" records.py t.json t.tsv t.yaml "$TRANSFER_COLUMNS"
	# the columns as the man pages list them
	for c in $HOLDER_COLUMNS; do
		grep -q "^\.B.* $c\b" "$TOP/man/vps-layout.1" || { echo "vps-layout(1) lacks column $c" >&2; return 1; }
	done
	for c in $TRANSFER_COLUMNS; do
		grep -q "^\.B.* $c\b" "$TOP/man/vps-plan.1" || { echo "vps-plan(1) lacks column $c" >&2; return 1; }
	done
	# nothing found: an empty YAML sequence, a TSV header, no JSON line
	[ "$(vps-plan a.layout b.layout --rank 5 --transfers --peer 5 --tensor 'decoder.layers.0.*' --state exp_avg)" = "[]" ]
	[ "$(vps-plan a.layout b.layout --rank 5 --transfers --peer 5 --tensor 'decoder.layers.0.*' --format tsv)" = \
		"$(tr ' ' '\t' <<<"$TRANSFER_COLUMNS")" ]
	[ -z "$(vps-plan a.layout b.layout --rank 5 --transfers --peer 5 --tensor 'decoder.layers.0.*' --format json)" ]
}

# transfers.py RECORDS.jsonl PLAN.yaml RANK PEER GLOB STATE: the records are
# the plan's pieces with RANK at one end, filtered, in the plan's order,
# each with its index in the plan.
write_transfers_py() {
	cat >transfers.py <<'PY'
import fnmatch, json, sys, yaml
recs = [json.loads(l) for l in open(sys.argv[1])]
plan = yaml.safe_load(open(sys.argv[2]))
rank, peer, glob, state = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
want = []
for i, p in enumerate(plan["pieces"]):
    if rank not in (p["src"], p["dst"]):
        continue
    other = p["dst"] if p["src"] == rank else p["src"]
    if peer >= 0 and other != peer:
        continue
    if not fnmatch.fnmatchcase(p["tensor"], glob) or state not in ("-", p["state"]):
        continue
    n = 2 if p["state"] == "param" else 4
    for lo, hi in p["box"]:
        n *= hi - lo
    want.append({"rank": rank,
                 "direction": "retain" if p["src"] == p["dst"] else "send" if p["src"] == rank else "recv",
                 "peer": other, "tensor": p["tensor"], "state": p["state"], "box": p["box"], "bytes": n,
                 "src_buffer": p["src_buffer"] & 0x7fffffff, "src_offset": p["src_offset"],
                 "dst_buffer": p["dst_buffer"], "dst_offset": p["dst_offset"], "stage": -1, "chunk": -1,
                 "forward": p["src_buffer"] >> 31, "piece": i})
assert recs == want, (len(recs), len(want), recs[:1], want[:1])
print(len(recs))
PY
}

@test "vps-plan --transfers: a rank's records are its pieces of the plan, from layouts, a plan file or its own plan" {
	write_transfers_py
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 >a.layout
	# B on 4 GPUs of node 0 and 4 of node 1: world ranks 0-3 stay, 4-7
	# leave, 8-11 join
	vps-layout --model tiny-llama --parallel tp=4,pp=1,dp=2,zero=1 --gpus-per-node 4 >b.layout
	vps-plan a.layout b.layout >ab.plan
	vps-plan a.layout b.layout --yaml >ab.yaml
	local r
	for r in 0 3 6 9; do
		# the plan file's records: its pieces, numbered in it
		vps-plan --transfers --rank $r --format json ab.plan >from-plan
		"$PY" transfers.py from-plan ab.yaml $r -1 '*' -
		# planned from the layouts, the rank's own plan: the same pieces,
		# numbered in that plan
		vps-plan a.layout b.layout --rank $r --yaml >own.yaml
		vps-plan a.layout b.layout --rank $r --transfers --format json >from-layouts
		"$PY" transfers.py from-layouts own.yaml $r -1 '*' -
		sed 's/,"piece":[0-9]*}$/}/' from-layouts >a.json
		sed 's/,"piece":[0-9]*}$/}/' from-plan >b.json
		cmp a.json b.json
		# one rank's plan, in YAML on standard input: --rank is the file's
		vps-plan --transfers --format json - <own.yaml >from-own
		cmp from-layouts from-own
	done
	# filters: a peer (and the rank itself for its retains), a glob, a state
	vps-plan --transfers --rank 2 --peer 8 --format json ab.plan >f
	[ -s f ]
	"$PY" transfers.py f ab.yaml 2 8 '*' -
	vps-plan --transfers --rank 2 --peer 2 --format json ab.plan >f
	"$PY" transfers.py f ab.yaml 2 2 '*' -
	grep -q '"direction":"retain"' f
	vps-plan --transfers --rank 10 --tensor 'decoder.layers.[1-3].*fc?.weight' --state main_param --format json ab.plan >f
	[ -s f ]
	"$PY" transfers.py f ab.yaml 10 -1 'decoder.layers.[1-3].*fc?.weight' main_param
	vps-plan a.layout b.layout --rank 10 --transfers --tensor decoder.layers.6.mlp.linear_fc2.weight --format json >f
	[ -s f ]
	vps-plan a.layout b.layout --rank 10 --yaml >own.yaml
	"$PY" transfers.py f own.yaml 10 -1 decoder.layers.6.mlp.linear_fc2.weight -
}

# staged.py STAGED-RECORDS.jsonl PLAN.yaml STAGED.yaml RANK: every record is
# a part of one of the rank's pieces with the piece's addressing, and names
# it; the parts of each piece tile its box; and the bytes of the records of each transfer
# (stage, chunk, src, dst) are those of its copies in the staged plan.
write_staged_py() {
	cat >staged.py <<'PY'
import json, sys, yaml
from collections import defaultdict
recs = [json.loads(l) for l in open(sys.argv[1])]
plan = yaml.safe_load(open(sys.argv[2]))
staged = yaml.safe_load(open(sys.argv[3]))
rank = int(sys.argv[4])
def vol(b):
    v = 1
    for lo, hi in b:
        v *= hi - lo
    return v
pieces = defaultdict(list)
for i, p in enumerate(plan["pieces"]):
    if rank in (p["src"], p["dst"]):
        pieces[(p["src"], p["dst"], p["tensor"], p["state"])].append(i)
parts = defaultdict(list)
by_xfer = defaultdict(int)
for r in recs:
    src, dst = (rank, r["peer"]) if r["direction"] in ("send", "retain") else (r["peer"], rank)
    hit = None
    for i in pieces[(src, dst, r["tensor"], r["state"])]:
        p = plan["pieces"][i]
        if all(plo <= lo and hi <= phi for (lo, hi), (plo, phi) in zip(r["box"], p["box"])):
            so = p["src_offset"] + sum((lo - plo) * s for (lo, _), (plo, _), s in zip(r["box"], p["box"], p["src_strides"]))
            do = p["dst_offset"] + sum((lo - plo) * s for (lo, _), (plo, _), s in zip(r["box"], p["box"], p["dst_strides"]))
            if (so, do, p["src_buffer"], p["dst_buffer"]) == (r["src_offset"], r["dst_offset"],
                                                               r["src_buffer"] | r["forward"] << 31, r["dst_buffer"]):
                hit = i
    assert hit is not None, r
    # the piece it names is the one it is a part of
    assert r["piece"] == hit, (r, hit)
    parts[hit].append(r["box"])
    by_xfer[(r["stage"], r["chunk"], src, dst)] += r["bytes"]
for key, idx in pieces.items():
    for i in idx:
        boxes = parts[i]
        assert sum(vol(b) for b in boxes) == vol(plan["pieces"][i]["box"]), (i, boxes)
        for a in range(len(boxes)):
            for b in range(a + 1, len(boxes)):
                assert any(max(x[0], y[0]) >= min(x[1], y[1]) for x, y in zip(boxes[a], boxes[b])), (i, boxes[a], boxes[b])
want = defaultdict(int)
for x in staged["transfers"]:
    if rank in (x["src"], x["dst"]):
        for o in x["ops"]:
            want[(x["stage"], x["chunk"], x["src"], x["dst"])] += vol([[0, e] for e in o["ext"]]) * o["esize"]
assert by_xfer == want, (sorted(by_xfer.items())[:3], sorted(want.items())[:3])
print(len(recs), len(parts))
PY
}

@test "vps-plan --transfers over a staged plan: the parts of the rank's pieces each copy carries, by stage" {
	write_staged_py
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 >a.layout
	vps-layout --model tiny-llama --parallel tp=4,pp=1,dp=2,zero=1 >b.layout
	vps-plan a.layout b.layout --yaml >ab.yaml
	# a budget small enough that chunks cut pieces, strided ones included
	vps-stage --budget 64KiB ab.yaml --yaml >ab.staged.yaml
	vps-stage --budget 64KiB ab.yaml >ab.staged
	local r
	for r in 0 5; do
		vps-plan --transfers --rank $r --format json ab.staged.yaml >s.$r
		"$PY" staged.py s.$r ab.yaml ab.staged.yaml $r
		vps-plan --transfers --rank $r --format json ab.staged | cmp - s.$r
		# cut pieces come in several parts
		[ "$(wc -l <s.$r)" -gt "$(vps-plan --transfers --rank $r --format json ab.yaml | wc -l)" ]
	done
	# one stage: exactly the records of that stage
	local stage
	stage=$("$PY" -c 'import json,sys; print(sorted({json.loads(l)["stage"] for l in open("s.5")})[3])')
	vps-plan --transfers --rank 5 --stage "$stage" --format json ab.staged >one
	[ -s one ]
	"$PY" -c 'import json,sys; s=int(sys.argv[1]); a=[l for l in open("s.5") if json.loads(l)["stage"]==s]; assert a==open("one").readlines()' "$stage"
	# rank 5's own staged plan: the same records, its stages not cut yet,
	# its pieces numbered in its own plan
	vps-plan a.layout b.layout --rank 5 | vps-stage --budget 64KiB - | vps-plan --transfers --format json - >own
	sed 's/"stage":[0-9]*,/"stage":-1,/; s/,"piece":[0-9]*}$/}/' s.5 >a.json
	sed 's/,"piece":[0-9]*}$/}/' own | cmp - a.json
}

@test "queries: bad input exits 2 with 'tool: what', and writes nothing" {
	local L=(--model tiny-llama --parallel tp=2,pp=2)
	expect_status 2 vps-layout "${L[@]}" --tensor decoder.layers.0.mlp.nope.weight
	[[ "$output" == "vps-layout: tiny-llama has no tensor named 'decoder.layers.0.mlp.nope.weight'"* ]]
	expect_status 2 vps-layout "${L[@]}" --tensor 'decoder.layers.99.*'
	[ "$output" = "vps-layout: 'decoder.layers.99.*' matches no tensor of tiny-llama" ]
	local b
	for b in 0:4,x 4:2 1:2:3 '' 0:4, :4 0:281474976710657 0:1,0:1,0:1,0:1,0:1 -1:2; do
		expect_status 2 vps-layout "${L[@]}" --tensor output_layer.weight --box "$b"
		[[ "$output" == "vps-layout: --box: "* ]]
	done
	expect_status 2 vps-layout "${L[@]}" --tensor output_layer.weight --box 0:4
	[ "$output" = "vps-layout: a box of 1 axes, but output_layer.weight has 2" ]
	expect_status 2 vps-layout "${L[@]}" --tensor output_layer.weight --box 0:1001,0:1
	[[ "$output" == "vps-layout: box axis 0: 0:1001 is outside output_layer.weight, 0:1000" ]]
	expect_status 2 vps-layout "${L[@]}" --tensor '*final_layernorm*' --box 0:1,0:1
	[[ "$output" == "vps-layout: a box of 2 axes, and none of the 1 tensors"* ]]
	expect_status 2 vps-layout "${L[@]}" --tensor output_layer.weight --state momentum
	[[ "$output" == "vps-layout: --state: unknown state 'momentum'"* ]]
	expect_status 2 vps-layout "${L[@]}" --tensor output_layer.weight --state grad
	[ "$output" = "vps-layout: this layout holds no grad (grad=1 adds it)" ]
	expect_status 2 vps-layout "${L[@]}" --tensor output_layer.weight --format xml
	[ "${lines[0]}" = "vps-layout: --format: 'xml' is not yaml, tsv or json" ]
	[ "${lines[1]}" = "Try 'vps-layout -h' for more." ] && [ "${#lines[@]}" -eq 2 ]
	expect_status 2 vps-layout "${L[@]}" --box 0:1
	[ "${lines[0]}" = "vps-layout: --state, --box and --format go with --tensor" ]
	expect_status 2 vps-layout "${L[@]}" --tensor output_layer.weight --rank 0

	vps-layout "${L[@]}" >a.layout
	vps-layout --model tiny-llama --parallel tp=4 >b.layout
	vps-plan a.layout b.layout >ab.plan
	vps-plan a.layout b.layout --rank 1 >r1.plan
	vps-stage --budget 1MiB ab.plan >ab.staged
	vps-stage --budget 1MiB r1.plan >r1.staged
	expect_status 2 vps-plan --transfers ab.plan
	[ "$output" = "vps-plan: a global plan needs a rank (whose transfers)" ]
	expect_status 2 vps-plan --transfers a.layout b.layout
	[[ "$output" == "vps-plan: --transfers needs --rank R"* ]]
	expect_status 2 vps-plan --transfers --rank 2 r1.plan
	[ "$output" = "vps-plan: rank 2, but the plan holds world rank 1's part only" ]
	expect_status 2 vps-plan --transfers --rank 4 ab.plan
	[ "$output" = "vps-plan: rank 4 is outside the world of 4 ranks" ]
	expect_status 2 vps-plan --transfers --rank 0 --peer 4 ab.plan
	[ "$output" = "vps-plan: peer 4 is outside the world of 4 ranks" ]
	expect_status 2 vps-plan --transfers --rank 0 --tensor 'nope*' ab.plan
	[ "$output" = "vps-plan: 'nope*' matches no tensor of tiny-llama" ]
	expect_status 2 vps-plan --transfers --rank 0 --tensor nope a.layout b.layout
	[[ "$output" == "vps-plan: tiny-llama has no tensor named 'nope'"* ]]
	expect_status 2 vps-plan --transfers --rank 0 --stage 0 ab.plan
	[[ "$output" == "vps-plan: stage 0: a plan has no stages"* ]]
	expect_status 2 vps-plan --transfers --rank 0 --stage 100000 ab.staged
	[[ "$output" == "vps-plan: stage 100000: the staged plan has "*" stages (from 0)" ]]
	expect_status 2 vps-plan --transfers --stage 0 r1.staged
	[[ "$output" == "vps-plan: stage 0: this staged plan is not cut into stages yet"* ]]
	expect_status 2 vps-plan --transfers --rank 0 a.layout
	[ "$output" = "vps-plan: a.layout: a layout, not a plan or a staged plan (vps-plan and vps-stage make them)" ]
	expect_status 2 vps-plan a.layout b.layout --peer 1
	[ "${lines[0]}" = "vps-plan: --peer, --tensor, --state, --stage and --format go with --transfers" ]
	[ "${lines[1]}" = "Try 'vps-plan -h' for more." ] && [ "${#lines[@]}" -eq 2 ]
	expect_status 2 vps-plan a.layout b.layout --rank 0 --transfers --stats
	expect_status 2 vps-plan --transfers --rank 0 --format csv ab.plan
	[ "${lines[0]}" = "vps-plan: --format: 'csv' is not yaml, tsv or json" ]
	# nothing on standard output when the query fails
	expect_status 2 sh -c 'vps-plan --transfers --rank 0 --tensor nope ab.plan >out'
	[ ! -s out ]
	expect_status 2 sh -c 'vps-layout -i a.layout --tensor nope >out'
	[ ! -s out ]
}

@test "vps-plan --transfers: a staged plan whose copy is not in the pieces it names is refused with its file" {
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 >a.layout
	vps-layout --model tiny-llama --parallel tp=4,pp=1,dp=2,zero=1 >b.layout
	vps-plan a.layout b.layout --rank 0 | vps-stage --budget 64KiB --yaml - >ok.yaml
	expect_status 0 vps-plan --transfers --format json ok.yaml
	# a strided copy moved by one element, a flat copy's source by one
	local strided flat
	strided=$(awk '/^transfers:/ { t = 1 } t && /dst_strides: \[[0-9]+, / { print NR; exit }' ok.yaml)
	flat=$(awk '/^transfers:/ { t = 1 } t && /src_strides: \[1\]/ { print NR; exit }' ok.yaml)
	[ -n "$strided" ] && [ -n "$flat" ]
	awk -v n="$((strided - 1))" 'NR == n { sub(/[0-9]+$/, $2 + 1) } 1' ok.yaml >bad1.yaml
	awk -v n="$((flat - 1))" 'NR == n { sub(/[0-9]+$/, $2 + 1) } 1' ok.yaml >bad2.yaml
	! cmp -s ok.yaml bad1.yaml && ! cmp -s ok.yaml bad2.yaml
	expect_status 2 vps-plan --transfers bad1.yaml
	[[ "$output" == "vps-plan: bad1.yaml: transfer "*"not a part of the strided piece it names"* ]]
	expect_status 2 vps-plan --transfers bad2.yaml
	[[ "$output" == "vps-plan: bad2.yaml: transfer "*"its source is not that of the pieces at its destination"* ]]
}

@test "vps-plan --transfers names a transit area: transit in YAML and JSON, its number in TSV; a staged plan's records carry the plan's bytes" {
	# tiny-llama (tp=2, pp=2) -> (tp=1, pp=2), two GPUs a node, on
	# a800-testbed: rank 0 takes in part of what rank 1 needs, and passes it on
	vps-layout -q --model tiny-llama --parallel tp=2,pp=2,dp=1 --gpus-per-node 2 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=1,pp=2,dp=1 --gpus-per-node 2 -o b.layout
	vps-plan -q --topology a800-testbed a.layout b.layout -o ab.plan
	vps-stage -q --budget 64MiB ab.plan -o ab.staged
	vps-plan --transfers --rank 0 --format tsv ab.plan >r0.tsv
	vps-plan --transfers --rank 0 ab.plan >r0.yaml
	vps-plan --transfers --rank 0 --format json ab.plan >r0.json
	local n
	n=$(awk -F '\t' '$10 == 536870911' r0.tsv | wc -l)
	[ "$n" -gt 0 ]
	[ "$(grep -c ', dst_buffer: transit, ' r0.yaml)" -eq "$n" ]
	[ "$(grep -c '"dst_buffer":"transit",' r0.json)" -eq "$n" ]
	# the other records as before: numbers
	[ "$(grep -c ', dst_buffer: [0-9]*, ' r0.yaml)" -eq "$(awk -F '\t' 'NR > 1 && $10 != 536870911' r0.tsv | wc -l)" ]
	# rank 1 receives forwards out of rank 0's area (hop 1)
	vps-plan --transfers --rank 1 --format tsv ab.plan >r1.tsv
	n=$(awk -F '\t' '$8 == 536870911 && $14 == 1' r1.tsv | wc -l)
	[ "$n" -gt 0 ]
	[ "$(vps-plan --transfers --rank 1 ab.plan | grep -c 'src_buffer: transit, .* forward: 1, piece: [0-9]*}$')" -eq "$n" ]
	# the staged plan: every rank's records, in every format, and the
	# bytes each rank sends and receives are the plan's
	local r f
	for r in 0 1 2 3; do
		for f in yaml json; do
			vps-plan --transfers --rank $r --format $f ab.staged >/dev/null
		done
		[ "$(vps-plan --transfers --rank $r --format tsv ab.staged | awk -F '\t' 'NR > 1 { b[$2] += $7 } END { for (d in b) print d, b[d] }' | sort)" = \
		  "$(vps-plan --transfers --rank $r --format tsv ab.plan | awk -F '\t' 'NR > 1 { b[$2] += $7 } END { for (d in b) print d, b[d] }' | sort)" ]
	done
	vps-plan --transfers --rank 0 ab.staged | grep -q 'dst_buffer: transit'
}
