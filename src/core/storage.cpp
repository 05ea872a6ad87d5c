#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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

#if defined(__SANITIZE_ADDRESS__)
#define KILN_HOST_CACHE_BUILD 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_HOST_CACHE_BUILD 0
#endif
#endif
#ifndef KILN_HOST_CACHE_BUILD
#define KILN_HOST_CACHE_BUILD 1
#endif

// Host blocks of 2 MiB and more are anonymous mappings of their own, aligned to 2 MiB and marked for transparent
// huge pages (MADV_HUGEPAGE: Linux's default THP mode, "madvise", gives them only to regions that ask). A decode
// step streams every weight once; with 4 KiB pages each 4 KiB of weights costs a TLB miss and a page walk
// (two-level under a hypervisor). The tail past the last whole 2 MiB stays in small pages, so no memory is
// wasted. KILN_HUGE_PAGES=0 turns it off (std::aligned_alloc then, as for smaller blocks); ASan builds leave it
// out (the sanitizer tracks the C library's blocks only).
constexpr size_t kHuge = size_t{2} << 20;

bool huge_pages_enabled() {
  static const bool yes = [] {
    const char* v = std::getenv("KILN_HUGE_PAGES");
    return KILN_HOST_CACHE_BUILD && !(v != nullptr && std::string(v) == "0");
  }();
  return yes;
}

size_t page_rounded(size_t n) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

// n bytes, kHostAlign-aligned; nullptr when out of memory. host_free(p, n) frees it.
void* host_alloc(size_t n) {
  if (n < kHuge || !huge_pages_enabled()) return std::aligned_alloc(kHostAlign, n);
  const size_t len = page_rounded(n), span = len + kHuge;
  void* m = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (base + kHuge - 1) / kHuge * kHuge;
  // The pages before the 2 MiB boundary and past the block go back at once.
  if (start > base) ::munmap(m, start - base);
  if (base + span > start + len) ::munmap(reinterpret_cast<void*>(start + len), base + span - (start + len));
  void* p = reinterpret_cast<void*>(start);
  (void)::madvise(p, len, MADV_HUGEPAGE);  // refused where the kernel has no THP: small pages then
  return p;
}

void host_free(void* p, size_t n) {
  if (n < kHuge || !huge_pages_enabled()) std::free(p);
  else ::munmap(p, page_rounded(n));
}

// Freed host blocks of 256 KiB to 64 MiB, kept for the next allocation of their size class (sizes rounded up
// to an eighth of their power of two). A prompt's activations are megabytes each, allocated and freed by every
// op: from the C library they come back as fresh pages, which the kernel zeroes on first touch (3% of an f16
// prefill of 128 tokens on 2 cores). At most 256 MiB is kept. KILN_HOST_CACHE=0 turns it off; ASan builds
// leave it out (a reused block would hide a use after free).
class HostCache {
 public:
  static constexpr size_t kMin = size_t{256} << 10, kMax = size_t{64} << 20, kCap = size_t{256} << 20;

  static HostCache& get() {
    static HostCache* c = new HostCache;  // never destroyed: tensors may be freed during static destruction
    return *c;
  }
  bool enabled() const { return enabled_; }
  // The class of an n-byte block (kMin <= n <= kMax): n rounded up to 1/8 of its power of two.
  static size_t size_class(size_t n) {
    size_t p = 1;
    while (p * 2 <= n) p *= 2;
    const size_t step = p / 8;
    return (n + step - 1) / step * step;
  }
  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= cls;
    return p;
  }
  // Keeps the block. When that would pass the cap, the class holding the most bytes gives up blocks first:
  // blocks left from earlier work (a model's loading, a longer prompt) make room for the sizes in use now,
  // which would otherwise come back as fresh pages on every allocation.
  void give(void* p, size_t cls) {
    std::vector<std::pair<void*, size_t>> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (cached_ + cls > kCap) {
        auto victim = free_.end();
        for (auto it = free_.begin(); it != free_.end(); ++it)
          if (!it->second.empty() && (victim == free_.end() || it->first * it->second.size() >
                                                                   victim->first * victim->second.size()))
            victim = it;
        evicted.emplace_back(victim->second.back(), victim->first);
        victim->second.pop_back();
        cached_ -= victim->first;
      }
      free_[cls].push_back(p);
      cached_ += cls;
    }
    for (const auto& [q, c] : evicted) host_free(q, c);
  }

 private:
  HostCache() {
    const char* v = std::getenv("KILN_HOST_CACHE");
    enabled_ = KILN_HOST_CACHE_BUILD && !(v != nullptr && std::string(v) == "0");
  }
  bool enabled_ = false;
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
};
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
    HostCache& cache = HostCache::get();
    if (cache.enabled() && nbytes >= HostCache::kMin && nbytes <= HostCache::kMax) {
      const size_t cls = HostCache::size_class(nbytes);  // a multiple of kHostAlign
      void* p = cache.take(cls);
      if (!p) p = host_alloc(cls);
      if (!p) throw OutOfMemory(str("out of host memory allocating ", nbytes, " bytes"));
      return std::make_shared<Storage>(std::shared_ptr<void>(p, [cls](void* q) { HostCache::get().give(q, cls); }),
                                       nbytes, device);
    }
    const size_t rounded = (std::max<size_t>(nbytes, 1) + kHostAlign - 1) / kHostAlign * kHostAlign;
    void* p = host_alloc(rounded);
    if (!p) throw OutOfMemory(str("out of host memory allocating ", nbytes, " bytes"));
    return std::make_shared<Storage>(std::shared_ptr<void>(p, [rounded](void* q) { host_free(q, rounded); }),
                                     nbytes, device);
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
