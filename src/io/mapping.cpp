// Whole-file memory mappings for the checkpoint readers (io/mapping.h).
#include "io/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/error.h"

namespace kiln::io {

Mapping::~Mapping() {
  if (addr) ::munmap(addr, size);
}

std::shared_ptr<const Mapping> map_file(const std::string& path, const char* kind) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, kind, " '", path, "': cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(str(kind, " '", path, "': not a regular file"));
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    // Private and writable: reads come straight from the page cache, and a write to a tensor view (fill_,
    // copy_) copies that page for this process instead of faulting; the file itself is never modified
    // (it is opened read-only).
    // Under strict overcommit accounting (vm.overcommit_memory=2) a writable private mapping is charged
    // in full and may be refused: map it read-only then (a write to a view would fault there).
    void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED && errno == ENOMEM) p = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw Error(str(kind, " '", path, "': mmap of ", m->size, " bytes failed: ", std::strerror(e)));
    }
    m->addr = p;
  }
  ::close(fd);  // the mapping keeps its own reference to the file
  return m;
}

}  // namespace kiln::io
