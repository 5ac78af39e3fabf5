/* Records: a table written in a format (vps/io.h). What vps-layout's and
 * vps-plan's queries answer in, and vps-plan --lost's ranges. */
#include <inttypes.h>
#include <stdio.h>
#include <strings.h>

#include "util/internal.h"
#include "vps/box.h"
#include "vps/io.h"

vps_result_t vps_format_parse(const char *s, enum vps_format *f)
{
	static const char *const names[] = {"yaml", "tsv", "json"};
	for (int i = 0; i < 3; i++)
		if (!strcmp(s, names[i])) {
			*f = (enum vps_format)i;
			return VPS_OK;
		}
	return vps_fail(VPS_EINPUT, "'%s' is not yaml, tsv or json", s);
}


static vps_result_t put(struct vps_bytes *b, const char *s) { return vps_bytes_append(b, s, strlen(s)); }

static vps_result_t putf(struct vps_bytes *b, const char *fmt, ...) VPS_PRINTF(2, 3);
static vps_result_t putf(struct vps_bytes *b, const char *fmt, ...)
{
	char buf[128];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(buf))
		return vps_fail(VPS_EINTERNAL, "a record value longer than %zu bytes", sizeof(buf));
	return vps_bytes_append(b, buf, (size_t)n);
}

static vps_result_t put_json_string(struct vps_bytes *b, const char *s)
{
	VPS_CHECK(put(b, "\""));
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\') {
			char e[2] = {'\\', (char)*p};
			VPS_CHECK(vps_bytes_append(b, e, 2));
		} else if (*p < 0x20 || *p == 0x7f) {
			VPS_CHECK(putf(b, "\\u%04x", *p));
		} else {
			VPS_CHECK(vps_bytes_append(b, p, 1));
		}
	}
	return put(b, "\"");
}

/* A YAML plain scalar that reads back as the same string: a letter first,
 * then letters, digits, '.', '_' or '-', and no word YAML 1.1 reads as a
 * boolean or null. Anything else is written double-quoted (JSON escaping,
 * which YAML reads). */
static bool yaml_plain(const char *s)
{
	static const char *const words[] = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"};
	if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
		return false;
	for (const char *p = s; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
		      *p == '_' || *p == '-'))
			return false;
	for (size_t i = 0; i < sizeof(words) / sizeof(*words); i++)
		if (!strcasecmp(s, words[i]))
			return false;
	return true;
}

/* TSV text: a tab, a newline or a backslash would break the columns. */
static vps_result_t put_tsv_string(struct vps_bytes *b, const char *s)
{
	for (const char *p = s; *p; p++) {
		const char *e = *p == '\t' ? "\\t" : *p == '\n' ? "\\n" : *p == '\r' ? "\\r" : *p == '\\' ? "\\\\" : NULL;
		VPS_CHECK(e ? put(b, e) : vps_bytes_append(b, p, 1));
	}
	return VPS_OK;
}

static vps_result_t put_value(struct vps_bytes *b, enum vps_format f, enum vps_field_type t, const struct vps_value *v)
{
	const char *sep = f == VPS_FORMAT_JSON ? "," : ", ";
	switch (t) {
	case VPS_FIELD_INT: return putf(b, "%" PRId64, v->i);
	case VPS_FIELD_STR:
		if (f == VPS_FORMAT_TSV)
			return put_tsv_string(b, v->s);
		if (f == VPS_FORMAT_YAML && yaml_plain(v->s))
			return put(b, v->s);
		return put_json_string(b, v->s);
	case VPS_FIELD_BOX:
		if (f != VPS_FORMAT_TSV)
			VPS_CHECK(put(b, "["));
		for (int k = 0; k < v->box->ndim; k++) {
			if (f == VPS_FORMAT_TSV)
				VPS_CHECK(putf(b, "%s%" PRId64 ":%" PRId64, k ? "," : "", v->box->lo[k], v->box->hi[k]));
			else
				VPS_CHECK(putf(b, "%s[%" PRId64 "%s%" PRId64 "]", k ? sep : "", v->box->lo[k], sep,
					       v->box->hi[k]));
		}
		return f == VPS_FORMAT_TSV ? VPS_OK : put(b, "]");
	case VPS_FIELD_INTS:
		if (f != VPS_FORMAT_TSV)
			VPS_CHECK(put(b, "["));
		for (int k = 0; k < v->nints; k++)
			VPS_CHECK(putf(b, "%s%" PRId64, k ? (f == VPS_FORMAT_TSV ? "," : sep) : "", v->ints[k]));
		return f == VPS_FORMAT_TSV ? VPS_OK : put(b, "]");
	}
	return vps_fail(VPS_EINTERNAL, "no record field has type %d", (int)t);
}

vps_result_t vps_records_begin(struct vps_records *r, struct vps_bytes *out, enum vps_format format,
			       const struct vps_field *fields, size_t nfields)
{
	*r = (struct vps_records){out, format, fields, nfields, 0};
	if (format != VPS_FORMAT_TSV)
		return VPS_OK;
	for (size_t i = 0; i < nfields; i++) {
		VPS_CHECK(put(out, i ? "\t" : ""));
		VPS_CHECK(put(out, fields[i].name));
	}
	return put(out, "\n");
}

vps_result_t vps_records_put(struct vps_records *r, const struct vps_value *v)
{
	struct vps_bytes *b = r->out;
	enum vps_format f = r->format;
	VPS_CHECK(put(b, f == VPS_FORMAT_YAML ? "- {" : f == VPS_FORMAT_JSON ? "{" : ""));
	for (size_t i = 0; i < r->nfields; i++) {
		if (f == VPS_FORMAT_TSV) {
			VPS_CHECK(put(b, i ? "\t" : ""));
		} else if (f == VPS_FORMAT_JSON) {
			VPS_CHECK(put(b, i ? "," : ""));
			VPS_CHECK(put_json_string(b, r->fields[i].name));
			VPS_CHECK(put(b, ":"));
		} else {
			VPS_CHECK(putf(b, "%s%s: ", i ? ", " : "", r->fields[i].name));
		}
		VPS_CHECK(put_value(b, f, r->fields[i].type, &v[i]));
	}
	VPS_CHECK(put(b, f == VPS_FORMAT_TSV ? "\n" : "}\n"));
	r->n++;
	return VPS_OK;
}

vps_result_t vps_records_end(struct vps_records *r)
{
	if (r->format == VPS_FORMAT_YAML && !r->n)
		return put(r->out, "[]\n");
	return VPS_OK;
}
