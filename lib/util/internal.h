/* Private helpers shared by the libvps modules: error recording and the
 * check macros that carry an error up through one cleanup label. */
#ifndef VPS_INTERNAL_H
#define VPS_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
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
/* "; " and what follows appended to the last error, as room allows */
void vps_error_suffix(const char *fmt, ...) VPS_PRINTF(1, 2);

/* An options struct's version (vps/base.h, "Options structs"): VPS_EINPUT
 * for NULL, 0 or a version newer than known, naming the struct and its
 * macro init. */
vps_result_t vps_opts_check(const void *opts, unsigned int version, unsigned int known, const char *type,
			    const char *init);
#define VPS_OPTS_CHECK(o, known, type, init) vps_opts_check((o), (o) ? (o)->version : 0, (known), (type), (init))

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
/* qsort and bsearch order of int64_t (the first of a row of them too) */
int vps_int64_cmp(const void *p, const void *q);

/* Bounds on what a file may claim. No device or host holds a buffer of
 * 2^48 elements (1 PiB of fp32), no model has a tensor that large, and no
 * job a global batch of 2^24 samples: larger values are corrupt or hostile,
 * and everything below stays far from int64 overflow (2^48 elements times
 * an 8-byte element, or times a stride of the same bound, is checked). */
#define VPS_MAX_ELEMENTS ((int64_t)1 << 48)
#define VPS_MAX_BATCH ((int64_t)1 << 24)

/* Checked int64 arithmetic: false on overflow (*out undefined then). */
static inline bool vps_add_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline bool vps_mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
/* Totals over a file's items (bytes moved, loads) saturate rather than wrap. */
static inline int64_t vps_sat_add(int64_t a, int64_t b)
{
	int64_t c;
	return __builtin_add_overflow(a, b, &c) ? (b < 0 ? INT64_MIN : INT64_MAX) : c;
}

/* The elements [*first, *end) a strided view touches: offset plus, per
 * axis, (ext - 1) * stride. @return false when an extent is below 1, a
 * stride is 0 (rows that alias; no vps layout has one), or the arithmetic
 * overflows. */
bool vps_view_span(int ndim, const int64_t *ext, int64_t offset, const int64_t *strides, int64_t *first,
		   int64_t *end);
/* The product of the extents, or -1 when it overflows or an extent is
 * below 1. */
int64_t vps_ext_volume(int ndim, const int64_t *ext);

#endif
