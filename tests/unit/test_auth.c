/* Proving membership of a job: SipHash-2-4 against the reference vectors,
 * the key of a token, comparisons, token sources. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/auth.h"
#include "harness.h"
#include "vps/exec.h"

TEST(siphash_2_4_matches_the_reference_vectors)
{
	/* key 00..0f, message 00..len-1 (Aumasson and Bernstein, vectors.h) */
	unsigned char key[16], msg[64];
	for (int i = 0; i < 16; i++)
		key[i] = (unsigned char)i;
	for (int i = 0; i < 64; i++)
		msg[i] = (unsigned char)i;
	CHECK(vps_siphash(key, msg, 0) == 0x726fdb47dd0e0e31ULL);
	CHECK(vps_siphash(key, msg, 1) == 0x74f839c593dc67fdULL);
	CHECK(vps_siphash(key, msg, 8) == 0x93f5f5799a932462ULL);
	CHECK(vps_siphash(key, msg, 15) == 0xa129ca6149be45e5ULL);
	CHECK(vps_siphash(key, msg, 63) == 0x958a324ceb064572ULL);
}

TEST(a_token_s_key_depends_on_every_character)
{
	unsigned char a[VPS_AUTH_KEY], b[VPS_AUTH_KEY], c[VPS_AUTH_KEY];
	vps_auth_key("0123456789abcdef0123456789abcdef", a);
	vps_auth_key("0123456789abcdef0123456789abcdee", b);
	vps_auth_key("0123456789abcdef0123456789abcdef", c);
	CHECK(memcmp(a, b, sizeof(a)) != 0);
	CHECK(memcmp(a, c, sizeof(a)) == 0);
	CHECK(vps_auth_equal(a, c, sizeof(a)));
	CHECK(!vps_auth_equal(a, b, sizeof(a)));
}

TEST(new_tokens_are_fresh_hex)
{
	char t1[VPS_TOKEN_NEW + 1], t2[VPS_TOKEN_NEW + 1];
	CHECK_OK(vps_exec_new_token(t1));
	CHECK_OK(vps_exec_new_token(t2));
	CHECK_EQ(strlen(t1), VPS_TOKEN_NEW);
	CHECK_EQ(strspn(t1, "0123456789abcdef"), VPS_TOKEN_NEW);
	CHECK(strcmp(t1, t2) != 0);
}

TEST(token_sources_environment_and_private_file)
{
	char tok[VPS_TOKEN_MAX + 3], path[64];
	snprintf(path, sizeof(path), "/tmp/vps-test-token-%d", (int)getpid());
	setenv("VPS_TOKEN", "  0123456789abcdef\n", 1);
	CHECK_OK(vps_exec_token(NULL, tok, sizeof(tok)));
	CHECK(strcmp(tok, "  0123456789abcdef") == 0);
	setenv("VPS_TOKEN", "too short", 1);
	CHECK(vps_exec_token(NULL, tok, sizeof(tok)) == VPS_EINPUT);
	CHECK(tok[0] == '\0');
	unsetenv("VPS_TOKEN");
	CHECK_OK(vps_exec_token(NULL, tok, sizeof(tok)));
	CHECK(tok[0] == '\0');
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
	CHECK(fd >= 0);
	CHECK(write(fd, "fedcba9876543210fedcba9876543210\n", 33) == 33);
	close(fd);
	CHECK_OK(vps_exec_token(path, tok, sizeof(tok)));
	CHECK(strcmp(tok, "fedcba9876543210fedcba9876543210") == 0);
	chmod(path, 0640);
	CHECK(vps_exec_token(path, tok, sizeof(tok)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "mode 640 lets other users read the job token") != NULL);
	CHECK(tok[0] == '\0');
	unlink(path);
}
