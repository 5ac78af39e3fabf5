/* Sizes typed by people and the numbers printed for them (vps(7) UNITS). */
#include <math.h>
#include <string.h>

#include "harness.h"
#include "vps/units.h"

static int64_t size_of(const char *s)
{
	int64_t v = -1;
	if (vps_parse_bytes(s, &v) != VPS_OK)
		return -1;
	return v;
}

TEST(sizes_in_every_unit)
{
	static const struct {
		const char *s;
		int64_t v;
	} ok[] = {
		{"0", 0},
		{"4096", 4096},
		{"4096B", 4096},
		{"2G", 2 * ((int64_t)1 << 30)},
		{"2Gi", 2 * ((int64_t)1 << 30)},
		{"2GiB", 2 * ((int64_t)1 << 30)},
		{"2GB", 2000000000},
		{"2 GiB", 2 * ((int64_t)1 << 30)},
		{"512M", 512 * ((int64_t)1 << 20)},
		{"512MB", 512000000},
		{"512mb", -1}, /* bits */
		{"2gib", 2 * ((int64_t)1 << 30)}, /* the i says binary bytes, in any case */
		{"2GIB", 2 * ((int64_t)1 << 30)},
		{"2Gib", 2 * ((int64_t)1 << 30)},
		{"2gI", 2 * ((int64_t)1 << 30)},
		{"2gB", 2000000000},
		{"1k", 1024},
		{"1kB", 1000},
		{"1KB", 1000},
		{"1KiB", 1024},
		{"1.5GiB", 3 * ((int64_t)1 << 29)},
		{"0.5K", 512},
		{"0.1KiB", 102}, /* 102.4 bytes, rounded down */
		{"1T", (int64_t)1 << 40},
		{"1TB", 1000000000000},
		{"2P", (int64_t)2 << 50},
		{"8191PiB", 8191 * ((int64_t)1 << 50)},
		{"7EiB", (int64_t)7 << 60},
		{"9EB", 9000000000000000000},
		{"9223372036854775807", INT64_MAX},
		{"0.000000000000000000001G", 0},
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		int64_t v = size_of(ok[i].s);
		if (v != ok[i].v)
			harness_fail(__FILE__, __LINE__, "'%s': %" PRId64 ", expected %" PRId64, ok[i].s, v, ok[i].v);
	}
}

TEST(sizes_that_are_not_refused_with_a_reason)
{
	static const char *const bad[] = {
		"", " 2G", "2 ", "-1", "+1", "2G ", "2 G B", "G", ".5G", "5.G", "1e9", "0x10", "inf", "nan", "NaN",
		"2Gb", "4096b", "2Mbit", "2X", "2GiBs", "2GG", "1,5G", "2iB",
		"9223372036854775808",       /* INT64_MAX + 1 */
		"18446744073709551616",      /* 2^64: wraps an unchecked uint64 */
		"99999999999999999999999999", /* and beyond */
		"8192PiB",                   /* 2^63 */
		"8EiB",                      /* 2^63 again */
		"8E",
		"9223372036854775807.5K",
		"9007199254740993P",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int64_t v = 12345;
		vps_clear_error();
		vps_result_t rc = vps_parse_bytes(bad[i], &v);
		if (rc != VPS_EINPUT || v != 12345)
			harness_fail(__FILE__, __LINE__, "'%s' parsed (rc %d, %" PRId64 ")", bad[i], (int)rc, v);
		/* the message names what was typed */
		if (!strstr(vps_last_error(), bad[i]))
			harness_fail(__FILE__, __LINE__, "'%s': message '%s'", bad[i], vps_last_error());
	}
	vps_parse_bytes("2Gb", &(int64_t){0});
	CHECK(strstr(vps_last_error(), "bits") != NULL);
	vps_parse_bytes("99999999999999999999", &(int64_t){0});
	CHECK(strstr(vps_last_error(), "too large") != NULL);
}

/* Every size the formatter prints reads back within its rounding: what
 * the tools print can be pasted into --budget. */
TEST(printed_sizes_read_back)
{
	for (int i = 0; i < 20000; i++) {
		int shift = (int)(harness_random() % 62);
		int64_t b = (int64_t)(harness_random() >> (64 - shift - 1));
		if (b < 0)
			continue;
		char s[VPS_UNITS_LEN], t[VPS_UNITS_LEN];
		vps_format_bytes(b, s, sizeof(s));
		/* the parser takes the unit without the blank too */
		snprintf(t, sizeof(t), "%s", s);
		int64_t back;
		if (vps_parse_bytes(t, &back) != VPS_OK) {
			harness_fail(__FILE__, __LINE__, "%" PRId64 " prints as '%s', which does not parse: %s", b, s,
				     vps_last_error());
			continue;
		}
		double rel = b ? fabs((double)back - (double)b) / (double)b : (double)back;
		if (rel > 0.006)
			harness_fail(__FILE__, __LINE__, "%" PRId64 " prints as '%s', read back as %" PRId64, b, s, back);
		CHECK(strlen(s) <= 9);
	}
}

TEST(formats)
{
	char b[VPS_UNITS_LEN];
	static const struct {
		int64_t v;
		const char *s;
	} bytes[] = {
		{0, "0 B"},
		{999, "999 B"},
		{1000, "0.98 KiB"},
		{1024, "1.00 KiB"},
		{1536, "1.50 KiB"},
		{10240, "10.0 KiB"},
		{512 * ((int64_t)1 << 20), "512 MiB"},
		{1023 * ((int64_t)1 << 20), "1.00 GiB"},
		{((int64_t)1 << 31), "2.00 GiB"},
		{93630000000, "87.2 GiB"},
		{INT64_MAX, "8.00 EiB"},
		{-2048, "-2.00 KiB"},
	};
	for (size_t i = 0; i < sizeof(bytes) / sizeof(bytes[0]); i++)
		if (strcmp(vps_format_bytes(bytes[i].v, b, sizeof(b)), bytes[i].s))
			harness_fail(__FILE__, __LINE__, "%" PRId64 ": '%s', expected '%s'", bytes[i].v, b, bytes[i].s);
	static const struct {
		double v;
		const char *s;
	} rates[] = {
		{0, "0 B/s"}, {999, "999 B/s"}, {2.04e8, "204 MB/s"}, {24.5e9, "24.5 GB/s"}, {1.2e12, "1.20 TB/s"},
		{INFINITY, "n/a"},
	};
	for (size_t i = 0; i < sizeof(rates) / sizeof(rates[0]); i++)
		if (strcmp(vps_format_rate(rates[i].v, b, sizeof(b)), rates[i].s))
			harness_fail(__FILE__, __LINE__, "%g B/s: '%s', expected '%s'", rates[i].v, b, rates[i].s);
	static const struct {
		double v;
		const char *s;
	} secs[] = {
		{0, "0 s"},      {0.0000005, "0.50 us"}, {0.00085, "850 us"}, {0.0123, "12.3 ms"},
		{0.109, "109 ms"}, {0.9996, "1.00 s"},   {1.0421, "1.04 s"},   {3600, "3600 s"},
		{NAN, "n/a"},
	};
	for (size_t i = 0; i < sizeof(secs) / sizeof(secs[0]); i++)
		if (strcmp(vps_format_seconds(secs[i].v, b, sizeof(b)), secs[i].s))
			harness_fail(__FILE__, __LINE__, "%g s: '%s', expected '%s'", secs[i].v, b, secs[i].s);
	/* a short buffer is cut, not overrun */
	char tiny[4];
	vps_format_bytes(93630000000, tiny, sizeof(tiny));
	CHECK(!strcmp(tiny, "87."));
}
