/* Faults for the tests: a rank that falls silent, dies, kills its trainer
 * or loses its data connections while it lives, at a stage of each switch
 * or as soon as its trainer's request is claimed (docs/exec.md, "Faults
 * for the tests"). Not API: libvps.so hides
 * it (it is in no include/vps/ header), and only the tests' executor,
 * cmd/vps-exec.c built with -DVPS_TEST_FAULTS into BUILDDIR/fault-bin from
 * libvps.a, sets it from VPS_FAULT. bin/vps-exec and an installed one never
 * do. */
#ifndef VPS_EXEC_FAULT_H
#define VPS_EXEC_FAULT_H

#include <stdint.h>

enum vps_exec_fault {
	VPS_FAULT_NONE = -1,
	VPS_FAULT_STALL = 0,        /* SIGSTOP itself: a silent peer */
	VPS_FAULT_EXIT = 1,         /* _exit(3): a dead peer */
	VPS_FAULT_KILL_TRAINER = 2, /* SIGKILL its trainer: a trainer that dies mid-switch */
	VPS_FAULT_CUT = 3,          /* shut its data connections down and go on: links that break, both ends alive */
};
/* the stage of a fault that strikes as soon as the request is claimed,
 * before the other ranks learn of it */
#define VPS_FAULT_AT_CLAIM (-2)

/* Every later switch in this process strikes fault at stage (a stage
 * number or VPS_FAULT_AT_CLAIM); VPS_FAULT_NONE: none. Set before
 * vps_exec_run, from one thread. */
void vps_exec_set_fault(enum vps_exec_fault fault, int64_t stage);

#endif
