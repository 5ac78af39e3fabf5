/* What every vps tool shares: the command line, messages, exit codes,
 * config lookup, output. */
#ifndef VPS_CMD_COMMON_H
#define VPS_CMD_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vps/vps.h"

/* Exit statuses (vps(7)). */
enum { EXIT_OK = 0, EXIT_CHECK = 1, EXIT_USAGE = 2 };

extern const char *tool_name;

/* ---- the command line (git's parse-options) ---- */

/* How an option's argument becomes its value. */
enum tool_kind {
	TOOL_BOOL,    /* bool *: true when given */
	TOOL_STRING,  /* const char **: the argument */
	TOOL_INT,     /* int64_t *: an integer from min to max, else "ARG is not WHAT" */
	TOOL_SECONDS, /* double *: a positive, finite number of seconds */
	TOOL_SIZE,    /* int64_t *: a size in bytes (vps(7) UNITS) */
	TOOL_FUNC,    /* parse(ARG, value, why, n): false, with what is wrong in why */
};

typedef bool tool_parse_fn(const char *arg, void *value, char *why, size_t n);

/* One option of a tool. Tables end with an entry whose name is NULL. */
struct tool_option {
	const char *name; /* the long name, without its dashes */
	char short_name;  /* or 0 */
	enum tool_kind kind;
	void *value;
	const char *what; /* TOOL_INT: what the value must be ("a rank") */
	int64_t min, max; /* TOOL_INT */
	tool_parse_fn *parse;
	bool optional;    /* TOOL_FUNC: the value may be left out (--name, or --name=VALUE); parse gets NULL */
};

/* value's type is checked against the kind's (git's BARF_UNLESS_*). */
#define TOOL_TYPED(type, v) (1 ? (v) : (type)0)
#define TOOL_OPT_BOOL(s, l, v) {.name = (l), .short_name = (s), .kind = TOOL_BOOL, .value = TOOL_TYPED(bool *, v)}
#define TOOL_OPT_STRING(s, l, v) \
	{.name = (l), .short_name = (s), .kind = TOOL_STRING, .value = TOOL_TYPED(const char **, v)}
#define TOOL_OPT_INT(l, v, lo, hi, w) \
	{.name = (l), .kind = TOOL_INT, .value = TOOL_TYPED(int64_t *, v), .what = (w), .min = (lo), .max = (hi)}
#define TOOL_OPT_COUNT(l, v) TOOL_OPT_INT(l, v, 0, INT64_MAX, "a non-negative integer")
#define TOOL_OPT_RANK(l, v) TOOL_OPT_INT(l, v, 0, INT64_MAX, "a rank")
#define TOOL_OPT_SECONDS(l, v) {.name = (l), .kind = TOOL_SECONDS, .value = TOOL_TYPED(double *, v)}
#define TOOL_OPT_SIZE(l, v) {.name = (l), .kind = TOOL_SIZE, .value = TOOL_TYPED(int64_t *, v)}
#define TOOL_OPT_FUNC(s, l, v, f) {.name = (l), .short_name = (s), .kind = TOOL_FUNC, .value = (v), .parse = (f)}
/* an option whose value is optional: --name, or --name=VALUE (never --name VALUE) */
#define TOOL_OPT_FUNC_OPTIONAL(l, v, f) {.name = (l), .kind = TOOL_FUNC, .value = (v), .parse = (f), .optional = true}
#define TOOL_OPT_END {.name = NULL}

/* The flags tools share, one table in common.c: each tool takes those its
 * mask names; -h/--help and --version every tool takes. */
enum tool_shared {
	TOOL_OUTPUT = 1 << 0, /* -o, --output FILE */
	TOOL_YAML = 1 << 1,   /* --yaml */
	TOOL_JSON = 1 << 2,   /* --json */
	TOOL_HUMAN = 1 << 3,  /* -H, --human */
	TOOL_QUIET = 1 << 4,  /* -q, --quiet */
	TOOL_FORMAT = 1 << 5, /* --format yaml|tsv|json */
};

/* Their values, and which were given. */
struct tool_common {
	const char *out;
	bool yaml, json, human, quiet;
	enum vps_format format;
	unsigned given; /* enum tool_shared */
};

/* Which options go together (git's die_for_incompatible_opt*): when any
 * of `when` is given (NULL: always), one of `needs` must be too, and none
 * of `excludes`. Names are long names, separated by blanks. A rule without
 * a message says "--a goes with --b" or "--a does not go with --b". */
struct tool_rule {
	const char *when, *needs, *excludes;
	const char *message;
};

/* A tool's command line: what it takes, and once parsed, its operands. */
struct tool_cli {
	const char *usage; /* the -h text */
	unsigned shared;   /* enum tool_shared */
	struct tool_common common;
	struct tool_option *options;   /* the tool's own */
	const struct tool_rule *rules; /* ending with a rule all NULL */
	bool given[64];                /* of options[i] */
	char **operands;
	size_t noperands;
	char **options_given; /* argv's options, before the operands (getopt_long moved them) */
	size_t noptions_given;
};

/* The status tool_parse returns when the tool goes on. */
#define TOOL_PARSED (-1)

/* Parse argv's options (operands may come first, as getopt_long allows),
 * fill the values and check the rules. -h and --version print and end.
 * @return TOOL_PARSED, with cli->operands set; or the exit status, having
 * printed -h, the version or a usage error. */
int tool_parse(struct tool_cli *cli, int argc, char **argv);
/* Whether the option of that long name was given. */
bool tool_given(const struct tool_cli *cli, const char *name);
/* TOOL_PARSED when the operands number from min to max; else a usage
 * error that says what was expected ("a staged plan") or the first
 * operand too many, and for that one what was likely meant: a file that
 * exists, to a tool that reads its input with -i, is read so ("to read
 * it: vps-layout -i a.layout ..."); a name that is no file, to a tool
 * with -o and none given, is written so ("to write it: ... -o b"). */
int tool_operands(const struct tool_cli *cli, size_t min, size_t max, const char *what);

/* ---- messages and exit statuses ---- */

/* The exit status of a failed call: 2 for what the user asked for (bad or
 * unsupported input, a name that names nothing, a registry stale or in
 * use), 1 otherwise (a failed check, the system, a bug in vps). */
int tool_status(vps_result_t rc);
/* The failed call's message, in buf: the library's, said to be a bug in
 * vps for VPS_EINTERNAL. @return buf */
const char *tool_message(vps_result_t rc, char *buf, size_t n);
/* Print "tool: message" for a failed library call; its exit status. */
int tool_fail(vps_result_t rc);
/* The same for a call that read one argument: "tool: where: message"
 * (where the flag, "--model"; the library's message says what is wrong
 * with the value, the tool which value it was). */
int tool_fail_at(const char *where, vps_result_t rc);
/* For a call that looked a flag's value up (a name, or a file): "tool:
 * --flag: message" when it names nothing (VPS_ENOTFOUND); a fault in the
 * file it named is "tool: FILE: line N: what", as every file's. */
int tool_fail_lookup(const char *flag, vps_result_t rc);
/* Print "tool: message" (printf-style); return status. */
int tool_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A usage error: "tool: message" and a pointer to -h; return 2. */
int tool_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print -h's text, or the version: exit status 0, standard output checked. */
int tool_help(const char *usage);
int tool_version(void);
/* Flush standard output and check it: a full disk is not success. */
int tool_finish(int status);

/* Colon-separated directories to look up configs/<sub>: $VPS_CONFIG_PATH,
 * then configs/ beside the tool (a build tree), then share/vps/configs
 * (an installation). Static storage. */
const char *tool_config_path(const char *sub);

/* Parse a non-negative integer flag value; returns false on junk. */
bool tool_parse_i64(const char *s, int64_t *v);

/* A list of ranks, "0,3,5-7", repeatable; "all" when the world is known later. */
struct tool_ranks {
	int64_t *list;
	size_t n, cap;
	bool all;
};
bool tool_parse_ranks(const char *s, struct tool_ranks *r);
/* A TOOL_FUNC for a struct tool_ranks. */
tool_parse_fn tool_rank_list;
void tool_ranks_release(struct tool_ranks *r);
/* A TOOL_FUNC for a GPU number (an int, 0 to 1023). */
tool_parse_fn tool_device;
/* A TOOL_FUNC for --state S (an int, enum vps_state). */
tool_parse_fn tool_state;

/* ---- numbers for people (vps(7) UNITS) ---- */
/* Whether --stats prints human units: -H, or standard output a terminal
 * (a pipe or a file keeps the exact numbers scripts read). */
bool tool_human(bool flag);
/* Whether to print the one-line summary on standard error: not -q, and
 * the document goes to a file or a pipe, not to the terminal. */
bool tool_summary_wanted(bool quiet, const char *out);
/* v as an exact integer, or in binary units when human. @return buf */
const char *tool_bytes(int64_t v, bool human, char *buf, size_t n);
/* seconds with the precision of fmt ("%.4f"), or with three significant
 * digits when human: still in seconds, as the keys that print them say
 * (estimate_seconds: 0.472, not 472 ms). */
const char *tool_seconds(double v, const char *fmt, bool human, char *buf, size_t n);
#define TOOL_NUM 48

/* "s" where a count of one thing is not one: "%" PRId64 " rank%s", n, tool_s(n) */
static inline const char *tool_s(int64_t n) { return n == 1 ? "" : "s"; }

#endif
