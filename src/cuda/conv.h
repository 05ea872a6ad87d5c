// Convolutions on CUDA through cuDNN 9's backend (graph) API, loaded at run time: a machine without cuDNN, or a
// case no cuDNN engine takes, leaves the caller to its own path (ops/conv.cpp's im2col). Only in KILN_HAVE_CUDA
// builds.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::cuda {

struct ConvGeometry {
  std::vector<int64_t> stride, dilation, pad_before, pad_after;  // one per spatial dim (1 to 3)
};

// y = conv(x, w) (cross-correlation, as torch's convN d) with x [N, C, *S], w [K, C / g, *k], y [N, K, *O], all
// contiguous, one device and one dtype (f32, f16 or bf16; f32 accumulation); the groups follow from C and w's
// second dim. f32 runs without TF32 or other down-converting engines. Returns false, having written nothing,
// when cuDNN is missing (or disabled with KILN_CUDNN=0) or no engine takes the case.
bool cudnn_conv_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g);

// The transposed convolution: x [N, K, *I] is the gradient of a forward convolution's output and y [N, C, *O]
// receives its gradient with respect to that convolution's input (torch's conv_transposeNd with weight w
// [K, C / g, *k]; output_padding is in y's shape). Same contract as cudnn_conv_forward.
bool cudnn_conv_transpose(const Tensor& x, const Tensor& w, Tensor& y, const ConvGeometry& g);

// Whether cuDNN was loaded (the first call tries), and which library; for `kiln info`.
bool cudnn_available();
std::string cudnn_description();

}  // namespace kiln::cuda
