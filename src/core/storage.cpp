#include <cstdlib>
#include <new>

#include "core/copy.h"
#include "kiln/runtime.h"
#include "kiln/tensor.h"
#if KILN_HAVE_CUDA
#include "cuda/backend.h"
#endif

namespace kiln {

namespace {
// Host tensors are 64-byte aligned: full cache lines and aligned vector loads.
constexpr size_t kHostAlign = 64;
}  // namespace

void mark_constant(const Tensor& t) {
  if (t.is_cuda()) synchronize(t.device());
  t.storage()->set_constant(true);
}

void note_write(const Tensor& t) {
  if (t.defined() && t.storage()->constant()) t.storage()->set_constant(false);
}

std::shared_ptr<Storage> allocate_storage(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    const size_t rounded = (std::max<size_t>(nbytes, 1) + kHostAlign - 1) / kHostAlign * kHostAlign;
    void* p = std::aligned_alloc(kHostAlign, rounded);
    if (!p) throw OutOfMemory(str("out of host memory allocating ", nbytes, " bytes"));
    return std::make_shared<Storage>(std::shared_ptr<void>(p, [](void* q) { std::free(q); }), nbytes, device);
  }
#if KILN_HAVE_CUDA
  return cuda::allocate_storage(nbytes, device);
#else
  throw Error(str("cannot allocate on ", device.str(), ": this build of kiln has no CUDA backend (configure with ",
                  "KILN_CUDA=ON and a CUDA toolkit)"));
#endif
}

std::shared_ptr<Storage> wrap_host_memory(void* data, size_t nbytes, std::shared_ptr<const void> keep_alive) {
  KILN_CHECK(data != nullptr || nbytes == 0, "wrap_host_memory: null pointer for ", nbytes, " bytes");
  KILN_CHECK(keep_alive != nullptr, "wrap_host_memory: no owner given for ", nbytes, " bytes at ", data);
  // The aliasing constructor: shares ownership of the owner, points at `data`.
  std::shared_ptr<void> p(std::const_pointer_cast<void>(std::move(keep_alive)), data);
  return std::make_shared<Storage>(std::move(p), nbytes, kCPU);
}

void copy_tensor(const Tensor& dst, const Tensor& src) {
  KILN_CHECK(dst.sizes() == src.sizes(), "copy: destination ", dst.meta(), " and source ", src.meta(),
             " differ in shape");
  if (dst.numel() == 0) return;
  note_write(dst);
  // Overlapping views of one storage (x.copy_(x.t()), say): read the source out first. The same view on
  // both sides is safe: each element is read before it is written.
  if (dst.is_alias_of(src) && !(dst.data_ptr() == src.data_ptr() && dst.strides() == src.strides())) {
    copy_tensor(dst, src.clone());
    return;
  }
  if (dst.is_cpu() && src.is_cpu()) {
    cpu::copy_cast(dst, src);
    return;
  }
#if KILN_HAVE_CUDA
  cuda::copy_tensor(dst, src);
#else
  throw Error(str("copy from ", src.meta(), " to ", dst.meta(), ": this build of kiln has no CUDA backend"));
#endif
}

}  // namespace kiln
