// Device memory accounting shared by processes (JAXLAKE_FAKEGPU_SHARED=NAME):
// every process that names the same segment sees one set of devices, whose
// cuMemGetInfo, creations and failures count every process's bytes, as
// processes sharing one GPU do. Only the accounting is shared: each
// process's device memory stays its own host memory, so one process cannot
// read another's buffers (as with a real GPU without IPC handles).
//
// The segment is POSIX shared memory, /jaxlake-fakegpu-<uid>-<NAME>: a
// header (the device count and bytes a device, fixed by the process that
// made it), a robust process-shared mutex, and a slot per process holding
// its pid, its start time and its bytes on each device. A process's slot is
// cleared when it exits; a slot whose process is gone (killed, exited
// without running its exit handlers, or exited and not yet reaped) is
// reclaimed by the next process that takes the lock, and a process that
// died holding the lock leaves it to the next one (EOWNERDEAD), which
// reclaims the dead slot before going on.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cc/fakegpu/fakegpu.h"

namespace jaxlake::fakegpu {
namespace {

constexpr std::uint64_t kMagic = 0x6a786c6b73686d31;  // "jxlkshm1"
constexpr int kMaxDevices = 64;
constexpr int kMaxProcesses = 64;

struct Slot {
  std::int32_t pid;  // 0: free
  std::uint64_t start;  // the process's start time (/proc/PID/stat, field 22)
  std::uint64_t used[kMaxDevices];
};

struct Segment {
  std::atomic<std::uint64_t> magic;  // set last, once the rest is ready
  std::uint64_t memory;  // bytes a device
  std::int32_t count;    // devices
  pthread_mutex_t mu;
  Slot slots[kMaxProcesses];
};

// A process's start time in clock ticks since boot, which tells a process
// apart from a later one that reuses its pid; 0 when it cannot be read.
std::uint64_t StartTime(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 0;
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // Fields after the command name, which is in parentheses and may hold
  // spaces: state is field 3, start time field 22.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return 0;
  int field = 2;
  for (; *p != '\0' && field < 22; ++p)
    if (*p == ' ') ++field;
  return std::strtoull(p, nullptr, 10);
}

// Whether process `pid` has exited and waits for its parent to reap it
// (state Z in /proc/PID/stat).
bool Zombie(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  return p != nullptr && p[1] == ' ' && p[2] == 'Z';
}

bool Alive(const Slot& s) { return ProcessAlive(s.pid, s.start); }

struct Shared {
  Segment* seg = nullptr;
  std::string error;  // why the segment could not be used
};

void Lock(Segment* seg);

// Opens (or makes) the segment NAME names. Sets error on failure.
Shared Open(const std::string& name) {
  Shared s;
  const Options& o = Opts();
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
          c == '-' || c == '.')) {
      s.error = "JAXLAKE_FAKEGPU_SHARED=" + name +
                ": a name of letters, digits, '_', '-' and '.' only";
      return s;
    }
  }
  if (name.empty() || name.size() > 200) {
    s.error = "JAXLAKE_FAKEGPU_SHARED=" + name + ": 1 to 200 characters";
    return s;
  }
  const std::string path = "/jaxlake-fakegpu-" +
                           std::to_string(::getuid()) + "-" + name;
  bool made = true;
  int fd = ::shm_open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    made = false;
    fd = ::shm_open(path.c_str(), O_RDWR, 0600);
  }
  if (fd < 0) {
    s.error = "shm_open(" + path + "): " + std::strerror(errno);
    return s;
  }
  if (made && ::ftruncate(fd, sizeof(Segment)) != 0) {
    s.error = "ftruncate(" + path + "): " + std::strerror(errno);
    ::close(fd);
    return s;
  }
  // Another process made it: wait (briefly) until it has its size.
  for (int i = 0; !made && i < 2000; ++i) {
    struct stat st;
    if (::fstat(fd, &st) == 0 &&
        static_cast<std::size_t>(st.st_size) >= sizeof(Segment))
      break;
    ::usleep(1000);
  }
  void* p = ::mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    s.error = "mmap(" + path + "): " + std::strerror(errno);
    return s;
  }
  auto* seg = static_cast<Segment*>(p);
  if (made) {
    seg->memory = o.memory;
    seg->count = o.count;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&seg->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    seg->magic.store(kMagic, std::memory_order_release);
  } else {
    for (int i = 0; i < 2000; ++i) {
      if (seg->magic.load(std::memory_order_acquire) == kMagic) break;
      ::usleep(1000);
    }
    if (seg->magic.load(std::memory_order_acquire) != kMagic) {
      s.error = path + " is not a fake GPU's shared segment (remove it "
                       "from /dev/shm)";
      ::munmap(p, sizeof(Segment));
      return s;
    }
  }
  if (seg->memory != o.memory || seg->count != o.count) {
    s.error = path + " holds " + std::to_string(seg->count) + " device(s) of " +
              std::to_string(seg->memory) + " bytes, and this process asks "
              "for " + std::to_string(o.count) + " of " +
              std::to_string(o.memory) + " (JAXLAKE_FAKEGPU_COUNT, "
              "JAXLAKE_FAKEGPU_MEMORY): every process sharing a name must "
              "ask for the same devices";
    ::munmap(p, sizeof(Segment));
    return s;
  }
  s.seg = seg;
  return s;
}

// Clears the slots of processes that are gone: their bytes go back.
void ReclaimDead(Segment* seg) {
  for (Slot& slot : seg->slots)
    if (slot.pid != 0 && !Alive(slot)) std::memset(&slot, 0, sizeof slot);
}

void Lock(Segment* seg) {
  if (pthread_mutex_lock(&seg->mu) == EOWNERDEAD) {
    // Its holder died mid-update: its slot is reclaimed below, and every
    // other slot is only ever changed by its own process under the lock.
    pthread_mutex_consistent(&seg->mu);
    ReclaimDead(seg);
  }
}

void Unlock(Segment* seg) { pthread_mutex_unlock(&seg->mu); }

// This process's slot (made on first use), or null when all are taken.
Slot* Mine(Segment* seg) {
  const int pid = static_cast<int>(::getpid());
  for (Slot& slot : seg->slots)
    if (slot.pid == pid) return &slot;
  ReclaimDead(seg);
  for (Slot& slot : seg->slots) {
    if (slot.pid == 0) {
      std::memset(&slot, 0, sizeof slot);
      slot.pid = pid;
      slot.start = StartTime(pid);
      return &slot;
    }
  }
  return nullptr;
}

std::uint64_t Total(Segment* seg, int device) {
  std::uint64_t total = 0;
  for (const Slot& slot : seg->slots)
    if (slot.pid != 0) total += slot.used[device];
  return total;
}

void AtExit();

const Shared& TheShared() {
  static const Shared* const s = [] {
    auto* p = new Shared(Open(Opts().shared));
    if (!p->error.empty())
      std::fprintf(stderr, "jaxlake fake GPU: shared device memory: %s\n",
                   p->error.c_str());
    else
      std::atexit(AtExit);
    return p;
  }();
  return *s;
}

void AtExit() {
  Segment* seg = TheShared().seg;
  if (seg == nullptr) return;
  Lock(seg);
  const int pid = static_cast<int>(::getpid());
  for (Slot& slot : seg->slots)
    if (slot.pid == pid) std::memset(&slot, 0, sizeof slot);
  Unlock(seg);
}

}  // namespace

std::uint64_t ProcessStartTime(int pid) { return StartTime(pid); }

bool ProcessAlive(int pid, std::uint64_t start) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  if (Zombie(pid)) return false;  // exited, not yet waited for
  const std::uint64_t now = StartTime(pid);
  return now == 0 || start == 0 || now == start;
}

bool SharedMode() { return !Opts().shared.empty(); }

const char* SharedError() {
  if (!SharedMode()) return nullptr;
  const Shared& s = TheShared();
  return s.seg == nullptr ? s.error.c_str() : nullptr;
}

bool SharedCharge(int device, std::size_t n) {
  Segment* seg = TheShared().seg;
  if (seg == nullptr || device < 0 || device >= seg->count) return false;
  Lock(seg);
  ReclaimDead(seg);
  Slot* mine = Mine(seg);
  const std::uint64_t total = Total(seg, device);
  const bool fits = mine != nullptr && n <= seg->memory - std::min<std::uint64_t>(
                                                             seg->memory, total);
  if (fits) mine->used[device] += n;
  Unlock(seg);
  return fits;
}

void SharedUncharge(int device, std::size_t n) {
  Segment* seg = TheShared().seg;
  if (seg == nullptr || device < 0 || device >= seg->count) return;
  Lock(seg);
  Slot* mine = Mine(seg);
  if (mine != nullptr)
    mine->used[device] -= std::min<std::uint64_t>(n, mine->used[device]);
  Unlock(seg);
}

std::size_t SharedUsed(int device) {
  Segment* seg = TheShared().seg;
  if (seg == nullptr || device < 0 || device >= seg->count) return 0;
  Lock(seg);
  ReclaimDead(seg);
  const std::uint64_t total = Total(seg, device);
  Unlock(seg);
  return static_cast<std::size_t>(total);
}

int SharedUsage(int device, int* pids, unsigned long long* used, int max) {
  Segment* seg = TheShared().seg;
  if (seg == nullptr || device < 0 || device >= seg->count) return -1;
  Lock(seg);
  ReclaimDead(seg);
  int n = 0;
  for (const Slot& slot : seg->slots) {
    if (slot.pid == 0) continue;
    if (n < max) {
      pids[n] = slot.pid;
      used[n] = slot.used[device];
    }
    ++n;
  }
  Unlock(seg);
  return n;
}

}  // namespace jaxlake::fakegpu
