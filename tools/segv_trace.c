// LD_PRELOAD helper for the GPU machine, where no debugger is installed: on SIGSEGV/SIGBUS/SIGABRT prints the
// native stack (glibc's backtrace, exported symbols and library offsets) to stderr, then dies as before.
//   gcc -shared -fPIC -o segv_trace.so tools/segv_trace.c && LD_PRELOAD=$PWD/segv_trace.so python3 ...
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fault(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char msg[] = "\n--- native stack ---\n";
  write(2, msg, sizeof msg - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  signal(SIGSEGV, on_fault);
  signal(SIGBUS, on_fault);
  signal(SIGABRT, on_fault);
}
