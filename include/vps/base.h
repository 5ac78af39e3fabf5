/* What every vps header needs: the result codes, the last error, the
 * version. Include vps/vps.h for the whole API.
 *
 * Every libvps function returns a vps_result_t. The library never prints and
 * never exits: on failure it records a detailed message (with the input file
 * and line where there is one) that vps_last_error() returns until the next
 * failing call on the same thread. */
#ifndef VPS_BASE_H
#define VPS_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of these headers; vps_version() and vps_version_number()
 * say the library's, which a program linked with libvps.so may find newer.
 * The major version is the SONAME's (libvps.so.MAJOR). The Makefile reads
 * VPS_VERSION_STRING: keep the four in step (test_api checks they agree). */
#define VPS_VERSION_MAJOR 0
#define VPS_VERSION_MINOR 1
#define VPS_VERSION_PATCH 0
#define VPS_VERSION_STRING "0.1.0"
/* MAJOR * 10000 + MINOR * 100 + PATCH, as zstd's: 100 for 0.1.0 */
#define VPS_VERSION_NUMBER (VPS_VERSION_MAJOR * 10000 + VPS_VERSION_MINOR * 100 + VPS_VERSION_PATCH)

/* What libvps.so exports: every function and object declared in
 * include/vps/ carries VPS_API; everything else in the library is hidden
 * (built with -fvisibility=hidden), so nothing becomes API by accident. */
#if defined(__GNUC__)
#define VPS_API __attribute__((visibility("default")))
#else
#define VPS_API
#endif

/* What every libvps call returns. The values are part of the ABI (programs
 * and bindings compare them, vps-formats(5) lists them): a value never
 * changes and is never reused, and a new code is only appended, after the
 * last. vps_result_name() names each. */
typedef enum vps_result {
	VPS_OK = 0,
	VPS_EINPUT = 1,           /* malformed or invalid input: a file, a flag, a config */
	VPS_ECHECK = 2,           /* a verification found a violation */
	VPS_ESYS = 3,             /* an operating-system call failed (errno in the message) */
	VPS_ENOMEM = 4,           /* allocation failed */
	VPS_EFORMAT = 5,          /* a file is truncated, corrupt or of another version */
	VPS_ECUDA = 6,            /* a CUDA runtime call failed */
	VPS_ENCCL = 7,            /* an NCCL call failed */
	VPS_ETIMEOUT = 8,         /* a peer or the trainer did not answer in time */
	VPS_EPEER = 9,            /* a peer failed or disagreed */
	VPS_EUNSUPPORTED = 10,    /* built without the feature asked for */
	VPS_ENOTFOUND = 11,       /* what a name names does not exist (yet): a registry, a config, a tensor */
	VPS_ESTALE = 12,          /* it exists, but its owner is gone (a crashed trainer's registry) */
	VPS_EBUSY = 13,           /* another live process owns it (a registry with its executor) */
	VPS_EINTERNAL = 14,       /* a bug in vps: an invariant that input cannot break did not hold */
} vps_result_t;

/* @return a short constant description of a result code ("unknown
 * error" for a value this library does not know). */
VPS_API const char *vps_strerror(vps_result_t rc);

/* @return the code's name as a constant string ("VPS_OK", "VPS_ENOTFOUND",
 * ...), or NULL for a value this library does not know: the known codes
 * are 0, 1, 2, ... up to the first NULL, so a binding can list them. */
VPS_API const char *vps_result_name(vps_result_t rc);

/* @return the library's version, "MAJOR.MINOR.PATCH" (VPS_VERSION_STRING
 * of the headers it was built with). */
VPS_API const char *vps_version(void);

/* @return the library's VPS_VERSION_NUMBER. */
VPS_API int vps_version_number(void);

/* @return the detailed message of the last failure on this thread, or "" */
VPS_API const char *vps_last_error(void);

/* Clear the last error message of this thread. */
VPS_API void vps_clear_error(void);

/* Options structs (struct vps_plan_opts, vps_exec_opts, vps_trainer_opts)
 * grow: a later libvps may append fields to them, never remove or move one.
 * Each begins with `unsigned int version` and comes with a macro of every
 * field's default, to start from and change what a call needs:
 *
 *     struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
 *     o.relay = true;
 *
 * The macro sets version to the struct's VPS_*_OPTS_VERSION of these
 * headers. The library reads only the fields of the version a caller
 * states, so a program built against older headers runs unchanged on a
 * newer libvps.so, and refuses a version it does not know (0: never set;
 * or newer than itself) with VPS_EINPUT. Never fill one with memset or
 * designated initializers alone. */

/* sizeof(struct TYPE) for the structs a binding mirrors ("vps_region",
 * "vps_rank_view", ...), or 0 for a name it does not know. */
VPS_API size_t vps_abi_size(const char *type);

#ifdef __cplusplus
}
#endif

#endif
