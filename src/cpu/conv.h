// Convolutions on the CPU through oneDNN, where the build found it (KILN_HAVE_DNNL): ops/conv.cpp tries this
// first and runs its im2col path when it returns false.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::cpu {

struct ConvParams {
  std::vector<int64_t> stride, dilation, pad_before, pad_after;  // one per spatial dim
  int64_t groups = 1;
};

// y = conv(x, w) + bias (torch's convNd) with x [N, C, *S], w [O, C / groups, *k], y [N, O, *O'], bias [O] or
// null, all contiguous CPU tensors of one dtype (f32 or bf16; bias f32 or the input's). Returns false, having
// written nothing, when oneDNN has no implementation for the case (bf16 on a CPU without it, say).
bool dnnl_conv(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y, const ConvParams& p);
// The transposed convolution (torch's conv_transposeNd) with x [N, I, *S], w [I, O / groups, *k], y [N, O, *O']
// (output_padding in y's shape: pad_after is the padding minus output_padding), bias [O] or null; the same
// contract as dnnl_conv.
bool dnnl_conv_transpose(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y, const ConvParams& p);
// "oneDNN 2.6.3 (OpenMP)", for `kiln info`.
std::string dnnl_description();

}  // namespace kiln::cpu
