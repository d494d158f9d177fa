// C interface of gpuselect.c: the GPUs' compute capabilities from the CUDA
// driver API, through dlopen, before any CUDA library is loaded.
#pragma once

#define HYDRA_CUDA_MAX_DEVICES 64

typedef struct {
	int driver;                            // cuDriverGetVersion: 13000 is CUDA 13.0
	int count;                             // devices listed below
	int major[HYDRA_CUDA_MAX_DEVICES];     // compute capability
	int minor[HYDRA_CUDA_MAX_DEVICES];
	char name[HYDRA_CUDA_MAX_DEVICES][96]; // cuDeviceGetName
	char err[512];                         // why it failed
} hydra_cuda_info;

// hydra_cuda_query fills info from the driver library lib (libcuda.so.1):
// 0 on success (count may be 0), -1 if lib cannot be loaded or lacks a
// function, else the CUresult of the call that failed; err says which.
int hydra_cuda_query(const char * lib, hydra_cuda_info * info);
