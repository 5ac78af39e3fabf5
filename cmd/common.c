#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "vps/units.h"

int tool_status(vps_result_t rc)
{
	/* what the user asked for is wrong or cannot be had here: 2 */
	return rc == VPS_EINPUT || rc == VPS_EFORMAT || rc == VPS_EUNSUPPORTED || rc == VPS_ENOTFOUND || rc == VPS_ESTALE
		       ? EXIT_USAGE
		       : EXIT_CHECK;
}

int tool_fail(vps_result_t rc)
{
	const char *msg = vps_last_error();
	fprintf(stderr, "%s: %s\n", tool_name, *msg ? msg : vps_strerror(rc));
	return tool_status(rc);
}

int tool_usage_error(const char *fmt, ...)
{
	char msg[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	size_t n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = '\0';
	fprintf(stderr, "%s: %s\n", tool_name, msg);
	return EXIT_USAGE;
}

int tool_finish(int status)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "%s: error writing standard output: %s\n", tool_name, strerror(errno));
		return status ? status : EXIT_CHECK;
	}
	return status;
}

const char *tool_config_path(const char *sub)
{
	static char buf[8 * PATH_MAX];
	char exe[PATH_MAX] = "";
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = '\0';
		char *slash = strrchr(exe, '/');
		if (slash)
			*slash = '\0';
	}
	size_t len = 0;
	buf[0] = '\0';
	/* each root of $VPS_CONFIG_PATH, then the build tree, then the install */
	const char *env = getenv("VPS_CONFIG_PATH");
	for (const char *p = env ? env : ""; *p;) {
		const char *colon = strchr(p, ':');
		size_t dl = colon ? (size_t)(colon - p) : strlen(p);
		if (dl && len < sizeof(buf))
			len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%.*s/%s:", (int)dl, p, sub);
		p = colon ? colon + 1 : p + dl;
	}
	if (len < sizeof(buf))
		snprintf(buf + len, sizeof(buf) - len, "%s/../configs/%s:%s/../share/vps/configs/%s", exe, sub, exe, sub);
	return buf;
}

bool tool_parse_i64(const char *s, int64_t *v)
{
	char *end;
	errno = 0;
	long long x = strtoll(s, &end, 10);
	if (!*s || *end || errno || x < 0)
		return false;
	*v = x;
	return true;
}

static bool push(int64_t **list, size_t *n, size_t *cap, int64_t v)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		int64_t *p = realloc(*list, nc * sizeof(*p));
		if (!p)
			return false;
		*list = p;
		*cap = nc;
	}
	(*list)[(*n)++] = v;
	return true;
}

bool tool_parse_ranks(const char *s, int64_t **list, size_t *n, size_t *cap, bool *all)
{
	if (!strcmp(s, "all")) {
		*all = true;
		return true;
	}
	while (*s) {
		char *end;
		errno = 0;
		long long a = strtoll(s, &end, 10), b;
		if (end == s || a < 0 || errno)
			return false;
		b = a;
		s = end;
		if (*s == '-') {
			s++;
			b = strtoll(s, &end, 10);
			if (end == s || b < a || errno || b - a > (1 << 24))
				return false;
			s = end;
		}
		for (long long r = a; r <= b; r++)
			if (!push(list, n, cap, r))
				return false;
		if (*s == ',')
			s++;
		else if (*s)
			return false;
	}
	return true;
}

bool tool_human(bool flag)
{
	return flag || isatty(STDOUT_FILENO);
}

bool tool_summary_wanted(bool quiet, const char *out)
{
	if (quiet)
		return false;
	if (out && strcmp(out, "-"))
		return true;
	return !isatty(STDOUT_FILENO);
}

const char *tool_bytes(int64_t v, bool human, char *buf, size_t n)
{
	if (human)
		return vps_format_bytes(v, buf, n);
	snprintf(buf, n, "%" PRId64, v);
	return buf;
}

const char *tool_seconds(double v, const char *fmt, bool human, char *buf, size_t n)
{
	if (human)
		return vps_format_seconds(v, buf, n);
	snprintf(buf, n, fmt, v);
	return buf;
}
