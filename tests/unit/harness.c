#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct {
	const char *name;
	void (*fn)(void);
} tests[512];
static int ntests, failures, current_failed;
static const char *current;

void harness_register(const char *name, void (*fn)(void))
{
	if (ntests < (int)(sizeof(tests) / sizeof(tests[0]))) {
		tests[ntests].name = name;
		tests[ntests].fn = fn;
		ntests++;
	}
}

void harness_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "FAIL %s: %s:%d: ", current, file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	failures++;
	current_failed = 1;
}

int main(int argc, char **argv)
{
	int failed_tests = 0, run = 0;
	for (int i = 0; i < ntests; i++) {
		if (argc > 1 && !strstr(tests[i].name, argv[1]))
			continue;
		current = tests[i].name;
		current_failed = 0;
		tests[i].fn();
		failed_tests += current_failed;
		run++;
	}
	const char *prog = strrchr(argv[0], '/');
	printf("%s: %d tests, %d failed\n", prog ? prog + 1 : argv[0], run, failed_tests);
	return failures ? 1 : 0;
}

uint64_t harness_random(void)
{
	static uint64_t rng = 0x9e3779b97f4a7c15ULL;
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}
