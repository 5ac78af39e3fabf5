#!/usr/bin/env bats
# The library as a C or C++ program uses it: vps/vps.h is the whole API,
# every header compiles alone in C and in strict C++, make install puts a
# versioned libvps.so with its SONAME, and a C program and a C++ one
# (tests/cxx/api.cc) built with `pkg-config --cflags --libs vps` run from the
# temporary prefix.

load helpers

# The functions (not the static inline ones) that the headers in $1 declare,
# one a line, from gcc's own list of the prototypes it saw (-aux-info).
declared() {
	local h
	for h in "$1"/vps/*.h; do echo "#include <vps/${h##*/}>"; done > all.c
	cc -std=c11 -I"$1" -aux-info all.aux -c all.c -o all.o || return 1
	grep -E "^/\* [^ ]*/vps/[a-z_]+\.h:[0-9]+:NC \*/ extern " all.aux |
		sed -E 's/.*[ *](vps_[a-z0-9_]+) \(.*/\1/' | sort -u
}

# A program that includes vps/vps.h alone and takes the address of every
# function in $@, so that compiling it needs each declared and linking it
# each exported; it then computes a layout from the model file $MODEL.
program() {
	{
		echo '#include <vps/vps.h>'
		echo '#include <stdio.h>'
		echo '#include <stdint.h>'
		echo 'static volatile uintptr_t sink;'
		echo 'int main(void) {'
		local f
		for f in "$@"; do echo "	sink ^= (uintptr_t)&$f;"; done
		cat <<'EOF'
	struct vps_model m;
	struct vps_parallel p;
	struct vps_devices d = {.packed = true, .gpus_per_node = 8};
	vps_parallel_init(&p);
	struct vps_layout *l = NULL;
	if (vps_model_load(&m, MODEL, NULL) || vps_parallel_parse(&p, "tp=2,dp=2,zero=1", "--parallel") ||
	    vps_layout_new(&l, &m, &p, &d, "prog")) {
		fprintf(stderr, "%s\n", vps_last_error());
		return 1;
	}
	printf("vps %s: %s: %lld ranks\n", VPS_VERSION_STRING, vps_layout_model(l)->name,
	       (long long)vps_layout_world(l));
	vps_layout_free(l);
	return 0;
}
EOF
	} > prog.c
}

@test "vps/vps.h alone declares every function of every header, and each header compiles alone, in C and C++" {
	local h fns
	for h in "$TOP"/include/vps/*.h; do
		printf '#include <vps/%s>\n' "${h##*/}" > one.c
		cc -std=c11 -Wall -Wextra -Werror -I"$TOP/include" -c one.c -o one.o ||
			{ echo "vps/${h##*/} does not compile alone" >&2; return 1; }
		c++ -std=c++11 -Wall -Wextra -Werror -pedantic -x c++ -I"$TOP/include" -c one.c -o one.o ||
			{ echo "vps/${h##*/} does not compile alone as C++" >&2; return 1; }
		grep -qx "#include \"vps/${h##*/}\"" "$TOP/include/vps/vps.h" || [ "${h##*/}" = vps.h ] ||
			{ echo "vps/vps.h does not include vps/${h##*/}" >&2; return 1; }
	done
	fns=$(declared "$TOP/include")
	# every header declares something, base.h to verify.h
	[ "$(wc -l <<<"$fns")" -ge 100 ]
	grep -qx vps_strerror <<<"$fns"
	grep -qx vps_registry_open <<<"$fns" || grep -qx vps_registry_create <<<"$fns"
	# shellcheck disable=SC2086
	program $fns
	cc -std=c11 -Wall -Wextra -Werror -Werror=implicit-function-declaration -DMODEL='"x"' \
		-I"$TOP/include" -c prog.c -o prog.o
}

@test "make install: libvps.so.VERSION with its SONAME; pkg-config --libs vps builds a program that runs; make uninstall" {
	# the plain build, even under make asan (helpers.bash)
	plain_make -s install PREFIX="$PWD/inst" >/dev/null
	local version major fns
	version=$(sed -n 's/.*VPS_VERSION_STRING "\(.*\)"/\1/p' "$TOP/include/vps/base.h")
	major=${version%%.*}
	[ -f "inst/lib/libvps.so.$version" ] && [ ! -L "inst/lib/libvps.so.$version" ]
	[ "$(readlink "inst/lib/libvps.so.$major")" = "libvps.so.$version" ]
	[ "$(readlink inst/lib/libvps.so)" = "libvps.so.$major" ]
	readelf -d "inst/lib/libvps.so.$version" | grep -q "(SONAME) *Library soname: \[libvps.so.$major\]"
	[ "$(PKG_CONFIG_PATH=$PWD/inst/lib/pkgconfig pkg-config --modversion vps)" = "$version" ]

	# every function of the installed headers, through vps/vps.h alone
	fns=$(declared "$PWD/inst/include")
	[ "$(wc -l <<<"$fns")" -ge 100 ]
	# shellcheck disable=SC2086
	program $fns
	# shellcheck disable=SC2046
	cc -std=c11 -Wall -Wextra -Werror -DMODEL="\"$PWD/inst/share/vps/configs/models/tiny-llama.yaml\"" \
		-o prog prog.c $(PKG_CONFIG_PATH=$PWD/inst/lib/pkgconfig pkg-config --cflags --libs vps)
	# linked by the SONAME, found by the run path vps.pc gave it
	readelf -d prog | grep -q "(NEEDED) *Shared library: \[libvps.so.$major\]"
	cd /
	run env -u LD_LIBRARY_PATH "$BATS_TEST_TMPDIR/prog"
	echo "$output"
	[ "$status" -eq 0 ]
	[ "$output" = "vps $version: tiny-llama: 4 ranks" ]
	# the library it loaded is the installed one
	env -u LD_LIBRARY_PATH LD_TRACE_LOADED_OBJECTS=1 "$BATS_TEST_TMPDIR/prog" |
		grep -q "libvps.so.$major => $BATS_TEST_TMPDIR/inst/lib/libvps.so.$major"

	# a C++ program too: it links only through the headers' extern "C"
	cd "$BATS_TEST_TMPDIR"
	# shellcheck disable=SC2046
	c++ -std=c++11 -Wall -Wextra -Werror -pedantic -o cxxprog "$TOP/tests/cxx/api.cc" \
		$(PKG_CONFIG_PATH=$PWD/inst/lib/pkgconfig pkg-config --cflags --libs vps)
	cd /
	run env -u LD_LIBRARY_PATH "$BATS_TEST_TMPDIR/cxxprog" "$BATS_TEST_TMPDIR/inst/share/vps/configs/models/tiny-llama.yaml"
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == "vps $version: tiny-llama: "*" pieces, "*" stages; verify: VPS_OK: tiny-llama: "* ]]
	# the installed executor has no fault injection (docs/exec.md): VPS_FAULT
	# is not even a name it reads
	! strings -a "$BATS_TEST_TMPDIR/inst/bin/vps-exec" | grep -qx VPS_FAULT

	# and make uninstall takes the three names away
	cd "$BATS_TEST_TMPDIR"
	plain_make -s uninstall PREFIX="$PWD/inst" >/dev/null
	run ls inst/lib
	[[ "$output" != *libvps* ]]
	[ ! -e inst/lib/pkgconfig/vps.pc ]
}
