#!/usr/bin/env bash
# Make (or bring up to date) the test environment: a virtual environment
# with exactly the packages of a pinned requirements file, for the Python
# tests, the PyTorch example and the framework checks (make venv).
#
#   scripts/venv.sh DIR REQUIREMENTS
#   scripts/venv.sh --check PYTHON REQUIREMENTS
#
# With --check, it only says whether PYTHON (an interpreter of the user's
# own, make check PYTHON=...) imports what the tests need.
#
# The environment is reused when it exists: pip installs only what differs
# from the file and what the file no longer lists is removed, so a changed
# pin costs one download, not a new environment. Packages come from PyPI
# through pip and its cache (~/.cache/pip); the system's Pythons are never
# written to. The base interpreter is VENV_PYTHON when set, otherwise the
# first Python 3.12 found: python3 on PATH, python3.12, pyenv's versions,
# /usr/local/bin and /usr/bin. Runs of make in one tree take turns on a lock.
# It says first what it installs and about how much that is on disk (an
# estimate: the large pins' sizes as measured in a fresh environment, 1 MB
# for any other), then shows pip's progress when standard output is a
# terminal and CI is unset; otherwise pip is quiet.
# Exit 0 when the environment imports what the tests need, 1 otherwise.
set -euo pipefail
export LC_ALL=C
me=venv.sh
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
[ $# -eq 2 ] || { echo "usage: $me [--check PYTHON | DIR] REQUIREMENTS" >&2; exit 2; }
dir=$1 reqs=$2
[ -r "$reqs" ] || { echo "$me: $reqs: cannot read" >&2; exit 1; }

# whether PYTHON imports every module the tests use
imports() { # PYTHON
	"$1" - "$reqs" <<-'EOF'
	import importlib, logging, sys, warnings
	warnings.simplefilter("ignore")
	logging.disable(logging.WARNING)
	missing = []
	for m in ("torch", "megatron.core", "transformers", "safetensors", "numpy", "yaml", "PIL", "pytest", "torchtitan", "spmd_types", "tyro"):
	    try:
	        importlib.import_module(m)
	    except Exception as e:  # an import error of any kind is a broken environment
	        missing.append("%s (%s)" % (m, e))
	if missing:
	    sys.exit("venv.sh: %s cannot import %s: pip install -r %s" % (sys.executable, "; ".join(missing), sys.argv[1]))
	EOF
}
if [ $check = 1 ]; then
	imports "$dir"
	exit
fi
# megatron-core 0.19 requires Python >= 3.12 and the file pins wheels built
# for 3.12 (cp312)
want=3.12

is_want() { # PYTHON: it runs, is $want and can make environments
	"$1" -c "import sys, venv, ensurepip; sys.exit('%d.%d' % sys.version_info[:2] != '$want')" >/dev/null 2>&1
}

find_python() {
	if [ -n "${VENV_PYTHON:-}" ]; then
		is_want "$VENV_PYTHON" || { echo "$me: VENV_PYTHON=$VENV_PYTHON is not a Python $want with venv" >&2; return 1; }
		echo "$VENV_PYTHON"
		return 0
	fi
	local c
	for c in python3 python$want "${PYENV_ROOT:-$HOME/.pyenv}"/versions/$want*/bin/python$want \
		/usr/local/bin/python$want /usr/bin/python$want; do
		if is_want "$c"; then
			command -v "$c"
			return 0
		fi
	done
	echo "$me: no Python $want found (megatron-core 0.19 needs >= 3.12; python3 here is" \
		"$(python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo missing))." >&2
	echo "$me: install one, name it with VENV_PYTHON=/path/to/python$want, or run the tests" \
		"with PYTHON=/path/to/python holding the packages of $reqs" >&2
	return 1
}

mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9

py=$dir/bin/python
# an environment of another Python, or one whose interpreter went away, is
# made again
if [ -e "$dir" ] && ! is_want "$py"; then
	echo "$me: $dir is not a working Python $want environment: making it again"
	rm -rf "$dir"
fi
start=$(date +%s)
if [ ! -e "$dir" ]; then
	base=$(find_python)
	echo "$me: making $dir with $base ($("$base" -c 'import sys; print(sys.version.split()[0])'))"
	"$base" -m venv "$dir"
fi
pip=("$py" -m pip --disable-pip-version-check --no-input)
install=(install --no-deps --only-binary=:all: --require-virtualenv)

# the file's pins (name==version, names normalized) and what the
# environment holds
norm() {
	sed -n 's/^\([A-Za-z0-9._-]*\)==\([^ ;#]*\).*/\1 \2/p' |
		awk '{ n = tolower($1); gsub(/[-_.]+/, "-", n); print n "==" $2 }' | sort -u
}
pending=$(comm -23 <(norm < "$reqs") <("${pip[@]}" freeze --exclude-editable | norm))

# Megabytes on disk of the pins that weigh (torch 2.11.0's CUDA build and
# what it links, as installed from python/requirements-test.txt); an
# estimate for another version, 1 MB for a pin not listed.
sizes() {
	cat <<-'EOF'
	torch 1136
	triton 669
	nvidia-cublas 597
	nvidia-cudnn-cu13 494
	nvidia-cufft 288
	nvidia-cusparselt-cu13 234
	nvidia-nccl-cu13 218
	nvidia-cusparse 163
	nvidia-curand 135
	nvidia-nvjitlink 99
	nvidia-nvshmem-cu13 81
	transformers 54
	numpy 53
	nvidia-cuda-cupti 45
	cuda-bindings 33
	sympy 27
	matplotlib 25
	fonttools 23
	pillow 20
	hf-xet 12
	tokenizers 12
	megatron-core 9
	nvidia-cuda-runtime 7
	networkx 7
	EOF
}

# "N packages, about X GB on disk (an estimate: torch 1.1 GB, NVIDIA's CUDA
# libraries 2.4 GB, ...)": the largest first, NVIDIA's together
cost() { # the pending pins, one a line
	awk 'NR == FNR { mb[$1] = $2; next }
	{
		split($0, p, "=="); name = p[1]; m = (name in mb) ? mb[name] : 1
		group = name ~ /^(nvidia|cuda)-/ ? "NVIDIA'"'"'s CUDA libraries" : name
		if (!(group in g)) order[++k] = group
		g[group] += m; total += m; n++
	}
	function size(m) { return m >= 1000 ? sprintf("%.1f GB", m / 1000) : sprintf("%d MB", m) }
	END {
		printf "%d package%s, about %s on disk (an estimate", n, n == 1 ? "" : "s", size(total)
		for (shown = 0; shown < 3; shown++) {
			best = ""
			for (i = 1; i <= k; i++) if (!(order[i] in said) && (best == "" || g[order[i]] > g[best])) best = order[i]
			if (best == "" || g[best] < 50) break
			said[best] = 1
			printf "%s %s %s", shown ? "," : ":", best, size(g[best])
		}
		printf ")"
	}' <(sizes) -
}

if [ -n "$pending" ]; then
	echo "$me: installing $(cost <<<"$pending") from PyPI or pip's cache (~/.cache/pip)"
fi
if [ -n "$pending" ] && [ -t 1 ] && [ -z "${CI:-}" ]; then
	# on a terminal, pip's own progress, for what is missing only (the file's
	# options lines too); the quiet pass below then finds it all in place
	only=$(mktemp)
	trap 'rm -f "$only"' EXIT
	{ grep -E '^[[:space:]]*-' "$reqs" || true; echo "$pending"; } > "$only"
	"${pip[@]}" "${install[@]}" --progress-bar on -r "$only"
fi
"${pip[@]}" "${install[@]}" --quiet --progress-bar off -r "$reqs"
# what the file no longer lists goes (pip and the environment's own tools
# stay); names as PEP 503 compares them, a package installed from a file
# ("name @ file:///...") by its name alone
names() { awk '{ n = tolower($1); gsub(/[-_.]+/, "-", n); print n }' | sort -u; }
extra=$(comm -23 <("${pip[@]}" freeze --exclude-editable | sed -e 's/==.*//' -e 's/ *@ .*//' | names) \
	<(sed -n 's/^\([A-Za-z0-9._-]*\)==.*/\1/p' "$reqs" | names))
if [ -n "$extra" ]; then
	echo "$me: removing what $reqs no longer lists:" $extra
	# shellcheck disable=SC2086
	"${pip[@]}" uninstall --quiet -y $extra
fi
imports "$py"
echo "$me: $dir ready ($(du -sh "$dir" | cut -f1), $(($(date +%s) - start)) s)"
