/* A small unit-test harness: TEST(name) registers a function, CHECK*
 * record a failure with file:line and carry on, main runs everything. */
#ifndef VPS_TEST_HARNESS_H
#define VPS_TEST_HARNESS_H

#include <inttypes.h>
#include <stdio.h>

#include "vps/vps.h"

void harness_register(const char *name, void (*fn)(void));
/* A xorshift64 sequence, the same in every run: random cases that repeat. */
uint64_t harness_random(void);
void harness_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define TEST(name)                                                               \
	static void name(void);                                                  \
	__attribute__((constructor)) static void register_##name(void)          \
	{                                                                        \
		harness_register(#name, name);                                   \
	}                                                                        \
	static void name(void)

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond))                                                     \
			harness_fail(__FILE__, __LINE__, "%s", #cond);           \
	} while (0)

#define CHECK_EQ(a, b)                                                           \
	do {                                                                     \
		long long a_ = (long long)(a), b_ = (long long)(b);              \
		if (a_ != b_)                                                    \
			harness_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, a_, b_); \
	} while (0)

/* A library call that must succeed. */
#define CHECK_OK(call)                                                           \
	do {                                                                     \
		vps_result_t rc_ = (call);                                       \
		if (rc_ != VPS_OK)                                               \
			harness_fail(__FILE__, __LINE__, "%s: %s", #call, vps_last_error()); \
	} while (0)

/* Path of the source tree's configs/ (tests run from the top). */
#define CONFIGS "configs"

#endif
