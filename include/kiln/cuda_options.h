// Process-wide switches of the CUDA backend's numerics.
#pragma once

namespace kiln {

// Whether f32 matrix products on CUDA may use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation):
// several times faster, but results differ from the CPU by about 1e-3 relative. Off by default, as
// PyTorch's torch.backends.cuda.matmul.allow_tf32. Takes effect on the next call, on every thread.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace kiln
