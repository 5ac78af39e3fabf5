#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "util/internal.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const struct vps_cuda_api *loaded;
static char why[512];
static int init_device = -1;

static void *try_open(const char *path, char *tried, size_t n)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		size_t len = strlen(tried);
		snprintf(tried + len, n - len, "%s%s", len ? "; " : "", dlerror());
	}
	return h;
}

static void load(void)
{
	char tried[2048] = "";
	void *h = NULL;
	const char *env = getenv("VPS_CUDA_LIBRARY");
	if (env && *env) {
		h = try_open(env, tried, sizeof(tried));
	} else {
		/* beside libvps: the shared library, or the tool it is linked into */
		Dl_info info;
		char dir[PATH_MAX] = "";
		if (dladdr((void *)&vps_gpu_api, &info) && info.dli_fname) {
			snprintf(dir, sizeof(dir), "%s", info.dli_fname);
			/* a tool linked with libvps.a and started through PATH is
			 * named without a directory: ask the kernel where it is */
			if (!strchr(dir, '/')) {
				ssize_t n = readlink("/proc/self/exe", dir, sizeof(dir) - 1);
				dir[n > 0 ? n : 0] = '\0';
			}
			char *slash = strrchr(dir, '/');
			if (slash)
				*slash = '\0';
			else
				dir[0] = '\0';
		}
		static const char *const rel[] = {"", "/../lib", "/../build", "/.."};
		for (size_t i = 0; i < sizeof(rel) / sizeof(*rel) && !h && dir[0]; i++) {
			char path[PATH_MAX + 64];
			snprintf(path, sizeof(path), "%s%s/libvps-cuda.so", dir, rel[i]);
			h = try_open(path, tried, sizeof(tried));
		}
		if (!h)
			h = try_open("libvps-cuda.so", tried, sizeof(tried));
	}
	if (!h) {
		snprintf(why, sizeof(why), "GPU support is not available: libvps-cuda.so cannot be loaded (%.400s)", tried);
		return;
	}
	const struct vps_cuda_api *(*get)(void) = NULL;
	*(void **)&get = dlsym(h, "vps_cuda_api_get");
	const struct vps_cuda_api *a = get ? get() : NULL;
	if (!a || a->abi != VPS_CUDA_ABI) {
		snprintf(why, sizeof(why), "GPU support is not available: libvps-cuda.so is of another version (ABI %d, this "
			 "build needs %d)", a ? a->abi : -1, VPS_CUDA_ABI);
		dlclose(h);
		return;
	}
	loaded = a;
}

vps_result_t vps_gpu_api(const struct vps_cuda_api **api)
{
	pthread_mutex_lock(&lock);
	if (!loaded && !why[0])
		load();
	pthread_mutex_unlock(&lock);
	if (!loaded)
		return vps_fail(VPS_EUNSUPPORTED, "%s", why);
	*api = loaded;
	return VPS_OK;
}

vps_result_t vps_gpu_result(int code, const char *err, const char *what)
{
	vps_result_t rc = code == VPS_CUDA_ENCCL ? VPS_ENCCL
			  : code == VPS_CUDA_EINPUT ? VPS_EINPUT
			  : code == VPS_CUDA_ETIMEOUT ? VPS_ETIMEOUT
						     : VPS_ECUDA;
	return vps_fail(rc, "%s: %s", what, err);
}

vps_result_t vps_gpu_init(int device, int64_t local_rank, const struct vps_cuda_api **api)
{
	VPS_CHECK(vps_gpu_api(api));
	int n = 0;
	char err[VPS_CUDA_ERR] = "";
	if ((*api)->device_count(&n, err) || n == 0)
		return vps_fail(VPS_EUNSUPPORTED, "GPU support is not available: %s",
				err[0] ? err : "no usable GPU was found: CUDA sees none");
	if (device < 0)
		device = (int)((local_rank > 0 ? local_rank : 0) % n);
	pthread_mutex_lock(&lock);
	int rc = init_device == device ? 0 : (*api)->init(device, err);
	if (!rc)
		init_device = device;
	pthread_mutex_unlock(&lock);
	if (rc)
		return vps_gpu_result(rc, err, "GPU");
	return VPS_OK;
}
