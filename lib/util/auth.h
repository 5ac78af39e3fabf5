/* Proving membership of a job: a shared secret (the job token) never sent
 * on the wire, only message authentication codes over fresh nonces
 * (SipHash-2-4, a keyed pseudo-random function built for short messages).
 * vps-exec(1) SECURITY states the model. */
#ifndef VPS_AUTH_H
#define VPS_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "vps/vps.h"

#define VPS_AUTH_KEY 16
#define VPS_AUTH_NONCE 16

/* SipHash-2-4 of data under a 128-bit key. */
uint64_t vps_siphash(const unsigned char key[VPS_AUTH_KEY], const void *data, size_t len);

/* The key of a job token (any length; the token's entropy is what counts). */
void vps_auth_key(const char *token, unsigned char key[VPS_AUTH_KEY]);

/* Unpredictable bytes from the kernel. */
vps_result_t vps_auth_random(void *buf, size_t len);

/* Equality that takes the same time wherever the bytes differ. */
int vps_auth_equal(const void *a, const void *b, size_t len);

#endif
