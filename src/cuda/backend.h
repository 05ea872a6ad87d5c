// The CUDA backend's entry points used by the device-independent core (only in KILN_HAVE_CUDA builds).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "kiln/tensor.h"

namespace kiln::cuda {

// Number of usable devices; 0 when there is no driver, no device, or the driver is too old. The reason is
// kept for unavailable_reason().
int device_count();
// Why CUDA cannot be used ("" when it can).
std::string unavailable_reason();
// Throws a kiln::Error that says why when `device` cannot be used.
void check_device(Device device);

// The raw handle of the calling thread's current stream on `device`.
cudaStream_t stream_of(Device device);

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device);
void copy_tensor(const Tensor& dst, const Tensor& src);
// Sets every element of t to the same item of `size` bytes.
void fill_bytes(const Tensor& t, const unsigned char* item, size_t size);

// True when this build holds machine code or PTX the device can run (probed with a tiny kernel).
bool kernels_runnable(int device);

// Throws kiln::Error naming `what` when a CUDA call failed.
void check(int err, const char* what);

// Programmatic dependent launch (kernels/pdl.cuh): on for devices of compute capability 9.0 and up unless
// turned off, by set_dependent_launch(false) or KILN_PDL=0 in the environment (for A/B measurements).
bool dependent_launch_enabled(int device);
void set_dependent_launch(bool enabled);

// Launches made as programmatic dependents so far (launch_dependent_if in launch.h), for tests that check which
// kind of launch an op made.
int64_t dependent_launches();
void count_dependent_launch();

}  // namespace kiln::cuda
