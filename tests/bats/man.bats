#!/usr/bin/env bats
# The man pages: they render without a warning, each tool has one, and it
# documents exactly the options the tool has.

load helpers

# The text of a roff source with the escapes that can sit inside an option
# name removed: \- is -, font changes and \& \% \| \^ go.
plain() {
	sed -e 's/\\-/-/g' -e 's/\\f\[[^]]*\]//g' -e 's/\\f(..//g' -e 's/\\f.//g' \
		-e 's/\\[&%|^]//g'
}

# Lines of section $2 of page $1 (".SH NAME" or ".SH \"NAME\""), plain.
section() {
	awk -v want="$2" '
		/^\.SH/ { s = $0; sub(/^\.SH[ \t]+/, "", s); gsub(/"/, "", s); on = (s == want); next }
		on' "$1" | plain
}

# The tags of the entries of section OPTIONS (the line after each .TP),
# one entry per line, plain.
option_tags() {
	awk '
		/^\.SH/ { s = $0; sub(/^\.SH[ \t]+/, "", s); gsub(/"/, "", s); on = (s == "OPTIONS"); tag = 0; next }
		on && tag { print; tag = 0; next }
		on && /^\.TP/ { tag = 1 }' "$1" | plain
}

# The options named in standard input: -x or --word after the start of a
# line, a blank, a bracket, a bar, a quote or a parenthesis. Not the - of
# "vps-layout" or of "5-7".
options_in() {
	grep -oE '(^|[][[:space:]|"(])--?[A-Za-z][A-Za-z0-9-]*' | sed -E 's/^[^-]+//' | sort -u
}

# Every tool, by its source in cmd/.
tools() {
	local c
	for c in "$TOP"/cmd/vps-*.c; do
		[ -e "$c" ] || continue
		c=${c##*/}
		echo "${c%.c}"
	done
}

@test "every man page renders with groff -ww without a warning" {
	local f err n=0
	for f in "$TOP"/man/*.[157]; do
		[ -e "$f" ] || continue
		n=$((n + 1))
		if ! err=$(groff -ww -man -Tutf8 "$f" 2>&1 >/dev/null) || [ -n "$err" ]; then
			echo "${f#"$TOP"/}: groff -ww -man -Tutf8 says:" >&2
			echo "$err" >&2
			return 1
		fi
	done
	[ "$n" -ge 4 ] || { echo "only $n man pages in man/" >&2; return 1; }
}

@test "every tool in cmd/ has a man page in section 1" {
	local t n=0
	for t in $(tools); do
		n=$((n + 1))
		[ -f "$TOP/man/$t.1" ] || { echo "cmd/$t.c has no man/$t.1" >&2; return 1; }
	done
	[ "$n" -ge 2 ] || { echo "no tools found in cmd/" >&2; return 1; }
}

@test "every option of a tool's -h is in its page's SYNOPSIS and has an OPTIONS entry" {
	local t page help synopsis tags opt bad=0
	for t in $(tools); do
		page=$TOP/man/$t.1
		[ -f "$page" ] || continue
		help=$("$t" -h) || { echo "$t -h failed" >&2; return 1; }
		synopsis=$(section "$page" SYNOPSIS | options_in)
		tags=$(option_tags "$page" | options_in)
		[ -n "$(options_in <<<"$help")" ] || { echo "$t -h names no option" >&2; return 1; }
		for opt in $(options_in <<<"$help"); do
			if ! grep -qxF -- "$opt" <<<"$synopsis"; then
				echo "man/$t.1: $opt (in $t -h) is missing from SYNOPSIS" >&2
				bad=1
			fi
			if ! grep -qxF -- "$opt" <<<"$tags"; then
				echo "man/$t.1: $opt (in $t -h) has no entry in OPTIONS" >&2
				bad=1
			fi
		done
	done
	[ "$bad" -eq 0 ]
}

@test "every option a page documents exists in its tool's -h, and the tool accepts it" {
	local t page help helpopts entry opts opt found out bad=0
	for t in $(tools); do
		page=$TOP/man/$t.1
		[ -f "$page" ] || continue
		help=$("$t" -h)
		helpopts=$(options_in <<<"$help")
		[ -n "$(option_tags "$page" | options_in)" ] || { echo "man/$t.1: OPTIONS documents no option" >&2; return 1; }
		while IFS= read -r entry; do
			opts=$(options_in <<<"$entry")
			[ -n "$opts" ] || continue # a value such as tp=N inside an entry
			found=0
			for opt in $opts; do
				grep -qxF -- "$opt" <<<"$helpopts" && found=1
				# an option the tool's table does not have, even where -h names it
				out=$("$t" "$opt" </dev/null 2>&1) || true
				if grep -qE "^$t: (unknown option|.* is ambiguous)" <<<"$out"; then
					echo "man/$t.1: $t does not accept $opt: $out" >&2
					bad=1
				fi
			done
			[ "$found" -eq 1 ] && continue
			# -h and --version print the usage and the version rather than
			# list themselves: check that they do
			for opt in $opts; do
				case $opt in
				-h | --help)
					out=$("$t" "$opt") && [ "$out" = "$help" ] && continue
					echo "man/$t.1: $t $opt does not print the -h text" >&2 ;;
				--version)
					out=$("$t" "$opt") && [[ "$out" == "$t "[0-9]* ]] && continue
					echo "man/$t.1: $t $opt does not print '$t VERSION'" >&2 ;;
				*)
					echo "man/$t.1: OPTIONS documents $opt, which $t -h does not name" >&2 ;;
				esac
				bad=1
			done
		done < <(option_tags "$page")
	done
	[ "$bad" -eq 0 ]
}

@test "every vps page a man page refers to exists" {
	local f ref bad=0
	for f in "$TOP"/man/*.[157]; do
		[ -e "$f" ] || continue
		# .BR vps\-layout (1) and vps\-layout(1) alike
		for ref in $(plain <"$f" | sed -E 's/^\.[A-Z]+ +//; s/" *"//g; s/ +\(/(/g' |
			grep -oE '\bvps(-[a-z]+)*\([1-9]\)' | sort -u); do
			local name=${ref%%(*} sec=${ref##*(}
			sec=${sec%)}
			if [ ! -f "$TOP/man/$name.$sec" ]; then
				echo "${f#"$TOP"/}: refers to $ref, which is not in man/" >&2
				bad=1
			fi
		done
	done
	[ "$bad" -eq 0 ]
}

@test "every page in section 1 has NAME, SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS, EXAMPLES and SEE ALSO, in that order" {
	local f have want bad=0
	want="NAME SYNOPSIS DESCRIPTION OPTIONS EXIT_STATUS EXAMPLES SEE_ALSO"
	for f in "$TOP"/man/*.1; do
		[ -e "$f" ] || continue
		# the required sections among those the page has, in its order
		have=$(awk '/^\.SH/ { s = $0; sub(/^\.SH[ \t]+/, "", s); gsub(/"/, "", s); gsub(/ /, "_", s); print s }' "$f" |
			grep -xE 'NAME|SYNOPSIS|DESCRIPTION|OPTIONS|EXIT_STATUS|EXAMPLES|SEE_ALSO' | tr '\n' ' ')
		if [ "${have% }" != "$want" ]; then
			echo "${f#"$TOP"/}: sections $have, expected $want" >&2
			bad=1
		fi
	done
	[ "$bad" -eq 0 ]
}

@test "vps(7) lists every other page in its SEE ALSO" {
	local f name see bad=0
	see=$(section "$TOP/man/vps.7" "SEE ALSO" | sed -E 's/^\.[A-Z]+ +//; s/" *"//g; s/ +\(/(/g')
	for f in "$TOP"/man/*.[15]; do
		[ -e "$f" ] || continue
		name=${f##*/}
		name="${name%.*}(${name##*.})"
		if ! grep -qF -- "$name" <<<"$see"; then
			echo "man/vps.7: SEE ALSO does not list $name" >&2
			bad=1
		fi
	done
	[ "$bad" -eq 0 ]
}

@test "vps(7) FILES names every model, transition and topology of configs/, and names no other" {
	local files kind f name bad=0
	files=$(section "$TOP/man/vps.7" FILES | sed -E 's/^\.[A-Z]+ +//')
	for kind in models transitions topologies; do
		for f in "$TOP"/configs/"$kind"/*.yaml; do
			name=${f##*/}
			name=${name%.yaml}
			grep -qwF -- "$name" <<<"$files" || { echo "man/vps.7 FILES does not name $kind/$name" >&2; bad=1; }
		done
	done
	# what the entries name in bold (.B, .BR) and look like configs: each exists
	for name in $(awk '/^\.SH/ { s = $0; sub(/^\.SH[ \t]+/, "", s); on = (s == "FILES"); next }
			on && /^\.BR? / { sub(/^\.BR? +/, ""); print $1 }' "$TOP/man/vps.7" | plain | tr -d ',' |
			grep -E '^[a-z0-9.]+(-[a-z0-9.]+)+$' | grep -v '^vps-'); do
		ls "$TOP"/configs/*/"$name".yaml >/dev/null 2>&1 || { echo "man/vps.7 FILES names $name, which configs/ has not" >&2; bad=1; }
	done
	[ "$bad" -eq 0 ]
}

@test "vps(7) EXIT STATUS lists every status a tool's page lists" {
	local f st bad=0 seven
	statuses() { awk '/^\.SH/ { s = $0; sub(/^\.SH[ \t]+/, "", s); gsub(/"/, "", s); on = (s == "EXIT STATUS"); next }
		on && prev ~ /^\.TP/ && /^\.B [0-9]+$/ { print $2 } { prev = $0 }' "$1" | sort -u; }
	seven=$(statuses "$TOP/man/vps.7")
	for f in "$TOP"/man/*.1; do
		for st in $(statuses "$f"); do
			grep -qx "$st" <<<"$seven" || { echo "man/vps.7 EXIT STATUS omits $st (man/${f##*/})" >&2; bad=1; }
		done
	done
	[ "$bad" -eq 0 ]
}
