#!/usr/bin/env bats
# vps-plan --svg: the traffic heatmap and per-rank bars, plain SVG that a
# renderer draws (rsvg-convert, librsvg2-bin: make check installs it), checked
# against the plan's own numbers.

load helpers

# Render an SVG to PNG and print "WIDTH HEIGHT PAINTED COLOURS": the PNG's
# size, its pixels that are not the white background, its distinct colours.
render() { # SVG PNG
	command -v rsvg-convert >/dev/null || { echo "rsvg-convert is missing: make check-deps installs it (librsvg2-bin)" >&2; return 1; }
	rsvg-convert "$1" -o "$2"
	"$PY" - "$2" <<-'EOF'
		import sys
		from PIL import Image
		im = Image.open(sys.argv[1]).convert("RGB")
		px = im.getdata()
		painted = sum(1 for p in px if p != (255, 255, 255))
		print(im.width, im.height, painted, len(set(px)))
	EOF
}
# Whether a file is well-formed XML (a renderer may forgive what a browser
# refuses).
well_formed() { # SVG
	"$PY" -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$1"
}
# The width or height attribute of the <svg> element.
svg_attr() { # SVG NAME
	grep -m1 -o "<svg [^>]*" "$1" | grep -o " $2=\"[0-9]*\"" | tr -dc 0-9
}

@test "a plan's traffic renders: the PNG has the SVG's size and is painted, viridis to the top colour" {
	vps-plan --transition llama2-7b-s1-s2 --svg t.svg -q
	well_formed t.svg
	read -r w h painted colours < <(render t.svg t.png)
	[ "$w" = "$(svg_attr t.svg width)" ] && [ "$h" = "$(svg_attr t.svg height)" ]
	[ "$w" -ge 600 ] && [ "$h" -ge 400 ]
	# a good part is drawn (cells, bars, legend), in many colours
	[ "$painted" -gt $((w * h / 5)) ] || { echo "$painted of $((w * h)) pixels painted" >&2; return 1; }
	[ "$colours" -ge 64 ]
	# the largest cell and the legend's top are the scale's last colour
	"$PY" -c '
import sys
from PIL import Image
im = Image.open("t.png").convert("RGB")
sys.exit(0 if (0xfd, 0xe7, 0x25) in set(im.getdata()) else 1)'
}

@test "the cells are the plan's pairs, the bars its loads, the node boundary where the nodes change" {
	vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2,zero=1 -q -o a.layout
	vps-layout --model tiny-llama --parallel tp=4,pp=1,dp=2,zero=1 --gpus-per-node 4 -q -o b.layout
	vps-plan a.layout b.layout --svg t.svg --yaml -o p.yaml -q
	# one cell (with its tooltip) per (source, destination) pair that moves bytes
	pairs=$(awk '/^- src: / { s = $3 } /^  dst: / { if (s != $2) print s, $2 }' p.yaml | sort -u | wc -l)
	cells=$(grep -c '<title>rank [0-9]* &#8594; rank [0-9]*: ' t.svg)
	[ "$pairs" -gt 0 ] && [ "$cells" = "$pairs" ] || { echo "$cells cells, $pairs pairs" >&2; return 1; }
	# the sent bars, in rank order, scale as --stats --load's send column
	vps-plan a.layout b.layout --stats --load > load.txt
	awk -F'[:,}]' '/^  - \{rank/ { print $4 + 0, $6 + 0 }' load.txt > sr.txt
	grep -o '<rect [^>]*fill="#1f77b4"/>' t.svg | grep -o 'y="[0-9]*" width="[0-9.]*"' |
		tr -dc '0-9. \n' | sort -n | awk '{ print $2 }' > bars.txt
	paste -d' ' <(awk '$1 > 0 { print $1 }' sr.txt) bars.txt |
		awk -v max="$(awk '{ m = $1 > m ? $1 : m; m = $2 > m ? $2 : m } END { print m }' sr.txt)" '
			{ want = 120 * $1 / max; if ($2 == "" || want - $2 > 0.06 || $2 - want > 0.06) { print "bar " NR ": " $2 " for " want; bad = 1 } }
			END { exit bad }'
	[ "$(wc -l < bars.txt)" = "$(awk '$1 > 0' sr.txt | wc -l)" ]
	# node boundaries: the 4 devices b adds sit on node 1 (world ranks 8-11): one line each way
	[ "$(grep -c '<line ' <(sed -n '/stroke="#d62728" stroke-width/,/<\/g>/p' t.svg))" = 2 ]
	# no retain is drawn: the diagonal's cells are absent
	! grep -q '<title>rank \([0-9]*\) &#8594; rank \1: ' t.svg
}

@test "a world of more than 256 ranks is drawn in blocks: at most 256 by 256 cells, and it renders" {
	vps-layout --model tiny-llama --parallel tp=2,dp=300,zero=1 -q -o a.layout
	vps-layout --model tiny-llama --parallel tp=4,dp=150,zero=1 --first-node 10 -q -o b.layout
	vps-plan a.layout b.layout --svg big.svg -q
	grep -q '680 world ranks; .* moved between ranks; cells of 3 x 3 ranks' big.svg
	# every cell lies inside the map of 227 cells of 2 pixels (x from 72, y from 104)
	grep -o '<rect x="[0-9]*" y="[0-9]*" width="[0-9]*" height="2" fill="#[0-9a-f]*"/>' big.svg |
		awk -F'"' '$2 < 72 || $4 < 104 || $2 + $6 > 72 + 454 || $4 + 2 > 104 + 454 { print; bad = 1 } END { exit bad }'
	[ "$(stat -c %s big.svg)" -lt 2000000 ]
	grep -q 'too close to draw' big.svg
	well_formed big.svg
	read -r w h painted colours < <(render big.svg big.png)
	[ "$w" = "$(svg_attr big.svg width)" ] && [ "$painted" -gt 10000 ]
}

@test "--svg: alone, with -o, with --stats, to standard output; not with --rank" {
	vps-layout --model tiny-llama --parallel tp=2 --gpus-per-node 2 -q -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2 --gpus-per-node 2 -q -o b.layout
	# alone: the picture, no plan on standard output, the summary on standard error
	vps-plan a.layout b.layout --svg t.svg > out 2> err
	[ ! -s out ]
	[[ "$(cat err)" == "plan: "*" moved, the lower bound; busiest device "* ]]
	head -c 5 t.svg | grep -q '<?xml'
	# with -o: both
	vps-plan a.layout b.layout --svg t2.svg -o ab.plan -q
	cmp t.svg t2.svg
	vps-verify -q ab.plan
	# with --stats: both
	vps-plan a.layout b.layout --svg t3.svg --stats > st
	grep -q '^bytes_moved: ' st
	cmp t.svg t3.svg
	# to standard output
	vps-plan a.layout b.layout --svg - -q | cmp - t.svg
	expect_status 2 vps-plan a.layout b.layout --svg r.svg --rank 1
	[ "${lines[0]}" = "vps-plan: --svg draws a global plan's traffic: it does not go with --rank" ]
	[ ! -e r.svg ]
	expect_status 2 vps-plan a.layout b.layout --svg same -o same
	[ ! -e same ]
}

@test "docs/traffic.svg is what scripts/traffic-svg.sh draws now" {
	VPS_BIN=$VPS_BIN "$TOP/scripts/traffic-svg.sh" "$PWD/t.svg"
	cmp t.svg "$TOP/docs/traffic.svg"
	grep -q 'docs/traffic.svg' "$TOP/README.md"
}

@test "a transition's name with XML's special characters stays text" {
	grep -v '^name:' "$TOP/configs/transitions/gpt3-1.3b-tp-up.yaml" > odd.yaml
	echo 'name: "tp <up> & \"back\""' >> odd.yaml
	vps-plan --transition ./odd.yaml --svg t.svg -q
	well_formed t.svg
	grep -q 'tp &lt;up&gt; &amp; &quot;back&quot;; ' t.svg
}
