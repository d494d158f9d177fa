//go:build llama && cgo

// The GPUs' compute capabilities from the CUDA driver API, opened with dlopen
// so that the plugin needs no CUDA at build time and still starts on a
// machine without the driver. Only the driver's C ABI is used: the functions
// below take ints and opaque handles, stable since CUDA 2.

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "gpuselect.h"

typedef int (*cu_init_fn)(unsigned int);
typedef int (*cu_int_fn)(int *);
typedef int (*cu_device_get_fn)(int *, int);
typedef int (*cu_attribute_fn)(int *, int, int);
typedef int (*cu_name_fn)(char *, int, int);
typedef int (*cu_error_name_fn)(int, const char **);

// CUdevice_attribute values (cuda.h).
enum { CC_MAJOR = 75, CC_MINOR = 76 };

// fail records which call returned rc, with the driver's name for it.
static int fail(hydra_cuda_info * info, cu_error_name_fn error_name, const char * call, int rc) {
	const char * name = NULL;
	if (error_name == NULL || error_name(rc, &name) != 0 || name == NULL) {
		name = "unknown error";
	}
	snprintf(info->err, sizeof info->err, "%s: %s (%d)", call, name, rc);
	return rc;
}

int hydra_cuda_query(const char * lib, hydra_cuda_info * info) {
	memset(info, 0, sizeof *info);
	// The handle stays open: the CUDA runtime opens the same driver later.
	void * h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		snprintf(info->err, sizeof info->err, "%s", dlerror());
		return -1;
	}
	cu_init_fn init = (cu_init_fn) dlsym(h, "cuInit");
	cu_int_fn driver_version = (cu_int_fn) dlsym(h, "cuDriverGetVersion");
	cu_int_fn device_count = (cu_int_fn) dlsym(h, "cuDeviceGetCount");
	cu_device_get_fn device_get = (cu_device_get_fn) dlsym(h, "cuDeviceGet");
	cu_attribute_fn attribute = (cu_attribute_fn) dlsym(h, "cuDeviceGetAttribute");
	cu_name_fn device_name = (cu_name_fn) dlsym(h, "cuDeviceGetName");
	cu_error_name_fn error_name = (cu_error_name_fn) dlsym(h, "cuGetErrorName");
	if (!init || !driver_version || !device_count || !device_get || !attribute || !device_name) {
		snprintf(info->err, sizeof info->err, "%s lacks the CUDA driver API (cuInit, cuDeviceGetAttribute, ...)", lib);
		return -1;
	}
	int rc;
	if ((rc = init(0)) != 0) {
		return fail(info, error_name, "cuInit", rc);
	}
	if ((rc = driver_version(&info->driver)) != 0) {
		return fail(info, error_name, "cuDriverGetVersion", rc);
	}
	int n = 0;
	if ((rc = device_count(&n)) != 0) {
		return fail(info, error_name, "cuDeviceGetCount", rc);
	}
	if (n > HYDRA_CUDA_MAX_DEVICES) {
		n = HYDRA_CUDA_MAX_DEVICES;
	}
	for (int i = 0; i < n; i++) {
		int dev = 0;
		if ((rc = device_get(&dev, i)) != 0) {
			return fail(info, error_name, "cuDeviceGet", rc);
		}
		if ((rc = attribute(&info->major[i], CC_MAJOR, dev)) != 0 || (rc = attribute(&info->minor[i], CC_MINOR, dev)) != 0) {
			return fail(info, error_name, "cuDeviceGetAttribute", rc);
		}
		if (device_name(info->name[i], (int) sizeof info->name[i], dev) != 0) {
			info->name[i][0] = '\0';
		}
		info->count = i + 1;
	}
	return 0;
}
