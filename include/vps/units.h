/* Units: sizes a user types, and the numbers the tools print for people.
 *
 * The rule (vps(7) UNITS): a count of bytes, held or moved, is printed in
 * binary units (B, KiB, MiB, GiB, TiB, PiB, EiB: powers of 1024), the units
 * budgets are written in; a rate in decimal units (B/s, kB/s, MB/s, GB/s,
 * TB/s: powers of 1000), as link and memory bandwidths are quoted; a
 * duration in us, ms or s. Three significant digits. Documents (YAML,
 * binary, --report) keep exact integers and seconds. */
#ifndef VPS_UNITS_H
#define VPS_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "vps/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parse a size: digits, an optional fraction, optional blanks, an optional
 * unit. B or none: bytes; K, M, G, T, P, E, KiB ... EiB (and Ki ... Ei):
 * powers of 1024; KB (kB) ... EB: powers of 1000. The letter, the i and a
 * b after the i may be in either case (2gib is 2GiB); a lowercase b right
 * after the letter, or alone, is bits (2Gb) and refused. A fraction of a
 * byte is rounded down. No sign, exponent or hex. VPS_EINPUT when it is not a size or
 * exceeds INT64_MAX bytes. */
VPS_API vps_result_t vps_parse_bytes(const char *s, int64_t *out);

/* Large enough for any string the formatters below write. */
#define VPS_UNITS_LEN 32

/* "512 B", "87.2 GiB" (negative values keep their sign). @return buf */
VPS_API char *vps_format_bytes(int64_t bytes, char *buf, size_t n);
/* "812 MB/s", "24.5 GB/s". @return buf */
VPS_API char *vps_format_rate(double bytes_per_second, char *buf, size_t n);
/* "850 us", "12.3 ms", "1.04 s". @return buf */
VPS_API char *vps_format_seconds(double seconds, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
