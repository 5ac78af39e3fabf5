/* Documents: YAML and binary carry the same values; damaged files are
 * refused with a reason. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/doc.h"
#include "harness.h"
#include "jobs.h"
#include "vps/layout.h"


TEST(yaml_binary_yaml_is_byte_identical)
{
	struct vps_layout *l = test_layout("tiny-qwen3-moe", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1,grad=1", 4, 2);
	int64_t ranks[] = {0, 5};
	struct vps_bytes y1 = {0}, bin = {0}, y2 = {0};
	CHECK_OK(vps_layout_serialize(l, ranks, 2, true, &y1));
	struct vps_layout *a = NULL, *b = NULL;
	CHECK_OK(vps_layout_parse(&a, "y1", y1.data, y1.len));
	CHECK_OK(vps_layout_serialize(a, NULL, 0, false, &bin));
	CHECK(vps_is_binary(bin.data, bin.len));
	CHECK_OK(vps_layout_parse(&b, "bin", bin.data, bin.len));
	CHECK_OK(vps_layout_serialize(b, NULL, 0, true, &y2));
	CHECK_EQ(y1.len, y2.len);
	CHECK(y1.len == y2.len && memcmp(y1.data, y2.data, y1.len) == 0);
	CHECK(vps_layout_hash(l) == vps_layout_hash(b));
	vps_bytes_release(&y1);
	vps_bytes_release(&y2);
	vps_bytes_release(&bin);
	vps_layout_free(a);
	vps_layout_free(b);
	vps_layout_free(l);
}

static vps_result_t parse_bytes(const unsigned char *d, size_t n)
{
	struct vps_layout *x = NULL;
	vps_result_t rc = vps_layout_parse(&x, "f", d, n);
	vps_layout_free(x);
	return rc;
}

TEST(damaged_binary_is_refused)
{
	struct vps_layout *l = test_layout("tiny-llama", "tp=2,dp=2", 4, 2);
	struct vps_bytes bin = {0};
	CHECK_OK(vps_layout_serialize(l, NULL, 0, false, &bin));
	unsigned char *d = malloc(bin.len + 1);
	/* truncated anywhere */
	for (size_t cut = 0; cut < bin.len; cut += 7)
		CHECK(parse_bytes(bin.data, cut) != VPS_OK);
	/* a flipped byte in the compressed payload: refused, unless zstd
	 * decodes the same content from it (a redundant code; the content
	 * checksum holds), which then reads as the same layout */
	for (size_t i = VPS_DOC_HEADER_SIZE + 6; i < bin.len; i += 13) {
		memcpy(d, bin.data, bin.len);
		d[i] ^= 0x40;
		struct vps_layout *x = NULL;
		if (vps_layout_parse(&x, "f", d, bin.len) == VPS_OK)
			CHECK_EQ(vps_layout_hash(x), vps_layout_hash(l));
		vps_layout_free(x);
	}
	memcpy(d, bin.data, bin.len);
	d[6] = 9; /* future version */
	CHECK(parse_bytes(d, bin.len) == VPS_EFORMAT);
	CHECK(strstr(vps_last_error(), "newer than this build reads") != NULL);
	memcpy(d, bin.data, bin.len);
	d[6] = 1; /* a binary encoding from before cp and grouped_gemm */
	CHECK(parse_bytes(d, bin.len) == VPS_EFORMAT);
	CHECK(strstr(vps_last_error(), "written by an older vps") != NULL);
	memcpy(d, bin.data, bin.len);
	d[3] = 'X'; /* wrong magic */
	CHECK(parse_bytes(d, bin.len) == VPS_EFORMAT);
	memcpy(d, bin.data, bin.len);
	d[bin.len] = 0; /* a trailing byte */
	CHECK(parse_bytes(d, bin.len + 1) == VPS_EFORMAT);
	free(d);
	vps_bytes_release(&bin);
	vps_layout_free(l);
}

TEST(yaml_errors_name_the_line)
{
	const char *doc = "vps: layout\nversion: 1\nhash: 0x0\nmodel:\n  name: m\n  hidden: 64\n  layers: 2\n"
			  "  heads: 4\n  ffn: 128\n  vocab: 100\nparallel:\n  tp: 3\ndevices:\n  mode: packed\nranks: []\n";
	CHECK(parse_bytes((const unsigned char *)doc, strlen(doc)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "f: line 12: parallel: tp=3 does not divide heads=4") != NULL);
	const char *future = "vps: layout\nversion: 7\n";
	CHECK(parse_bytes((const unsigned char *)future, strlen(future)) == VPS_EFORMAT);
	const char *other = "vps: model\nversion: 1\n";
	CHECK(parse_bytes((const unsigned char *)other, strlen(other)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "f: line 1: a model, not a layout (vps-layout --model MODEL --parallel SPEC -o FILE "
					"makes one)") != NULL);
}

/* A document of n bytes: `vps: layout`, then `ranks:` and open/close
 * brackets of the given kind nested as deep as the size allows. */
static char *nested_doc(size_t n, char open, char close)
{
	char *d = malloc(n + 1);
	const char *head = "vps: layout\nversion: 1\nranks: ";
	size_t h = strlen(head), depth = (n - h - 1) / 2;
	memcpy(d, head, h);
	memset(d + h, open, depth);
	memset(d + h + depth, close, depth);
	d[h + 2 * depth] = '\n';
	d[h + 2 * depth + 1] = '\0';
	return d;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* 200 KB of nested flow collections took 37 s in libyaml (its scanner walks
 * every open collection for every token): refused at the depth bound,
 * naming the file and line, long before that. */
TEST(deep_yaml_nesting_is_refused_fast)
{
	const char pairs[][2] = {{'[', ']'}, {'{', '}'}};
	for (size_t k = 0; k < 2; k++) {
		char *d = nested_doc(200 * 1024, pairs[k][0], pairs[k][1]);
		double t0 = now_s();
		CHECK(parse_bytes((const unsigned char *)d, strlen(d)) == VPS_EINPUT);
		double dt = now_s() - t0;
		CHECK(strstr(vps_last_error(), "f: line 3: nested deeper than 64 levels") != NULL);
		/* generous: the refusal takes about a millisecond */
		CHECK(dt < 5.0);
		free(d);
	}
	/* block nesting is bounded too */
	struct vps_bytes b = {0};
	CHECK_OK(vps_bytes_append(&b, "vps: layout\nversion: 1\nranks:\n", 30));
	for (int i = 0; i < 70; i++) {
		char line[200];
		int n = snprintf(line, sizeof(line), "%*sk%d:\n", i + 1, "", i);
		CHECK_OK(vps_bytes_append(&b, line, (size_t)n));
	}
	CHECK(parse_bytes(b.data, b.len) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "nested deeper than 64 levels") != NULL);
	vps_bytes_release(&b);
}

/* Aliases let a few bytes stand for a subtree read again at each reference
 * (a billion laughs); vps never writes them and refuses them. */
TEST(yaml_anchors_and_aliases_are_refused)
{
	const char *alias = "vps: layout\nversion: 1\nhash: 0x0\nx: &a [1, 2]\ny: [*a, *a]\n";
	CHECK(parse_bytes((const unsigned char *)alias, strlen(alias)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "f: line 4: YAML anchors (&a) are not supported") != NULL);
	const char *bare = "vps: layout\nversion: 1\nhash: *nowhere\n";
	CHECK(parse_bytes((const unsigned char *)bare, strlen(bare)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "f: line 3: YAML aliases (*nowhere) are not supported") != NULL);
}

/* A binary string YAML cannot carry (found by fuzz_binary: a layout read
 * from binary could not be written as YAML): refused on reading. */
TEST(binary_strings_must_be_utf8_text)
{
	const char *bad[] = {"\x8dini-moe", "a\xc0\x80", "\xed\xa0\x80", "ok\xf4\x90\x80\x80"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) + 1; i++) {
		const char *s = i < sizeof(bad) / sizeof(bad[0]) ? bad[i] : "gr\xc3\xbc\xc3\x9f \xe2\x82\xac";
		struct vps_writer *w;
		struct vps_bytes b = {0};
		CHECK_OK(vps_writer_new(&w, VPS_DOC_MODEL, false));
		CHECK_OK(vps_w_str(w, "name", s));
		CHECK_OK(vps_writer_finish(w, &b));
		vps_writer_free(w);
		struct vps_reader *r;
		const char *got = NULL;
		CHECK_OK(vps_reader_new(&r, "f", b.data, b.len, VPS_DOC_MODEL));
		vps_result_t rc = vps_r_str(r, "name", &got);
		if (i < sizeof(bad) / sizeof(bad[0])) {
			CHECK(rc == VPS_EFORMAT);
			CHECK(strstr(vps_last_error(), "f: name: corrupt string (not UTF-8 text)") != NULL);
		} else {
			CHECK(rc == VPS_OK && got && strcmp(got, s) == 0);
		}
		vps_reader_free(r);
		vps_bytes_release(&b);
	}
}

/* A binary document far larger than the reader's window (it is read as it
 * is decompressed): every value comes back, strings that repeat are handed
 * out once (interned), strings of every length around a repeat are told
 * apart, a damaged end is found by vps_reader_finish, and a string longer
 * than the window is read whole. */
TEST(binary_documents_larger_than_the_window_read_back)
{
	enum { N = 400000 };
	static char big[9 << 20];
	memset(big, 'x', sizeof(big) - 1);
	struct vps_writer *w;
	struct vps_bytes b = {0};
	CHECK_OK(vps_writer_new(&w, VPS_DOC_MODEL, false));
	CHECK_OK(vps_w_seq_begin(w, "items", N, false));
	char name[32];
	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "t%.*s", i % 7, "abcdefg"); /* t, ta, tab, ...: prefixes of each other */
		CHECK_OK(vps_w_map_begin(w, NULL));
		CHECK_OK(vps_w_str(w, "name", name));
		CHECK_OK(vps_w_int(w, "v", (int64_t)i * 7919));
		CHECK_OK(vps_w_map_end(w));
	}
	CHECK_OK(vps_w_seq_end(w));
	CHECK_OK(vps_w_str(w, "big", big));
	CHECK_OK(vps_writer_finish(w, &b));
	vps_writer_free(w);
	struct vps_reader *r;
	uint64_t n = 0;
	CHECK_OK(vps_reader_new(&r, "f", b.data, b.len, VPS_DOC_MODEL));
	CHECK_OK(vps_r_seq_begin(r, "items", &n));
	CHECK_EQ(n, N);
	const char *first[7] = {0};
	int bad = 0;
	for (int i = 0; i < N && !bad; i++) {
		const char *s;
		int64_t v;
		snprintf(name, sizeof(name), "t%.*s", i % 7, "abcdefg");
		bad |= vps_r_map_begin(r, NULL) || vps_r_str(r, "name", &s) || vps_r_int(r, "v", &v, 0, INT64_MAX) ||
		       vps_r_map_end(r) || strcmp(s, name) || v != (int64_t)i * 7919 ||
		       (first[i % 7] && first[i % 7] != s);
		first[i % 7] = s;
	}
	CHECK(!bad);
	CHECK_OK(vps_r_seq_end(r));
	const char *s = NULL;
	CHECK_OK(vps_r_str(r, "big", &s));
	CHECK(s && strlen(s) == sizeof(big) - 1);
	CHECK_OK(vps_reader_finish(r));
	vps_reader_free(r);
	/* the last byte of the frame (its checksum) damaged: the values read
	 * fine, the end does not */
	b.data[b.len - 1] ^= 0x55;
	CHECK_OK(vps_reader_new(&r, "f", b.data, b.len, VPS_DOC_MODEL));
	CHECK_OK(vps_r_seq_begin(r, "items", &n));
	vps_result_t rc = VPS_OK;
	for (uint64_t i = 0; i < n && !rc; i++) {
		int64_t v;
		rc = vps_r_map_begin(r, NULL);
		if (!rc)
			rc = vps_r_str(r, "name", &s);
		if (!rc)
			rc = vps_r_int(r, "v", &v, 0, INT64_MAX);
		if (!rc)
			rc = vps_r_map_end(r);
	}
	if (!rc)
		rc = vps_r_seq_end(r);
	if (!rc)
		rc = vps_r_str(r, "big", &s);
	if (!rc)
		rc = vps_reader_finish(r);
	CHECK(rc == VPS_EFORMAT);
	CHECK(strstr(vps_last_error(), "f: corrupt document") != NULL);
	vps_reader_free(r);
	vps_bytes_release(&b);
}
