#include <errno.h>
#include <stdio.h>

#include "util/internal.h"

static _Thread_local char last_error[2048];

const char *vps_strerror(vps_result_t rc)
{
	switch (rc) {
	case VPS_OK: return "success";
	case VPS_EINPUT: return "invalid input";
	case VPS_ECHECK: return "check failed";
	case VPS_ESYS: return "system error";
	case VPS_ENOMEM: return "out of memory";
	case VPS_EFORMAT: return "bad file format";
	case VPS_ECUDA: return "CUDA error";
	case VPS_ENCCL: return "NCCL error";
	case VPS_ETIMEOUT: return "timed out";
	case VPS_EPEER: return "peer failed";
	case VPS_EUNSUPPORTED: return "not supported by this build";
	case VPS_ENOTFOUND: return "not found";
	case VPS_ESTALE: return "stale: its owner is gone";
	case VPS_EBUSY: return "in use by another process";
	case VPS_EINTERNAL: return "internal error (a bug in vps)";
	}
	return "unknown error";
}

const char *vps_result_name(vps_result_t rc)
{
	switch (rc) {
	case VPS_OK: return "VPS_OK";
	case VPS_EINPUT: return "VPS_EINPUT";
	case VPS_ECHECK: return "VPS_ECHECK";
	case VPS_ESYS: return "VPS_ESYS";
	case VPS_ENOMEM: return "VPS_ENOMEM";
	case VPS_EFORMAT: return "VPS_EFORMAT";
	case VPS_ECUDA: return "VPS_ECUDA";
	case VPS_ENCCL: return "VPS_ENCCL";
	case VPS_ETIMEOUT: return "VPS_ETIMEOUT";
	case VPS_EPEER: return "VPS_EPEER";
	case VPS_EUNSUPPORTED: return "VPS_EUNSUPPORTED";
	case VPS_ENOTFOUND: return "VPS_ENOTFOUND";
	case VPS_ESTALE: return "VPS_ESTALE";
	case VPS_EBUSY: return "VPS_EBUSY";
	case VPS_EINTERNAL: return "VPS_EINTERNAL";
	}
	return NULL;
}

const char *vps_version(void) { return VPS_VERSION_STRING; }

int vps_version_number(void) { return VPS_VERSION_NUMBER; }

const char *vps_last_error(void) { return last_error; }

void vps_clear_error(void) { last_error[0] = '\0'; }

vps_result_t vps_fail(vps_result_t rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return rc;
}

vps_result_t vps_fail_errno(const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n < sizeof(last_error))
		snprintf(last_error + n, sizeof(last_error) - (size_t)n, ": %s", strerror(saved));
	return VPS_ESYS;
}

void vps_error_prefix(const char *fmt, ...)
{
	char old[sizeof(last_error)];
	va_list ap;
	memcpy(old, last_error, sizeof(old));
	va_start(ap, fmt);
	int n = vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n + 3 >= sizeof(last_error))
		return;
	last_error[n] = ':';
	last_error[n + 1] = ' ';
	size_t room = sizeof(last_error) - (size_t)n - 2;
	size_t len = strlen(old);
	if (len >= room)
		len = room - 1;
	memcpy(last_error + n + 2, old, len);
	last_error[n + 2 + len] = '\0';
}

void vps_error_suffix(const char *fmt, ...)
{
	size_t n = strlen(last_error);
	if (n + 3 >= sizeof(last_error))
		return;
	memcpy(last_error + n, "; ", 3);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error + n + 2, sizeof(last_error) - n - 2, fmt, ap);
	va_end(ap);
}

vps_result_t vps_opts_check(const void *opts, unsigned int version, unsigned int known, const char *type,
			    const char *init)
{
	if (!opts)
		return vps_fail(VPS_EINPUT, "no %s (start from %s)", type, init);
	if (version == 0)
		return vps_fail(VPS_EINPUT, "%s of version 0: its version was never set (start from %s)", type, init);
	if (version > known)
		return vps_fail(VPS_EINPUT, "%s of version %u: this libvps (%s) knows versions 1 to %u; the program was "
				"built against newer headers", type, version, VPS_VERSION_STRING, known);
	return VPS_OK;
}

void *vps_malloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		VPS_NOMEM();
	return p;
}

void *vps_calloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		VPS_NOMEM();
	return p;
}

void *vps_realloc_array(void *p, size_t n, size_t size)
{
	if (size && n > SIZE_MAX / size) {
		VPS_NOMEM();
		return NULL;
	}
	size_t bytes = n * size;
	void *q = realloc(p, bytes ? bytes : 1);
	if (!q)
		VPS_NOMEM();
	return q;
}

char *vps_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = vps_malloc(n);
	if (p)
		memcpy(p, s, n);
	return p;
}

vps_result_t vps_grow(void **arr, size_t *cap, size_t need, size_t esz)
{
	if (need <= *cap)
		return VPS_OK;
	size_t ncap = *cap ? *cap : 16;
	while (ncap < need)
		ncap *= 2;
	void *p = vps_realloc_array(*arr, ncap, esz);
	if (!p)
		return VPS_ENOMEM;
	*arr = p;
	*cap = ncap;
	return VPS_OK;
}

int64_t vps_gcd(int64_t a, int64_t b)
{
	while (b) {
		int64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

int64_t vps_lcm(int64_t a, int64_t b) { return a / vps_gcd(a, b) * b; }

int vps_int64_cmp(const void *p, const void *q)
{
	int64_t x = *(const int64_t *)p, y = *(const int64_t *)q;
	return (x > y) - (x < y);
}
