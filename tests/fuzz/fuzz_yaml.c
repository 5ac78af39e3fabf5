/* libFuzzer harness: every reader of a YAML document the tools accept.
 *
 * The first byte picks the reader, the rest is the file: layouts, plans,
 * staged plans and models (read from memory, then written and read back,
 * fuzz_common.h), and the configurations the tools only read from a path
 * (parallel configurations, device maps, topologies, budgets, transitions),
 * given a memfd's /proc path. The seeds (scripts/fuzz-corpus.sh) carry the
 * byte for the document they hold. */
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "vps/parallel.h"

enum { R_LAYOUT, R_PLAN, R_STAGED, R_MODEL, R_PARALLEL, R_DEVICES, R_TOPOLOGY, R_BUDGETS, R_TRANSITION, R_N };

static int memfd = -1;
static char memfd_path[64];
/* where transitions look for models and parallel configurations: only the
 * test models, so that an input cannot ask for a 70B layout per run */
static char model_path[4096], parallel_path[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	memfd = memfd_create("vps-fuzz-yaml", MFD_CLOEXEC);
	if (memfd < 0) {
		perror("memfd_create");
		abort();
	}
	snprintf(memfd_path, sizeof(memfd_path), "/proc/self/fd/%d", memfd);
	const char *dir = getenv("VPS_FUZZ_MODELS");
	snprintf(model_path, sizeof(model_path), "%s", dir ? dir : "build/fuzz/models");
	snprintf(parallel_path, sizeof(parallel_path), "%s", dir ? dir : "build/fuzz/models");
	return 0;
}

static bool to_file(const uint8_t *d, size_t n)
{
	if (ftruncate(memfd, 0) != 0)
		return false;
	return n == 0 || pwrite(memfd, d, n, 0) == (ssize_t)n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int which = data[0] % R_N;
	const uint8_t *d = data + 1;
	size_t n = size - 1;
	if (which <= R_MODEL) {
		fuzz_document((enum fuzz_doc)which, d, n);
		return 0;
	}
	if (!to_file(d, n))
		abort();
	switch (which) {
	case R_PARALLEL: {
		struct vps_parallel p;
		char hint[128];
		vps_parallel_init(&p);
		vps_parallel_load(&p, memfd_path, "", hint, sizeof(hint));
		break;
	}
	case R_DEVICES: {
		struct vps_devices dv;
		memset(&dv, 0, sizeof(dv));
		if (vps_devices_load(&dv, memfd_path) == VPS_OK) {
			vps_devices_validate(&dv, 64, "fuzz");
			vps_devices_release(&dv);
		}
		break;
	}
	case R_TOPOLOGY: {
		struct vps_topology t;
		vps_topology_load(&t, memfd_path, "");
		break;
	}
	case R_BUDGETS: {
		int64_t b;
		vps_budgets_load(memfd_path, &b);
		break;
	}
	case R_TRANSITION: {
		struct vps_transition info;
		struct vps_layout *a = NULL, *b = NULL;
		if (vps_transition_load(memfd_path, "", model_path, parallel_path, &info, &a, &b) == VPS_OK) {
			vps_layout_free(a);
			vps_layout_free(b);
		}
		break;
	}
	}
	return 0;
}
