/* The registry's bell: how an executor waits for its trainer's request
 * without looking at the registry over and over.
 *
 * The bell is a 32-bit counter in the registry's shared header, rung
 * (incremented, then every waiter woken: a futex, not process-private,
 * since the mapping is shared) at each request, verdict and stop. A waiter
 * reads the bell, looks at what it waits for, and only then waits for the
 * bell to move from what it read: what happened between the read and the
 * wait has rung it already, and the wait returns at once. The counter lies
 * in memory another process writes: a wait is always bounded, and a bell
 * that moves tells a waiter only to look again. */
#ifndef VPS_REGISTRY_BELL_H
#define VPS_REGISTRY_BELL_H

#include <stdbool.h>
#include <stdint.h>

struct vps_registry;

/* The bell as it is now, read before looking at the registry. */
uint32_t vps_registry_bell(const struct vps_registry *r);
/* Wait up to `seconds` for the bell to move from `bell`.
 * @return true when the wait ended because it moved (before the wait, or
 * a ring woke it): look again; false when the time ran out (whatever
 * happened meanwhile), a signal came, or something woke the futex
 * without ringing. */
bool vps_registry_await(const struct vps_registry *r, uint32_t bell, double seconds);

#endif
