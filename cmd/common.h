/* What every vps tool shares: messages, exit codes, config lookup, output. */
#ifndef VPS_CMD_COMMON_H
#define VPS_CMD_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vps/vps.h"

/* Exit statuses (vps(7)). */
enum { EXIT_OK = 0, EXIT_CHECK = 1, EXIT_USAGE = 2 };

extern const char *tool_name;

/* Print "tool: message" for a failed library call and return the exit
 * status it maps to: 2 for bad input, 1 otherwise. */
/* The exit status of a failed call: 2 for bad or unsupported input, else 1. */
int tool_status(vps_result_t rc);
int tool_fail(vps_result_t rc);
/* Print "tool: message" (printf-style) and return 2. */
int tool_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Flush standard output and check it: a full disk is not success. */
int tool_finish(int status);

/* Colon-separated directories to look up configs/<sub>: $VPS_CONFIG_PATH,
 * then configs/ beside the tool (a build tree), then share/vps/configs
 * (an installation). Static storage. */
const char *tool_config_path(const char *sub);

/* Parse a non-negative integer flag value; returns false on junk. */
bool tool_parse_i64(const char *s, int64_t *v);
/* Parse "0,3,5-7" into a growing list (or "all" when world >= 0 is known
 * later: sets *all). */
bool tool_parse_ranks(const char *s, int64_t **list, size_t *n, size_t *cap, bool *all);

/* ---- numbers for people (vps(7) UNITS) ---- */
/* Whether --stats prints human units: -H, or standard output a terminal
 * (a pipe or a file keeps the exact numbers scripts read). */
bool tool_human(bool flag);
/* Whether to print the one-line summary on standard error: not -q, and
 * the document goes to a file or a pipe, not to the terminal. */
bool tool_summary_wanted(bool quiet, const char *out);
/* v as an exact integer, or in binary units when human. @return buf */
const char *tool_bytes(int64_t v, bool human, char *buf, size_t n);
/* seconds with the precision of fmt ("%.4f"), or in s, ms or us when human. */
const char *tool_seconds(double v, const char *fmt, bool human, char *buf, size_t n);
#define TOOL_NUM 48

#endif
