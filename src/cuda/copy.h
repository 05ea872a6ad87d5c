// Device-side copies (src/cuda/copy.cu) and host<->device transfers (src/cuda/transfer.cpp).
#pragma once

#include "kiln/tensor.h"

namespace kiln::cuda {

// dst and src on one CUDA device, same shape, any dtypes and strides, not overlapping (the caller,
// copy_tensor, resolves overlap). Asynchronous on the current stream.
void copy_on_device(const Tensor& dst, const Tensor& src);

// Host -> device: src on the CPU, dst on a CUDA device. Returns once src has been read (the caller may
// reuse its memory); the device side completes in stream order.
void copy_host_to_device(const Tensor& dst, const Tensor& src);
// Device -> host: blocks until dst holds the values (the host is about to read them).
void copy_device_to_host(const Tensor& dst, const Tensor& src);

}  // namespace kiln::cuda
