/* Configs named on the command line (io/doc.h): a path, or a name looked
 * up in a search path. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/doc.h"
#include "util/internal.h"

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n > k && !strcmp(s + n - k, suffix);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void vps_config_names_free(char **names, size_t n)
{
	for (size_t i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
}

/* At most this many are read: a directory of more is not a user's. */
#define NAMES_MAX 4096

vps_result_t vps_config_names(const char *search_path, char ***names, size_t *n)
{
	char **v = NULL;
	size_t count = 0, cap = 0;
	vps_result_t rc = VPS_OK;
	*names = NULL;
	*n = 0;
	for (const char *s = search_path ? search_path : ""; *s && !rc;) {
		const char *colon = strchr(s, ':');
		size_t dl = colon ? (size_t)(colon - s) : strlen(s);
		char dir[4096];
		DIR *d = NULL;
		if (dl && dl < sizeof(dir)) {
			memcpy(dir, s, dl);
			dir[dl] = '\0';
			d = opendir(dir);
		}
		for (struct dirent *e; d && !rc && count < NAMES_MAX && (e = readdir(d));) {
			if (e->d_name[0] == '.' || !ends_with(e->d_name, ".yaml"))
				continue;
			char *name = strndup(e->d_name, strlen(e->d_name) - strlen(".yaml"));
			if (!name || (rc = VPS_GROW(v, cap, count + 1))) {
				free(name);
				rc = vps_fail(VPS_ENOMEM, "out of memory listing %s", dir);
				break;
			}
			v[count++] = name;
		}
		if (d)
			closedir(d);
		s = colon ? colon + 1 : s + dl;
	}
	if (rc) {
		vps_config_names_free(v, count);
		return rc;
	}
	if (count)
		qsort(v, count, sizeof(*v), cmp_name);
	size_t kept = 0;
	for (size_t i = 0; i < count; i++) {
		if (kept && !strcmp(v[i], v[kept - 1]))
			free(v[i]);
		else
			v[kept++] = v[i];
	}
	*names = v;
	*n = kept;
	return VPS_OK;
}

/* The edits (insert, delete, replace a character) from a to b, of their
 * first 63 characters: how far a mistyped name is from a known one. */
static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strnlen(a, 63), lb = strnlen(b, 63), row[64];
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			diag = up;
			row[j] = best;
		}
	}
	return row[lb];
}

/* Closest first: a name the typed one begins, then by fewest edits, then
 * by the longer common beginning, then by name. */
struct candidate {
	const char *name;
	bool begins;
	size_t edits, common;
};

static int cmp_candidate(const void *pa, const void *pb)
{
	const struct candidate *a = pa, *b = pb;
	if (a->begins != b->begins)
		return a->begins ? -1 : 1;
	if (a->edits != b->edits)
		return a->edits < b->edits ? -1 : 1;
	if (a->common != b->common)
		return a->common > b->common ? -1 : 1;
	return strcmp(a->name, b->name);
}

/* A list this long is shown whole; a longer one, its closest names. */
#define KNOWN_ALL 16
#define KNOWN_CLOSEST 8

/* The command that names every config of a kind, for a list too long to
 * show. */
static const char *list_command(const char *what)
{
	return !strcmp(what, "transition") ? "vps-plan --transition list" : NULL;
}

/* What a user who mistyped arg can give instead, into out (""
 * when there is nothing): every name, sorted, when they are few; else the
 * closest to arg, and how many there are (and how to list them). */
static void known_names(const char *arg, const char *search_path, const char *what, char *out, size_t n)
{
	char **names;
	size_t count, used = 0;
	out[0] = '\0';
	if (vps_config_names(search_path, &names, &count) || !count)
		return;
	struct candidate *c = calloc(count, sizeof(*c));
	size_t show = count;
	if (count > KNOWN_ALL && c) {
		for (size_t i = 0; i < count; i++) {
			size_t k = 0;
			while (arg[k] && arg[k] == names[i][k])
				k++;
			c[i] = (struct candidate){names[i], !arg[k], edit_distance(arg, names[i]), k};
		}
		qsort(c, count, sizeof(*c), cmp_candidate);
		show = KNOWN_CLOSEST;
	} else {
		for (size_t i = 0; c && i < count; i++)
			c[i].name = names[i];
	}
	if (c) {
		used = (size_t)snprintf(out, n, "%s: ", show < count ? "closest" : "known");
		for (size_t i = 0; i < show && used < n; i++)
			used += (size_t)snprintf(out + used, n - used, "%s%s", i ? ", " : "", c[i].name);
		const char *list = list_command(what);
		if (show < count && used < n && list)
			snprintf(out + used, n - used, "; %s names all %zu", list, count);
		else if (show < count && used < n)
			snprintf(out + used, n - used, "; %zu in all", count);
	}
	free(c);
	vps_config_names_free(names, count);
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
	char known[2048];
	known_names(arg, search_path, what, known, sizeof(known));
	/* vps_model_load takes Hugging Face directories too */
	const char *also = !strcmp(what, "model") ? "; or a model file, a Hugging Face config.json or its directory" : "";
	if (known[0])
		return vps_fail(VPS_ENOTFOUND, "no %s named '%s'; %s%s (looked for %s.yaml in %s)", what, arg, known, also,
				arg, search_path);
	return vps_fail(VPS_ENOTFOUND, "no %s named '%s'%s (looked for %s.yaml in %s; none there)", what, arg, also,
			arg, search_path && *search_path ? search_path : "no directory");
}
