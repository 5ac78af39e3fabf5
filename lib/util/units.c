/* Sizes a user types and the numbers the tools print for people
 * (include/vps/units.h; the rule is in vps(7) UNITS). */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "util/internal.h"
#include "vps/units.h"

#define SIZE_UNITS "B, K, M, G, T, P, E, KiB ... EiB (powers of 1024) or KB ... EB (powers of 1000)"

/* The multiplier of a unit, or 0 when it is none. The letter and an i
 * after it may be in either case, and so may the b after an i (2gib: no
 * one means gibibits by a size); right after the letter only B is bytes
 * (decimal), and a lowercase b there is bits (2Gb), refused as a size. */
static uint64_t unit_of(const char *u, bool *bits)
{
	static const char prefixes[] = "KMGTPE";
	*bits = !strcmp(u, "b");
	if (!*u || !strcmp(u, "B"))
		return 1;
	const char *p = strchr(prefixes, toupper((unsigned char)u[0]));
	if (!p)
		return 0;
	int power = (int)(p - prefixes) + 1;
	const char *rest = u + 1;
	bool binary;
	if (!*rest || !strcasecmp(rest, "i") || !strcasecmp(rest, "ib")) {
		binary = true; /* 2G is 2GiB, as for dd, sort -S and truncate */
	} else if (!strcmp(rest, "B")) {
		binary = false;
	} else {
		*bits = !strcmp(rest, "b");
		return 0;
	}
	uint64_t m = 1;
	for (int i = 0; i < power; i++)
		m *= binary ? 1024 : 1000;
	return m;
}

vps_result_t vps_parse_bytes(const char *s, int64_t *out)
{
	const char *c = s;
	uint64_t whole = 0, frac = 0, scale = 1;
	if (!isdigit((unsigned char)*c))
		return vps_fail(VPS_EINPUT, "'%s' is not a size (a number of bytes, or a number and a unit: " SIZE_UNITS ")",
				s);
	for (; isdigit((unsigned char)*c); c++)
		if (__builtin_mul_overflow(whole, 10, &whole) || __builtin_add_overflow(whole, (uint64_t)(*c - '0'), &whole))
			return vps_fail(VPS_EINPUT, "'%s' is too large (at most %" PRId64 " bytes)", s, INT64_MAX);
	if (*c == '.') {
		c++;
		if (!isdigit((unsigned char)*c))
			return vps_fail(VPS_EINPUT, "'%s': a digit must follow the decimal point", s);
		/* past the 18th, a digit is worth less than 10^-18 of a unit
		 * of at most 2^60 bytes: nothing a rounded-down result keeps */
		for (int nd = 0; isdigit((unsigned char)*c); c++, nd++)
			if (nd < 18) {
				frac = frac * 10 + (uint64_t)(*c - '0');
				scale *= 10;
			}
	}
	const char *num_end = c;
	while (*c == ' ')
		c++;
	if (c != num_end && !*c)
		return vps_fail(VPS_EINPUT, "'%s': a blank must be followed by a unit", s);
	bool bits;
	uint64_t mult = unit_of(c, &bits);
	if (bits)
		return vps_fail(VPS_EINPUT, "'%s': a lowercase b is bits; a size is in bytes (B)", s);
	if (!mult)
		return vps_fail(VPS_EINPUT, "'%s': unknown unit '%s' (" SIZE_UNITS ")", s, c);
	uint64_t v;
	/* frac < 10^18 and mult <= 2^60: the product fits 128 bits */
	unsigned __int128 part = (unsigned __int128)frac * mult / scale;
	if (__builtin_mul_overflow(whole, mult, &v) || __builtin_add_overflow(v, (uint64_t)part, &v) ||
	    v > (uint64_t)INT64_MAX)
		return vps_fail(VPS_EINPUT, "'%s' is too large (at most %" PRId64 " bytes)", s, INT64_MAX);
	*out = (int64_t)v;
	return VPS_OK;
}

/* v (at least 0) with three significant digits, or an integer from 100 on. */
static void three_digits(double v, const char *unit, const char *sign, char *buf, size_t n)
{
	if (v >= 99.95)
		snprintf(buf, n, "%s%.0f %s", sign, v, unit);
	else if (v >= 9.995)
		snprintf(buf, n, "%s%.1f %s", sign, v, unit);
	else
		snprintf(buf, n, "%s%.2f %s", sign, v, unit);
}

/* v scaled by base until below 999.5 (what prints with at most three
 * digits before the point) or out of units. */
static void scaled(double v, double base, const char *const *units, int nunits, char *buf, size_t n)
{
	const char *sign = "";
	if (!isfinite(v)) {
		snprintf(buf, n, "%s", "n/a");
		return;
	}
	if (v == 0) {
		snprintf(buf, n, "0 %s", units[0]);
		return;
	}
	if (v < 0) {
		sign = "-";
		v = -v;
	}
	int u = 0;
	while (v >= 999.5 && u + 1 < nunits) {
		v /= base;
		u++;
	}
	three_digits(v, units[u], sign, buf, n);
}

char *vps_format_bytes(int64_t bytes, char *buf, size_t n)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	if (bytes > -1000 && bytes < 1000)
		snprintf(buf, n, "%" PRId64 " B", bytes);
	else
		scaled((double)bytes, 1024.0, units, 7, buf, n);
	return buf;
}

char *vps_format_rate(double bytes_per_second, char *buf, size_t n)
{
	static const char *const units[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s"};
	scaled(bytes_per_second, 1000.0, units, 6, buf, n);
	return buf;
}

char *vps_format_seconds(double seconds, char *buf, size_t n)
{
	if (!isfinite(seconds)) {
		snprintf(buf, n, "%s", "n/a");
	} else if (seconds == 0) {
		snprintf(buf, n, "0 s");
	} else {
		double a = fabs(seconds);
		const char *sign = seconds < 0 ? "-" : "";
		if (a < 0.0009995)
			three_digits(a * 1e6, "us", sign, buf, n);
		else if (a < 0.9995)
			three_digits(a * 1e3, "ms", sign, buf, n);
		else
			three_digits(a, "s", sign, buf, n);
	}
	return buf;
}
