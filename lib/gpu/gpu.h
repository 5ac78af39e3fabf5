/* GPU support, loaded at run time: libvps-cuda.so (lib/gpu/cuda/) is opened
 * with dlopen the first time GPU memory or NCCL is asked for, so that every
 * tool runs on machines without CUDA. */
#ifndef VPS_GPU_H
#define VPS_GPU_H

#include "gpu/cuda/vps_cuda.h"
#include "vps/vps.h"

/* The loaded library, or VPS_EUNSUPPORTED saying why it cannot be had
 * (not built, not found, no driver). Where it is searched: VPS_CUDA_LIBRARY,
 * then beside libvps (its directory, ../lib, ../build), then the loader's
 * path. */
vps_result_t vps_gpu_api(const struct vps_cuda_api **api);
/* Load, check that a GPU exists, and make device the process's device;
 * device < 0: the local rank modulo the visible GPUs (torchrun's rule). */
vps_result_t vps_gpu_init(int device, int64_t local_rank, const struct vps_cuda_api **api);
/* A libvps-cuda.so result as a libvps one (the message recorded). */
vps_result_t vps_gpu_result(int code, const char *err, const char *what);

#define VPS_GPU(api_call, what)                                                                       \
	do {                                                                                          \
		char gpu_err_[VPS_CUDA_ERR] = "";                                                     \
		int gpu_rc_ = (api_call);                                                             \
		if (gpu_rc_)                                                                          \
			return vps_gpu_result(gpu_rc_, gpu_err_, (what));                             \
	} while (0)

#endif
