/* A peer's words as a rank prints them: a peer that proves the job token
 * may still send anything, and its text ends up on terminals and in logs. */
#include <stdio.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

/* The length of the UTF-8 sequence at p (at most left bytes) if it is a
 * well-formed, printable one of two to four bytes (no overlong forms, no
 * surrogates, nothing past U+10FFFF, no C1 control), else 0. */
static size_t utf8_printable(const unsigned char *p, size_t left)
{
	size_t n = p[0] >= 0xf0 && p[0] <= 0xf4 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc2 && p[0] < 0xe0 ? 2 : 0;
	if (!n || n > left)
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	if (n == 2 && p[0] == 0xc2 && p[1] < 0xa0)
		return 0; /* U+0080..U+009F */
	if (n == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0)))
		return 0;
	if (n == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] >= 0x90)))
		return 0;
	return n;
}

size_t vps_net_sanitize(char *out, size_t size, const void *in, size_t len)
{
	const unsigned char *p = in;
	size_t o = 0;
	if (!size)
		return 0;
	for (size_t i = 0; i < len && p[i];) {
		size_t n = p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' ? 1 : utf8_printable(p + i, len - i);
		if (n) {
			if (o + n >= size)
				break;
			memcpy(out + o, p + i, n);
			o += n;
			i += n;
			continue;
		}
		if (o + 4 >= size)
			break;
		snprintf(out + o, 5, "\\x%02x", p[i]);
		o += 4;
		i++;
	}
	out[o] = '\0';
	return o;
}
