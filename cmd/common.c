#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "vps/units.h"

/* ---- messages and exit statuses ---- */

int tool_status(vps_result_t rc)
{
	switch (rc) {
	case VPS_EINPUT:
	case VPS_EFORMAT:
	case VPS_EUNSUPPORTED:
	case VPS_ENOTFOUND:
	case VPS_ESTALE:
	case VPS_EBUSY:
	case VPS_ENOMEM: /* the memory it needs, a /dev/shm too small among them */
		return EXIT_USAGE; /* what the user asked for is wrong, names nothing or cannot be had now */
	default: return EXIT_CHECK;
	}
}

const char *tool_message(vps_result_t rc, char *buf, size_t n)
{
	const char *msg = vps_last_error();
	if (!*msg)
		msg = vps_strerror(rc);
	if (rc == VPS_EINTERNAL)
		snprintf(buf, n, "%s: %s", vps_strerror(rc), msg);
	else
		snprintf(buf, n, "%s", msg);
	return buf;
}

int tool_fail(vps_result_t rc)
{
	char msg[4096];
	fprintf(stderr, "%s: %s\n", tool_name, tool_message(rc, msg, sizeof(msg)));
	return tool_status(rc);
}

int tool_fail_at(const char *where, vps_result_t rc)
{
	char msg[4096];
	fprintf(stderr, "%s: %s: %s\n", tool_name, where, tool_message(rc, msg, sizeof(msg)));
	return tool_status(rc);
}

int tool_fail_lookup(const char *flag, vps_result_t rc)
{
	return rc == VPS_ENOTFOUND ? tool_fail_at(flag, rc) : tool_fail(rc);
}

static void vmessage(const char *fmt, va_list ap)
{
	char msg[4096];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	fprintf(stderr, "%s: %s\n", tool_name, msg);
}

int tool_error(int status, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmessage(fmt, ap);
	va_end(ap);
	return status;
}

int tool_usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmessage(fmt, ap);
	va_end(ap);
	fprintf(stderr, "Try '%s -h' for more.\n", tool_name);
	return EXIT_USAGE;
}

int tool_help(const char *usage)
{
	fputs(usage, stdout);
	return tool_finish(EXIT_OK);
}

int tool_version(void)
{
	printf("%s %s\n", tool_name, vps_version());
	return tool_finish(EXIT_OK);
}

int tool_finish(int status)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "%s: error writing standard output: %s\n", tool_name, strerror(errno));
		return status ? status : EXIT_CHECK;
	}
	return status;
}

/* ---- the command line ---- */

static bool parse_format(const char *arg, void *format, char *why, size_t n)
{
	if (!vps_format_parse(arg, format))
		return true;
	snprintf(why, n, "%s", vps_last_error());
	return false;
}

/* The flags tools share (enum tool_shared), and where each keeps its value. */
static const struct {
	unsigned bit;
	const char *name;
	char short_name;
	enum tool_kind kind;
	size_t offset; /* in struct tool_common */
	tool_parse_fn *parse;
} shared_options[] = {
	{TOOL_OUTPUT, "output", 'o', TOOL_STRING, offsetof(struct tool_common, out), NULL},
	{TOOL_YAML, "yaml", 0, TOOL_BOOL, offsetof(struct tool_common, yaml), NULL},
	{TOOL_JSON, "json", 0, TOOL_BOOL, offsetof(struct tool_common, json), NULL},
	{TOOL_HUMAN, "human", 'H', TOOL_BOOL, offsetof(struct tool_common, human), NULL},
	{TOOL_QUIET, "quiet", 'q', TOOL_BOOL, offsetof(struct tool_common, quiet), NULL},
	{TOOL_FORMAT, "format", 0, TOOL_FUNC, offsetof(struct tool_common, format), parse_format},
};
#define NSHARED (sizeof(shared_options) / sizeof(shared_options[0]))

/* getopt_long's val of each option past any character: the tool's own
 * from OWN, the shared from SHARED; -h and --version. */
enum { OWN = 256, SHARED = 512, HELP = 'h', VERSION = 1024 };

static size_t count_options(const struct tool_cli *cli)
{
	size_t n = 0;
	while (cli->options[n].name)
		n++;
	return n;
}

/* The option of getopt_long's val (a character for a short option), the
 * shared ones made into one over their place in cli->common. */
static bool option_of(struct tool_cli *cli, int val, struct tool_option *o)
{
	for (size_t i = 0; val < OWN && cli->options[i].name; i++)
		if (cli->options[i].short_name == val)
			val = OWN + (int)i;
	for (size_t i = 0; i < NSHARED && val < OWN; i++)
		if ((cli->shared & shared_options[i].bit) && shared_options[i].short_name == val)
			val = SHARED + (int)i;
	if (val >= SHARED && val < SHARED + (int)NSHARED) {
		size_t i = (size_t)(val - SHARED);
		*o = (struct tool_option){.name = shared_options[i].name,
					  .kind = shared_options[i].kind,
					  .value = (char *)&cli->common + shared_options[i].offset,
					  .parse = shared_options[i].parse};
		cli->common.given |= shared_options[i].bit;
		return true;
	}
	if (val < OWN || (size_t)(val - OWN) >= count_options(cli))
		return false;
	*o = cli->options[val - OWN];
	cli->given[val - OWN] = true;
	return true;
}

/* A size split at its blank ("--budget 2 GiB"): the argument ends in a
 * digit and the next one is a unit alone. */
static bool split_size(const char *arg, const char *next)
{
	char joined[16];
	int64_t v;
	if (!next || !*arg || !isdigit((unsigned char)arg[strlen(arg) - 1]) || !isalpha((unsigned char)next[0]) ||
	    strlen(next) > 4)
		return false;
	snprintf(joined, sizeof(joined), "1%s", next);
	return !vps_parse_bytes(joined, &v);
}

/* Set o's value from its argument (NULL for a flag); next is the argument
 * after it, or NULL. */
static int set_value(const struct tool_option *o, const char *arg, const char *next)
{
	char why[1024] = "";
	int64_t v;
	char *end;
	switch (o->kind) {
	case TOOL_BOOL: *(bool *)o->value = true; return TOOL_PARSED;
	case TOOL_STRING: *(const char **)o->value = arg; return TOOL_PARSED;
	case TOOL_INT:
		if (!tool_parse_i64(arg, &v))
			snprintf(why, sizeof(why), "'%s' is not %s", arg, o->what);
		else if (v < o->min || v > o->max)
			snprintf(why, sizeof(why), "%" PRId64 " is not %s", v, o->what);
		else
			return *(int64_t *)o->value = v, TOOL_PARSED;
		break;
	case TOOL_SECONDS: {
		errno = 0;
		double s = strtod(arg, &end);
		if (*arg && !*end && !errno && isfinite(s) && s > 0)
			return *(double *)o->value = s, TOOL_PARSED;
		snprintf(why, sizeof(why), "'%s' is not a positive number of seconds", arg);
		break;
	}
	case TOOL_SIZE:
		if (vps_parse_bytes(arg, &v))
			snprintf(why, sizeof(why), "%s", vps_last_error());
		else if (split_size(arg, next))
			snprintf(why, sizeof(why), "'%s %s' is one size in two arguments: write %s%s, without the blank", arg,
				 next, arg, next);
		else
			return *(int64_t *)o->value = v, TOOL_PARSED;
		break;
	case TOOL_FUNC:
		if (o->parse(arg, o->value, why, sizeof(why)))
			return TOOL_PARSED;
		break;
	}
	return tool_usage_error("--%s: %s", o->name, why);
}

/* Append "--name" to a list of names. */
static void add_name(char *names, size_t size, size_t *n, const char *name, const char *sep)
{
	size_t len = strlen(names);
	if (len < size)
		snprintf(names + len, size - len, "%s--%s", (*n)++ ? sep : "", name);
}

/* Append word to the command line in buf, quoted for a shell where it
 * needs to be. */
static void add_word(char *buf, size_t size, const char *word)
{
	size_t len = strlen(buf);
	bool plain = *word != '\0';
	for (const char *c = word; *c; c++)
		if (!isalnum((unsigned char)*c) && !strchr("-_./=:,+%@", *c))
			plain = false;
	if (len >= size)
		return;
	if (plain) {
		snprintf(buf + len, size - len, "%s%s", len ? " " : "", word);
		return;
	}
	len += (size_t)snprintf(buf + len, size - len, "%s'", len ? " " : "");
	for (const char *c = word; *c && len < size; c++)
		len += (size_t)snprintf(buf + len, size - len, *c == '\'' ? "'\\''" : "%c", *c);
	if (len < size)
		snprintf(buf + len, size - len, "'");
}

/* The tool's own option of that long name, or NULL. */
static const struct tool_option *own_option(const struct tool_cli *cli, const char *name)
{
	for (size_t i = 0; cli->options[i].name; i++)
		if (!strcmp(cli->options[i].name, name))
			return &cli->options[i];
	return NULL;
}

/* -i or --input given to a tool that reads its files as operands: the
 * command line without it, as a hint (buf "" when it is none of those). */
static void input_hint(const struct tool_cli *cli, int argc, char **argv, const char *spelled, char *buf, size_t n)
{
	buf[0] = '\0';
	if (own_option(cli, "input") || (strcmp(spelled, "-i") && strcmp(spelled, "--input") &&
					 strncmp(spelled, "--input=", 8)))
		return;
	add_word(buf, n, tool_name);
	for (int i = 1; i < argc; i++)
		if (argv[i] != spelled)
			add_word(buf, n, argv[i]);
		else if (!strncmp(spelled, "--input=", 8))
			add_word(buf, n, spelled + 8);
}

/* What getopt_long refused: an option no entry has, one that lacks its
 * argument, or one given a value it does not take. */
static int getopt_error(const struct tool_cli *cli, int c, const char *spelled, int argc, char **argv)
{
	char name[128], names[512] = "";
	/* optopt: the short option, or the val of a long one that lacks or has
	 * a value; 0 for a long one no entry has. spelled, argv[optind - 1], is
	 * the long option's own argument (not a short one's: it may sit inside
	 * a cluster, -qZ) */
	snprintf(name, sizeof(name), "%s", spelled);
	name[strcspn(name, "=")] = '\0';
	if (c == ':' && optopt < OWN)
		return tool_usage_error("-%c needs a value", optopt);
	if (c == ':')
		return tool_usage_error("%s needs a value", name);
	if (optopt >= OWN || (optopt == HELP && !strncmp(name, "--", 2)))
		return tool_usage_error("%s takes no value", name);
	char hint[1024];
	input_hint(cli, argc, argv, spelled, hint, sizeof(hint));
	if (hint[0])
		return tool_usage_error("unknown option %s; %s reads the files named as operands: %s",
					optopt ? "-i" : "--input", tool_name, hint);
	if (optopt)
		return tool_usage_error("unknown option -%c", optopt);
	/* getopt_long takes any prefix of one name: say which names it begins */
	size_t n = 0, plen = strlen(name) - 2;
	for (size_t i = 0; cli->options[i].name; i++)
		if (!strncmp(cli->options[i].name, name + 2, plen))
			add_name(names, sizeof(names), &n, cli->options[i].name, " or ");
	for (size_t i = 0; i < NSHARED; i++)
		if ((cli->shared & shared_options[i].bit) && !strncmp(shared_options[i].name, name + 2, plen))
			add_name(names, sizeof(names), &n, shared_options[i].name, " or ");
	if (n > 1 && plen)
		return tool_usage_error("%s is ambiguous: %s?", name, names);
	return tool_usage_error("unknown option %s", name);
}

static void add_short(char *shorts, size_t *s, char c, enum tool_kind kind)
{
	if (!c)
		return;
	shorts[(*s)++] = c;
	if (kind != TOOL_BOOL)
		shorts[(*s)++] = ':';
}

/* getopt_long's tables for cli: the tool's options, the shared ones it
 * takes, -h and --version. shorts holds 2 + 2 * (options + NSHARED) + 1. */
static struct option *long_options(const struct tool_cli *cli, char *shorts)
{
	size_t own = count_options(cli), k = 0, s = 0;
	struct option *lo = calloc(own + NSHARED + 3, sizeof(*lo));
	if (!lo)
		return NULL;
	shorts[s++] = ':'; /* a missing argument: ':', not '?' */
	shorts[s++] = 'h';
	for (size_t i = 0; i < own; i++) {
		const struct tool_option *o = &cli->options[i];
		int has = o->kind == TOOL_BOOL ? no_argument : o->optional ? optional_argument : required_argument;
		lo[k++] = (struct option){o->name, has, NULL, OWN + (int)i};
		add_short(shorts, &s, o->short_name, o->kind);
	}
	for (size_t i = 0; i < NSHARED; i++) {
		if (!(cli->shared & shared_options[i].bit))
			continue;
		lo[k++] = (struct option){shared_options[i].name, shared_options[i].kind == TOOL_BOOL ? no_argument
												       : required_argument,
					  NULL, SHARED + (int)i};
		add_short(shorts, &s, shared_options[i].short_name, shared_options[i].kind);
	}
	lo[k++] = (struct option){"help", no_argument, NULL, HELP};
	lo[k++] = (struct option){"version", no_argument, NULL, VERSION};
	shorts[s] = '\0';
	return lo;
}

/* Whether the option of that long name was given; -1 when cli has none of
 * that name (a rule that names a wrong one). */
static int given(const struct tool_cli *cli, const char *name, size_t len)
{
	for (size_t i = 0; cli->options[i].name; i++)
		if (strlen(cli->options[i].name) == len && !strncmp(cli->options[i].name, name, len))
			return cli->given[i];
	for (size_t i = 0; i < NSHARED; i++)
		if ((cli->shared & shared_options[i].bit) && strlen(shared_options[i].name) == len &&
		    !strncmp(shared_options[i].name, name, len))
			return (cli->common.given & shared_options[i].bit) != 0;
	return -1;
}

bool tool_given(const struct tool_cli *cli, const char *name)
{
	return given(cli, name, strlen(name)) == 1;
}

/* Of the blank-separated names in list: the first given into first (""
 * when none), each into names (joined by sep). false when one names no
 * option. */
static bool scan(const struct tool_cli *cli, const char *list, char *first, char *names, size_t size, const char *sep)
{
	size_t n = 0;
	first[0] = names[0] = '\0';
	for (const char *p = list ? list : ""; *p;) {
		size_t len = strcspn(p, " ");
		int g = given(cli, p, len);
		char name[64];
		if (g < 0 || len >= sizeof(name))
			return false;
		snprintf(name, sizeof(name), "%.*s", (int)len, p);
		if (g && !first[0])
			snprintf(first, 64, "%s", name);
		add_name(names, size, &n, name, sep);
		p += len + strspn(p + len, " ");
	}
	return true;
}

/* The first rule that the given options break: its usage error, said
 * when say is true. */
static int check_rules(const struct tool_cli *cli, bool say)
{
	for (const struct tool_rule *r = cli->rules; r && (r->when || r->needs || r->excludes); r++) {
		char when[64], need[64], excluded[64], needs[512], any[512];
		if (!scan(cli, r->when, when, any, sizeof(any), ", ") || !scan(cli, r->needs, need, needs, sizeof(needs), " or ") ||
		    !scan(cli, r->excludes, excluded, any, sizeof(any), ", "))
			return say ? tool_error(EXIT_CHECK, "a rule names an option %s does not have (a bug in vps)", tool_name)
				   : EXIT_CHECK;
		if (r->when && !when[0])
			continue;
		if (r->needs && !need[0]) {
			if (!say)
				return EXIT_USAGE;
			if (r->message)
				return tool_usage_error("%s", r->message);
			if (!r->when)
				return tool_usage_error("%s is required", needs);
			return tool_usage_error("--%s goes with %s", when, needs);
		}
		if (r->excludes && excluded[0]) {
			if (!say)
				return EXIT_USAGE;
			return r->message ? tool_usage_error("%s", r->message)
					  : tool_usage_error("--%s does not go with --%s", when, excluded);
		}
	}
	return TOOL_PARSED;
}

int tool_parse(struct tool_cli *cli, int argc, char **argv)
{
	size_t own = count_options(cli);
	char shorts[2 * (sizeof(cli->given) + NSHARED) + 3];
	if (own > sizeof(cli->given))
		return tool_error(EXIT_CHECK, "%zu options: more than a tool may have (a bug in vps)", own);
	struct option *lo = long_options(cli, shorts);
	if (!lo)
		return tool_error(EXIT_CHECK, "out of memory");
	int c, status = TOOL_PARSED;
	opterr = 0; /* its messages are ours, on one line */
	while (status == TOOL_PARSED && (c = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		struct tool_option o;
		if (c == HELP)
			status = tool_help(cli->usage);
		else if (c == VERSION)
			status = tool_version();
		else if (c == ':' || c == '?')
			status = getopt_error(cli, c, argv[optind - 1], argc, argv);
		else if (!option_of(cli, c, &o))
			status = tool_error(EXIT_CHECK, "getopt_long returned %d, no option's (a bug in vps)", c);
		else
			status = set_value(&o, optarg, optind < argc ? argv[optind] : NULL);
	}
	free(lo);
	if (status != TOOL_PARSED)
		return status;
	cli->operands = argv + optind;
	cli->noperands = (size_t)(argc - optind);
	cli->options_given = argv + 1;
	cli->noptions_given = (size_t)(optind - 1);
	return check_rules(cli, true);
}

/* The command line with operand k given as "flag OPERAND" instead: first
 * (an input) or last (an output). */
static void with_flag(const struct tool_cli *cli, size_t k, const char *flag, bool first, char *buf, size_t n)
{
	buf[0] = '\0';
	add_word(buf, n, tool_name);
	if (first) {
		add_word(buf, n, flag);
		add_word(buf, n, cli->operands[k]);
	}
	for (size_t i = 0; i < cli->noptions_given; i++)
		add_word(buf, n, cli->options_given[i]);
	for (size_t i = 0; i < cli->noperands; i++)
		if (i != k)
			add_word(buf, n, cli->operands[i]);
	if (!first) {
		add_word(buf, n, flag);
		add_word(buf, n, cli->operands[k]);
	}
}

int tool_operands(const struct tool_cli *cli, size_t min, size_t max, const char *what)
{
	if (cli->noperands < min)
		return tool_usage_error("expected %s", what);
	if (cli->noperands <= max)
		return TOOL_PARSED;
	const char *extra = cli->operands[max];
	bool exists = !strcmp(extra, "-") || access(extra, F_OK) == 0;
	char hint[2048];
	/* after "--" a flag would be an operand: no line to suggest */
	for (size_t i = 0; i < cli->noptions_given; i++)
		if (!strcmp(cli->options_given[i], "--"))
			return tool_usage_error("%s: unexpected argument (expected %s)", extra, what);
	/* a hint only for a command line the tool's rules allow */
	struct tool_cli as_input = *cli, as_output = *cli;
	const struct tool_option *input = own_option(cli, "input");
	if (input && exists && !tool_given(cli, "input")) {
		as_input.given[input - cli->options] = true;
		if (check_rules(&as_input, false) == TOOL_PARSED) {
			with_flag(cli, max, "-i", true, hint, sizeof(hint));
			return tool_usage_error("%s: unexpected argument (expected %s); to read it: %s", extra, what, hint);
		}
	}
	/* an existing file is no output to suggest where it may be an input */
	as_output.common.given |= TOOL_OUTPUT;
	if ((cli->shared & TOOL_OUTPUT) && !(cli->common.given & TOOL_OUTPUT) && (!exists || max == 0) &&
	    check_rules(&as_output, false) == TOOL_PARSED) {
		with_flag(cli, max, "-o", false, hint, sizeof(hint));
		return tool_usage_error("%s: unexpected argument (expected %s); to write it: %s", extra, what, hint);
	}
	return tool_usage_error("%s: unexpected argument (expected %s)", extra, what);
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

static bool push(struct tool_ranks *r, int64_t v)
{
	if (r->n == r->cap) {
		size_t nc = r->cap ? r->cap * 2 : 16;
		int64_t *p = realloc(r->list, nc * sizeof(*p));
		if (!p)
			return false;
		r->list = p;
		r->cap = nc;
	}
	r->list[r->n++] = v;
	return true;
}

bool tool_parse_ranks(const char *s, struct tool_ranks *r)
{
	if (!strcmp(s, "all")) {
		r->all = true;
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
		for (long long x = a; x <= b; x++)
			if (!push(r, x))
				return false;
		if (*s == ',')
			s++;
		else if (*s)
			return false;
	}
	return true;
}

bool tool_rank_list(const char *arg, void *ranks, char *why, size_t n)
{
	if (tool_parse_ranks(arg, ranks))
		return true;
	snprintf(why, n, "'%s' is not a rank list (0,3,5-7 or all)", arg);
	return false;
}

bool tool_device(const char *arg, void *device, char *why, size_t n)
{
	int64_t d;
	if (tool_parse_i64(arg, &d) && d <= 1023) {
		*(int *)device = (int)d;
		return true;
	}
	snprintf(why, n, "'%s' is not a GPU number", arg);
	return false;
}

bool tool_state(const char *arg, void *state, char *why, size_t n)
{
	if (!vps_state_parse(arg, state))
		return true;
	snprintf(why, n, "%s (param, main_param, exp_avg, exp_avg_sq or grad)", vps_last_error());
	return false;
}

void tool_ranks_release(struct tool_ranks *r)
{
	free(r->list);
	*r = (struct tool_ranks){0};
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
	if (!human || !isfinite(v) || v == 0) {
		snprintf(buf, n, fmt, v);
		return buf;
	}
	/* three significant digits, counted after rounding (9.996 is 10.0),
	 * and an integer from 100 on, as vps(7) UNITS prints every number */
	char r[32];
	snprintf(r, sizeof(r), "%.3g", v);
	double a = fabs(strtod(r, NULL));
	int decimals = a >= 100 ? 0 : 2 - (int)floor(log10(a));
	snprintf(buf, n, "%.*f", decimals > 12 ? 12 : decimals, v);
	return buf;
}
