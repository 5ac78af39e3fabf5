/* Private helpers shared by the libvps modules: error recording and the
 * check macros that carry an error up through one cleanup label. */
#ifndef VPS_INTERNAL_H
#define VPS_INTERNAL_H

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "vps/vps.h"

#if defined(__GNUC__)
#define VPS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define VPS_PRINTF(a, b)
#endif

/* Record a message as the thread's last error and return rc. */
vps_result_t vps_fail(vps_result_t rc, const char *fmt, ...) VPS_PRINTF(2, 3);
/* Same, appending ": strerror(errno)". */
vps_result_t vps_fail_errno(const char *fmt, ...) VPS_PRINTF(1, 2);
/* Prefix the current last error with "prefix: " (context added on the way up). */
void vps_error_prefix(const char *fmt, ...) VPS_PRINTF(1, 2);

#define VPS_CHECK(call)                                                      \
	do {                                                                 \
		vps_result_t vps_check_rc_ = (call);                         \
		if (vps_check_rc_ != VPS_OK)                                 \
			return vps_check_rc_;                                \
	} while (0)

#define VPS_CHECK_GOTO(call, rc, label)                                      \
	do {                                                                 \
		(rc) = (call);                                               \
		if ((rc) != VPS_OK)                                          \
			goto label;                                          \
	} while (0)

#define VPS_NOMEM() vps_fail(VPS_ENOMEM, "out of memory (%s:%d)", __FILE__, __LINE__)

/* Allocation helpers that record VPS_ENOMEM. */
void *vps_malloc(size_t n);
void *vps_calloc(size_t n, size_t size);
void *vps_realloc_array(void *p, size_t n, size_t size);
char *vps_strdup(const char *s);

/* Grow *arr (element size esz) so that it holds at least need elements. */
vps_result_t vps_grow(void **arr, size_t *cap, size_t need, size_t esz);
#define VPS_GROW(arr, cap, need) vps_grow((void **)&(arr), &(cap), (need), sizeof(*(arr)))

static inline int64_t vps_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t vps_max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t vps_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t vps_round_up(int64_t a, int64_t b) { return vps_ceil_div(a, b) * b; }
int64_t vps_gcd(int64_t a, int64_t b);
int64_t vps_lcm(int64_t a, int64_t b);

#endif
