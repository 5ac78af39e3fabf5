/* Documents (io/doc.h): the kinds, their versions, and telling a document's
 * kind from its first bytes. The writer is writer.c, the reader reader.c. */
#include "io/doc.h"
#include "io/doc_int.h"
#include "util/internal.h"

/* The YAML version counts changes a YAML reader cannot absorb (keys are
 * optional, so new keys with defaults do not count). The binary encoding
 * writes every field in order, so any new field changes it: 2 for the
 * fields of November 2026 (cp, grouped_gemm, the DeepSeek-V3 model keys;
 * a report's digest_seconds, requested_at, started_at, done_at, release_seconds,
 * opened_in_pause and connections); 3 for a plan's relay (and the staged
 * plan that holds one); 4 for its relay mode and the bandwidths VPS_RELAY_AUTO
 * weighed. */
static const struct {
	enum vps_doc_kind kind;
	const char *name;
	int version, binary_version;
} doc_kinds[] = {
	{VPS_DOC_LAYOUT, "layout", 1, 2},     {VPS_DOC_PLAN, "plan", 1, 4},
	{VPS_DOC_STAGED, "staged", 1, 4},     {VPS_DOC_REPORT, "report", 1, 2},
	{VPS_DOC_MODEL, "model", 1, 2},       {VPS_DOC_DEVICES, "devices", 1, 1},
	{VPS_DOC_TOPOLOGY, "topology", 1, 1}, {VPS_DOC_PARALLEL, "parallel", 1, 2},
	{VPS_DOC_BUDGETS, "budgets", 1, 1},   {VPS_DOC_TRANSITION, "transition", 1, 2},
};

const char *vps_doc_kind_name(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < sizeof(doc_kinds) / sizeof(doc_kinds[0]); i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].name;
	return "unknown";
}

int vps_doc_version(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < sizeof(doc_kinds) / sizeof(doc_kinds[0]); i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].version;
	return 0;
}

int vps_doc_binary_version(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < sizeof(doc_kinds) / sizeof(doc_kinds[0]); i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].binary_version;
	return 0;
}

enum vps_doc_kind vps_doc_kind_from_name(const char *s)
{
	for (size_t i = 0; i < sizeof(doc_kinds) / sizeof(doc_kinds[0]); i++)
		if (strcmp(doc_kinds[i].name, s) == 0)
			return doc_kinds[i].kind;
	return 0;
}

bool vps_is_binary(const void *data, size_t len)
{
	return len >= 4 && memcmp(data, VPS_DOC_MAGIC, 4) == 0;
}

enum vps_doc_kind vps_doc_sniff(const void *data, size_t len)
{
	const unsigned char *d = data;
	if (vps_is_binary(data, len))
		return len >= 6 ? (enum vps_doc_kind)(d[4] | d[5] << 8) : 0;
	/* The writer puts `vps: KIND` first; people may not, so scan the first
	 * lines for it (or for "vps": "KIND" in JSON). */
	size_t lim = len < 4096 ? len : 4096;
	for (size_t i = 0; i + 6 < lim; i++) {
		if (memcmp(d + i, "\"vps\"", 5) != 0)
			continue;
		size_t j = i + 5;
		while (j < lim && (d[j] == ' ' || d[j] == ':' || d[j] == '\t'))
			j++;
		if (j < lim && d[j] == '"') {
			char name[32] = {0};
			size_t k = 0;
			for (j++; j < lim && k < sizeof(name) - 1 && d[j] != '"'; j++)
				name[k++] = (char)d[j];
			return vps_doc_kind_from_name(name);
		}
	}
	for (size_t i = 0; i + 5 < lim; i++) {
		if ((i == 0 || d[i - 1] == '\n') && memcmp(d + i, "vps:", 4) == 0) {
			size_t j = i + 4;
			while (j < lim && d[j] == ' ')
				j++;
			char name[32] = {0};
			size_t k = 0;
			while (j < lim && k < sizeof(name) - 1 && d[j] != '\n' && d[j] != ' ' && d[j] != '\r')
				name[k++] = (char)d[j++];
			return vps_doc_kind_from_name(name);
		}
	}
	return 0;
}
