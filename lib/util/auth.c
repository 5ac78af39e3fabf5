#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/auth.h"
#include "util/internal.h"
#include "vps/exec.h"

static inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

static inline uint64_t load64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

#define SIPROUND                                                                                                 \
	do {                                                                                                     \
		v0 += v1;                                                                                        \
		v1 = rotl(v1, 13);                                                                               \
		v1 ^= v0;                                                                                        \
		v0 = rotl(v0, 32);                                                                               \
		v2 += v3;                                                                                        \
		v3 = rotl(v3, 16);                                                                               \
		v3 ^= v2;                                                                                        \
		v0 += v3;                                                                                        \
		v3 = rotl(v3, 21);                                                                               \
		v3 ^= v0;                                                                                        \
		v2 += v1;                                                                                        \
		v1 = rotl(v1, 17);                                                                               \
		v1 ^= v2;                                                                                        \
		v2 = rotl(v2, 32);                                                                               \
	} while (0)

uint64_t vps_siphash(const unsigned char key[VPS_AUTH_KEY], const void *data, size_t len)
{
	const unsigned char *in = data;
	uint64_t k0 = load64(key), k1 = load64(key + 8);
	uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
	uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
	size_t full = len & ~(size_t)7;
	for (size_t i = 0; i < full; i += 8) {
		uint64_t m = load64(in + i);
		v3 ^= m;
		SIPROUND;
		SIPROUND;
		v0 ^= m;
	}
	uint64_t b = (uint64_t)len << 56;
	for (size_t i = 0; i < (len & 7); i++)
		b |= (uint64_t)in[full + i] << (8 * i);
	v3 ^= b;
	SIPROUND;
	SIPROUND;
	v0 ^= b;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

void vps_auth_key(const char *token, unsigned char key[VPS_AUTH_KEY])
{
	/* two fixed keys spread a token of any length over 128 bits */
	static const unsigned char k0[VPS_AUTH_KEY] = "vps job token 0";
	static const unsigned char k1[VPS_AUTH_KEY] = "vps job token 1";
	size_t n = strlen(token);
	uint64_t a = vps_siphash(k0, token, n), b = vps_siphash(k1, token, n);
	for (int i = 0; i < 8; i++) {
		key[i] = (unsigned char)(a >> (8 * i));
		key[8 + i] = (unsigned char)(b >> (8 * i));
	}
}

vps_result_t vps_auth_random(void *buf, size_t len)
{
	unsigned char *p = buf;
	while (len) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return vps_fail_errno("getrandom");
		p += n;
		len -= (size_t)n;
	}
	return VPS_OK;
}

int vps_auth_equal(const void *a, const void *b, size_t len)
{
	const volatile unsigned char *x = a, *y = b;
	unsigned char d = 0;
	for (size_t i = 0; i < len; i++)
		d |= (unsigned char)(x[i] ^ y[i]);
	return d == 0;
}

/* ---- the job token a user hands to vps-exec ---- */

static bool token_ok(const char *t) { return strlen(t) >= VPS_TOKEN_MIN && strlen(t) <= VPS_TOKEN_MAX; }

static void trim(char *s)
{
	size_t n = strlen(s);
	while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
		s[--n] = '\0';
}

static vps_result_t token_from_file(const char *path, char *out, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return vps_fail(VPS_EINPUT, "%s: %s", path, errno == ELOOP ? "a symbolic link (refused)" : strerror(errno));
	struct stat st;
	vps_result_t rc = VPS_OK;
	if (fstat(fd, &st) != 0)
		rc = vps_fail_errno("%s", path);
	else if (!S_ISREG(st.st_mode))
		rc = vps_fail(VPS_EINPUT, "%s: not a regular file", path);
	else if (st.st_uid != geteuid())
		rc = vps_fail(VPS_EINPUT, "%s: owned by uid %u, not by this user (uid %u)", path, (unsigned)st.st_uid,
			      (unsigned)geteuid());
	else if (st.st_mode & 077)
		rc = vps_fail(VPS_EINPUT, "%s: mode %03o lets other users read the job token (chmod 600 it)", path,
			      (unsigned)(st.st_mode & 0777));
	else if (st.st_size > VPS_TOKEN_MAX + 2)
		rc = vps_fail(VPS_EINPUT, "%s: %lld bytes; a job token is at most %d characters", path,
			      (long long)st.st_size, VPS_TOKEN_MAX);
	if (!rc) {
		ssize_t n = read(fd, out, size - 1);
		if (n < 0)
			rc = vps_fail_errno("%s", path);
		else {
			out[n] = '\0';
			if (memchr(out, '\0', (size_t)n))
				rc = vps_fail(VPS_EINPUT, "%s: not a text token", path);
			trim(out);
			if (!rc && !token_ok(out))
				rc = vps_fail(VPS_EINPUT, "%s: a job token is %d to %d characters (vps-exec --new-token makes one)",
					      path, VPS_TOKEN_MIN, VPS_TOKEN_MAX);
		}
	}
	close(fd);
	if (rc)
		memset(out, 0, size);
	return rc;
}

vps_result_t vps_exec_token(const char *file, char *out, size_t size)
{
	if (size < VPS_TOKEN_MAX + 3)
		return vps_fail(VPS_EINPUT, "job token: a buffer of %zu bytes is too small", size);
	out[0] = '\0';
	if (file)
		return token_from_file(file, out, size);
	const char *env = getenv("VPS_TOKEN");
	if (!env || !*env)
		return VPS_OK;
	snprintf(out, size, "%s", env);
	trim(out);
	if (!token_ok(out)) {
		memset(out, 0, size);
		return vps_fail(VPS_EINPUT, "VPS_TOKEN: a job token is %d to %d characters (vps-exec --new-token makes one)",
				VPS_TOKEN_MIN, VPS_TOKEN_MAX);
	}
	return VPS_OK;
}

vps_result_t vps_exec_new_token(char out[VPS_TOKEN_NEW + 1])
{
	unsigned char raw[VPS_TOKEN_NEW / 2];
	VPS_CHECK(vps_auth_random(raw, sizeof(raw)));
	for (size_t i = 0; i < sizeof(raw); i++)
		snprintf(out + 2 * i, 3, "%02x", raw[i]);
	memset(raw, 0, sizeof(raw));
	return VPS_OK;
}
