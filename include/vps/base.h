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

#define VPS_VERSION_STRING "0.1.0"

/* What libvps.so exports: every function and object declared in
 * include/vps/ carries VPS_API; everything else in the library is hidden
 * (built with -fvisibility=hidden), so nothing becomes API by accident. */
#if defined(__GNUC__)
#define VPS_API __attribute__((visibility("default")))
#else
#define VPS_API
#endif

typedef enum vps_result {
	VPS_OK = 0,
	VPS_EINPUT,   /* malformed or invalid input: a file, a flag, a config */
	VPS_ECHECK,   /* a verification found a violation */
	VPS_ESYS,     /* an operating-system call failed (errno in the message) */
	VPS_ENOMEM,   /* allocation failed */
	VPS_EFORMAT,  /* a file is truncated, corrupt or of another version */
	VPS_ECUDA,    /* a CUDA runtime call failed */
	VPS_ENCCL,    /* an NCCL call failed */
	VPS_ETIMEOUT, /* a peer or the trainer did not answer in time */
	VPS_EPEER,    /* a peer failed or disagreed */
	VPS_EUNSUPPORTED, /* built without the feature asked for */
	VPS_ENOTFOUND, /* what a name names does not exist (yet): a registry, a config, a tensor */
	VPS_ESTALE,    /* it exists, but its owner is gone (a crashed trainer's registry) */
	VPS_EBUSY,     /* another live process owns it (a registry with its executor) */
	VPS_EINTERNAL, /* a bug in vps: an invariant that input cannot break did not hold */
} vps_result_t;

/* @return a short constant description of a result code. */
VPS_API const char *vps_strerror(vps_result_t rc);

/* @return the detailed message of the last failure on this thread, or "" */
VPS_API const char *vps_last_error(void);

/* Clear the last error message of this thread. */
VPS_API void vps_clear_error(void);

/* sizeof(struct TYPE) for the structs a binding mirrors ("vps_region",
 * "vps_rank_view", ...), or 0 for a name it does not know. */
VPS_API size_t vps_abi_size(const char *type);

#endif
