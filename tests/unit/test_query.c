/* The record writer of the queries: what a value that no tensor name has
 * yet (a tab, a quote, a word YAML reads as a boolean) comes out as, in
 * each format, read back by the parsers scripts use. */
#include <string.h>

#include "harness.h"
#include "vps/io.h"
#include "vps/query.h"

static const struct vps_field fields[] = {
	{"name", VPS_FIELD_STR}, {"n", VPS_FIELD_INT}, {"box", VPS_FIELD_BOX}, {"s", VPS_FIELD_INTS}};

/* The table of one record, NUL-terminated. */
static char *table(enum vps_format f, const char *name)
{
	static char text[1024];
	struct vps_bytes b = {0};
	struct vps_records r;
	struct vps_box box = {2, {0, 5}, {3, 9}};
	int64_t s[2] = {4, 1};
	struct vps_value v[] = {{.s = name}, {.i = -7}, {.box = &box}, {.ints = s, .nints = 2}};
	CHECK_OK(vps_records_begin(&r, &b, f, fields, 4));
	CHECK_OK(vps_records_put(&r, v));
	CHECK_OK(vps_records_end(&r));
	CHECK(b.len < sizeof(text));
	memcpy(text, b.data, b.len < sizeof(text) ? b.len : 0);
	text[b.len < sizeof(text) ? b.len : 0] = '\0';
	vps_bytes_release(&b);
	return text;
}

TEST(records_in_each_format)
{
	CHECK(!strcmp(table(VPS_FORMAT_YAML, "a.b_c-1"), "- {name: a.b_c-1, n: -7, box: [[0, 3], [5, 9]], s: [4, 1]}\n"));
	CHECK(!strcmp(table(VPS_FORMAT_JSON, "a.b_c-1"), "{\"name\":\"a.b_c-1\",\"n\":-7,\"box\":[[0,3],[5,9]],\"s\":[4,1]}\n"));
	CHECK(!strcmp(table(VPS_FORMAT_TSV, "a.b_c-1"), "name\tn\tbox\ts\na.b_c-1\t-7\t0:3,5:9\t4,1\n"));
}

TEST(text_that_would_break_a_format_is_escaped)
{
	/* a tab and a newline would cut a TSV record, a quote a JSON string */
	CHECK(!strcmp(table(VPS_FORMAT_TSV, "a\tb\nc\\d"), "name\tn\tbox\ts\na\\tb\\nc\\\\d\t-7\t0:3,5:9\t4,1\n"));
	CHECK(strstr(table(VPS_FORMAT_JSON, "q\"\\\t\x01"), "\"name\":\"q\\\"\\\\\\u0009\\u0001\""));
	/* YAML would read these plain as a boolean, a number, a null or a map */
	const char *quoted[] = {"true", "No", "null", "5", "0-6:2", "a: b", "", "-x"};
	for (size_t i = 0; i < sizeof(quoted) / sizeof(*quoted); i++) {
		char want[64];
		snprintf(want, sizeof(want), "- {name: \"%s\",", quoted[i]);
		CHECK(!strncmp(table(VPS_FORMAT_YAML, quoted[i]), want, strlen(want)));
	}
}

TEST(an_empty_table)
{
	struct vps_bytes b = {0};
	struct vps_records r;
	for (int f = 0; f < 3; f++) {
		CHECK_OK(vps_records_begin(&r, &b, (enum vps_format)f, fields, 4));
		CHECK_OK(vps_records_end(&r));
	}
	/* YAML: an empty sequence rather than no document; TSV: the header */
	CHECK_EQ(b.len, strlen("[]\nname\tn\tbox\ts\n"));
	CHECK(b.len == strlen("[]\nname\tn\tbox\ts\n") && !memcmp(b.data, "[]\nname\tn\tbox\ts\n", b.len));
	vps_bytes_release(&b);
}

TEST(ranks_and_boxes)
{
	char buf[64];
	vps_ranks_format(5, 3, 1, buf, sizeof(buf));
	CHECK(!strcmp(buf, "5"));
	vps_ranks_format(8, 1, 8, buf, sizeof(buf));
	CHECK(!strcmp(buf, "8-15"));
	vps_ranks_format(1, 2, 4194304, buf, sizeof(buf));
	CHECK(!strcmp(buf, "1-8388607:2"));
	struct vps_box b;
	CHECK_OK(vps_box_parse("0:4,7:281474976710656", &b));
	CHECK(b.ndim == 2 && b.lo[0] == 0 && b.hi[0] == 4 && b.lo[1] == 7 && b.hi[1] == ((int64_t)1 << 48));
	const char *bad[] = {"", "1", "1:", ":1", "1:1", "2:1", "0:1,", "0:1;0:2", "0:281474976710657", "0:1:2",
			     "0:1,0:1,0:1,0:1,0:1", " 0:1", "0:1 ", "+0:1", "0x1:2"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		CHECK(vps_box_parse(bad[i], &b) == VPS_EINPUT);
}
