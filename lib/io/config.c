/* Configs named on the command line (io/doc.h): a path, or a name looked
 * up in a search path. */
#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

#include "io/doc.h"
#include "util/internal.h"

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n > k && !strcmp(s + n - k, suffix);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The NAMEs of the NAME.yaml files in the directories of search_path,
 * sorted, each once, as "a, b, c" in out ("" when there are none): what a
 * user who mistyped a name can give instead. At most KNOWN_MAX are read;
 * a list that does not fit in out ends with "...". */
#define KNOWN_MAX 512
static void known_names(const char *search_path, char *out, size_t n)
{
	char *names[KNOWN_MAX];
	size_t count = 0;
	bool more = false;
	out[0] = '\0';
	for (const char *s = search_path ? search_path : ""; *s;) {
		const char *colon = strchr(s, ':');
		size_t dl = colon ? (size_t)(colon - s) : strlen(s);
		char dir[4096];
		DIR *d = NULL;
		if (dl && dl < sizeof(dir)) {
			memcpy(dir, s, dl);
			dir[dl] = '\0';
			d = opendir(dir);
		}
		for (struct dirent *e; d && (e = readdir(d));) {
			size_t len = strlen(e->d_name);
			if (e->d_name[0] == '.' || !ends_with(e->d_name, ".yaml"))
				continue;
			if (count == KNOWN_MAX) {
				more = true;
				break;
			}
			char *name = strndup(e->d_name, len - strlen(".yaml"));
			if (!name) {
				more = true;
				break;
			}
			names[count++] = name;
		}
		if (d)
			closedir(d);
		s = colon ? colon + 1 : s + dl;
	}
	qsort(names, count, sizeof(*names), cmp_name);
	size_t used = 0;
	for (size_t i = 0; i < count; i++) {
		if (i && !strcmp(names[i], names[i - 1]))
			continue;
		/* room for this name, its separator and a closing "..." */
		size_t need = strlen(names[i]) + 2;
		if (used + need + 4 >= n) {
			more = true;
			break;
		}
		used += (size_t)snprintf(out + used, n - used, "%s%s", used ? ", " : "", names[i]);
	}
	if (more && used + 4 < n)
		snprintf(out + used, n - used, "%s...", used ? ", " : "");
	for (size_t i = 0; i < count; i++)
		free(names[i]);
}

vps_result_t vps_config_find(const char *arg, const char *search_path, const char *what, char *path, size_t n)
{
	if (strchr(arg, '/') || !strcmp(arg, "-") || ends_with(arg, ".yaml") || ends_with(arg, ".yml") ||
	    ends_with(arg, ".json")) {
		snprintf(path, n, "%s", arg);
		return VPS_OK;
	}
	for (const char *s = search_path ? search_path : ""; *s;) {
		const char *colon = strchr(s, ':');
		size_t dl = colon ? (size_t)(colon - s) : strlen(s);
		snprintf(path, n, "%.*s/%s.yaml", (int)dl, s, arg);
		if (dl && access(path, R_OK) == 0)
			return VPS_OK;
		s = colon ? colon + 1 : s + dl;
	}
	char known[1024];
	known_names(search_path, known, sizeof(known));
	/* vps_model_load takes Hugging Face directories too */
	const char *also = !strcmp(what, "model") ? "; or a model file, a Hugging Face config.json or its directory" : "";
	if (known[0])
		return vps_fail(VPS_ENOTFOUND, "no %s named '%s'; known: %s%s (looked for %s.yaml in %s)", what, arg,
				known, also, arg, search_path);
	return vps_fail(VPS_ENOTFOUND, "no %s named '%s'%s (looked for %s.yaml in %s; none there)", what, arg, also,
			arg, search_path && *search_path ? search_path : "no directory");
}
