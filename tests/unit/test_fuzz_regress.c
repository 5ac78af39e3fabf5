/* Every input the fuzzers found (tests/fuzz/regress/NAME/), fixed since,
 * run through the same harness code as libFuzzer runs it, in every build:
 * `make check` and `make asan` need no clang. A harness aborts on what it
 * finds, so a regression fails this test by crashing, or under ASan by a
 * report. */
#include <dirent.h>

#include "harness.h"

#define LLVMFuzzerInitialize fuzz_yaml_init
#define LLVMFuzzerTestOneInput fuzz_yaml_one
#include "../fuzz/fuzz_yaml.c"
#undef LLVMFuzzerInitialize
#undef LLVMFuzzerTestOneInput

#define LLVMFuzzerTestOneInput fuzz_binary_one
#include "../fuzz/fuzz_binary.c"
#undef LLVMFuzzerTestOneInput

#define LLVMFuzzerInitialize fuzz_registry_init
#define LLVMFuzzerTestOneInput fuzz_registry_one
#include "../fuzz/fuzz_registry.c"
#undef LLVMFuzzerInitialize
#undef LLVMFuzzerTestOneInput

static size_t run_dir(const char *name, int (*one)(const uint8_t *, size_t))
{
	char dir[256], path[512];
	snprintf(dir, sizeof(dir), "tests/fuzz/regress/%s", name);
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	if (!d)
		return 0;
	size_t n = 0;
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		struct vps_bytes b;
		CHECK_OK(vps_read_file(path, &b));
		fprintf(stderr, "  %s\n", path);
		one(b.data, b.len);
		vps_bytes_release(&b);
		n++;
	}
	closedir(d);
	return n;
}

TEST(yaml_regressions)
{
	fuzz_yaml_init(NULL, NULL);
	CHECK(run_dir("yaml", fuzz_yaml_one) > 0);
}

TEST(binary_regressions)
{
	CHECK(run_dir("binary", fuzz_binary_one) > 0);
}

TEST(registry_regressions)
{
	fuzz_registry_init(NULL, NULL);
	CHECK(run_dir("registry", fuzz_registry_one) > 0);
}
