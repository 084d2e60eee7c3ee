// The fake GPU's NCCL: communicators among the fake devices of one process,
// groups, and the collectives, by NVIDIA's names and signatures (nccl.h).
//
// What moves bytes (cc/fakegpu/README.md, "NCCL"): the collectives that
// only copy, as NCCL defines them: ncclAlltoAll, ncclAllGather,
// ncclBroadcast (and ncclBcast), ncclSend and ncclRecv. Each runs in its
// stream's order: the ranks' work meets when every rank's stream reaches
// it, each rank copies what it receives, and no rank goes on until every
// rank has read its buffers. The reductions (ncclAllReduce,
// ncclReduceScatter, ncclReduce) would compute, and kernels do not run in
// the fake: they are accepted and do nothing, like kernels.
//
// Communicators made with one unique id (ncclCommInitRank,
// ncclCommInitRankConfig), by ncclCommInitAll, or by ncclCommSplit of one
// parent form a clique. A unique id names a POSIX shared-memory segment
// where the ranks of one id meet, in this process or in others on this
// machine: when they all live in one process they meet as those of
// ncclCommInitAll do (by pointers); when they span processes the bytes go
// through the segment (below, "Across processes"). A split of a clique
// that spans processes meets in a segment too, named after its parent's.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

// ncclResult_t (nccl.h).
constexpr int kSuccess = 0, kSystemError = 2, kInvalidArgument = 4,
              kInvalidUsage = 5, kRemoteError = 6;
constexpr int kVersion = 22703;  // 2.27.3

// How long a rank waits for its peers before it gives up (and says so): a
// real NCCL would hang; a test should not.
constexpr auto kPeerWait = std::chrono::seconds(120);

std::size_t TypeSize(int type) {  // ncclDataType_t
  switch (type) {
    case 0: case 1: case 10: case 11: return 1;  // int8, uint8, fp8
    case 6: case 9: return 2;                    // half, bfloat16
    case 2: case 3: case 7: return 4;            // int32, uint32, float
    case 4: case 5: case 8: return 8;            // int64, uint64, double
    default: return 0;
  }
}

// One meeting of the ranks of a clique: a collective, or one send's bytes.
struct Slot {
  std::vector<const void*> send;  // by rank (a send: one)
  std::vector<void*> recv;
  int arrived = 0;
  int left = 0;
  bool consumed = false;  // a send: its receiver has copied it
};

class Shm;

struct Clique {
  explicit Clique(int n);
  ~Clique();
  const int nranks;
  // The segment of a unique id's clique, or of a split of such a clique
  // whose ranks span processes (null for ncclCommInitAll's and the other
  // splits', which live in one process).
  std::unique_ptr<Shm> shm;
  // A failure that ends the clique (ncclRemoteError): peers that died or
  // never came. Every later call on its communicators returns it.
  std::atomic<int> error{0};
  // A segment's clique: its unique id, and this process's communicators
  // of it (under the registry's mutex); the registry lets go of the clique
  // (and, once its work is done, of the mapping) when the last is
  // destroyed.
  std::string id;
  int comms = 0;
  std::mutex mu;
  std::condition_variable cv;
  // Collectives by sequence number; sends by (from, to, sequence).
  std::map<std::uint64_t, std::shared_ptr<Slot>> collectives;
  std::map<std::tuple<int, int, std::uint64_t>, std::shared_ptr<Slot>> sends;
};

template <typename Key>
std::shared_ptr<Slot> SlotOf(
    std::map<Key, std::shared_ptr<Slot>>& slots, const Key& key) {
  auto& s = slots[key];
  if (s == nullptr) s = std::make_shared<Slot>();
  return s;
}

struct Comm {
  Comm(std::shared_ptr<Clique> c, int r, int d)
      : clique(std::move(c)), rank(r), device(d) {}
  std::shared_ptr<Clique> clique;  // null until a split completes
  int rank = 0;
  int device = 0;
  // Issue-order counters (NCCL requires every rank to issue a
  // communicator's collectives in one order, and sends and receives
  // between two ranks in one order).
  std::uint64_t collectives = 0;
  std::map<int, std::uint64_t> sent, received;
  // ncclCommSplit calls made on this communicator.
  std::uint64_t nsplits = 0;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Clique>> by_id;
  // ncclCommSplit: (parent clique, split number, color) -> the new clique's
  // ranks, keyed by (key, parent rank); made when every parent rank split.
  struct Split {
    std::map<int, std::vector<std::tuple<int, int, Comm*>>> by_color;
    int called = 0;
  };
  std::map<std::pair<Clique*, std::uint64_t>, Split> splits;
};
Registry& R() {
  static Registry* r = new Registry;
  return *r;
}

bool Wait(Clique* c, std::unique_lock<std::mutex>& lock,
          const std::function<bool()>& ready, const char* what) {
  if (c->cv.wait_for(lock, kPeerWait, ready)) return true;
  std::fprintf(stderr,
               "jaxlake fake GPU: %s waited %lld s for its peers; it goes on "
               "without moving data\n",
               what, static_cast<long long>(kPeerWait.count()));
  return false;
}

// The kinds of operation a group holds.
enum class Op { kAllToAll, kAllGather, kBroadcast, kSend, kRecv, kNothing };

struct Pending {
  Op op;
  Comm* comm;
  void* stream;
  const void* send;
  void* recv;
  std::size_t bytes;  // a block (all-to-all), a rank's part (all-gather)
  int root_or_peer;
  std::uint64_t seq;
  // Taken from the communicator when issued: the work may run after the
  // communicator is destroyed.
  std::shared_ptr<Clique> clique;
  int rank;
  int device;
};

// ---- across processes -------------------------------------------------------
//
// The segment /jaxlake-fakegpu-nccl-<uid>-<pid>-<n>-<random> that a unique
// id names: a header (the rank count, its maker, a robust process-shared
// mutex for joining and leaving), a slot a rank (its process, a barrier
// counter, and its latest ncclCommSplit's color and key), a mailbox an
// ordered pair of ranks (the send whose bytes flow, and whether a chunk
// waits), a staging area a rank for the collectives, and the mailboxes'
// bytes. Only touched pages of it cost memory. A split of a clique that
// spans processes meets in the segment <parent's name>-<split number>c<color>.
//
// A collective moves its bytes in rounds of at most kStage bytes a rank:
// each rank stages its part, all meet (a barrier: each raises its counter
// and waits for every counter to reach it), each copies what it receives
// from the peers' staging areas, and all meet again. Sends and receives
// move chunks through their pair's mailbox, one chunk at a time; a rank
// makes progress on all of a group's sends and receives at once, so that a
// group that sends and receives between two ranks cannot deadlock.
//
// A wait checks the peers' processes every 50 ms: one that died (or that
// does not come within kPeerWait) ends the clique with ncclRemoteError, said
// on stderr. The last rank to leave (ncclCommDestroy, or its process's
// exit) removes the segment; ncclGetUniqueId removes those whose every
// process is gone (a killed run's).

constexpr std::uint64_t kShmMagic = 0x6a786c6b6e63636c;  // "jxlknccl"
constexpr std::size_t kStage = std::size_t{1} << 20;
constexpr char kShmPrefix[] = "/jaxlake-fakegpu-nccl-";
enum : std::uint32_t { kFree = 0, kJoined = 1, kLeft = 2 };

struct alignas(64) ShmRank {
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint32_t> state;
  std::uint64_t start;
  std::atomic<std::uint64_t> phase;  // barriers passed
  // The rank's next collective (by issue number): its collectives run one
  // at a time, in issue order, whatever streams they are on.
  std::atomic<std::uint64_t> next;
  // ncclCommSplit: the splits this rank has published (the latest's color
  // and key beside), and those whose colors it has read.
  std::atomic<std::uint64_t> splits;
  std::atomic<std::uint64_t> splits_read;
  std::atomic<std::int32_t> split_color;
  std::atomic<std::int32_t> split_key;
};
static_assert(sizeof(ShmRank) == 64, "a rank's slot is one cache line");

struct alignas(64) ShmBox {
  std::atomic<std::uint64_t> seq;   // the send whose chunks flow now
  std::atomic<std::uint32_t> full;  // a chunk waits for the receiver
  std::uint64_t len;                // its bytes
};

struct alignas(64) ShmHead {
  std::atomic<std::uint64_t> magic;  // set last, once the rest is ready
  std::int32_t nranks;
  std::int32_t creator;
  std::uint64_t creator_start;
  pthread_mutex_t mu;
};

constexpr std::size_t RoundUp(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

struct Layout {
  explicit Layout(int nranks) {
    const std::size_t n = static_cast<std::size_t>(nranks);
    box_bytes = std::clamp<std::size_t>((std::size_t{64} << 20) / (n * n),
                                        4096, std::size_t{256} << 10);
    box_bytes = box_bytes / 4096 * 4096;
    ranks = RoundUp(sizeof(ShmHead), 4096);
    boxes = ranks + n * sizeof(ShmRank);
    stage = RoundUp(boxes + n * n * sizeof(ShmBox), 4096);
    box_data = stage + n * kStage;
    size = box_data + n * n * box_bytes;
  }
  std::size_t box_bytes, ranks, boxes, stage, box_data, size;
};

int NcclLock(pthread_mutex_t* mu) {
  const int rc = pthread_mutex_lock(mu);
  // Its holder died mid-update: the fields it guards are single stores.
  if (rc == EOWNERDEAD) pthread_mutex_consistent(mu);
  return rc;
}

class Shm {
 public:
  Shm(std::string name, int nranks, void* base)
      : name_(std::move(name)), n_(nranks), layout_(nranks),
        base_(static_cast<unsigned char*>(base)) {}
  ~Shm() { ::munmap(base_, layout_.size); }
  Shm(const Shm&) = delete;
  Shm& operator=(const Shm&) = delete;

  // Opens (or makes) the segment `name` for `nranks` ranks; null, with the
  // reason in *error, when it cannot.
  static std::unique_ptr<Shm> Open(const std::string& name, int nranks,
                                   std::string* error);

  ShmHead* head() { return reinterpret_cast<ShmHead*>(base_); }
  ShmRank* rank(int r) {
    return reinterpret_cast<ShmRank*>(base_ + layout_.ranks) + r;
  }
  ShmBox* box(int from, int to) {
    return reinterpret_cast<ShmBox*>(base_ + layout_.boxes) + from * n_ + to;
  }
  unsigned char* stage(int r) {
    return base_ + layout_.stage + static_cast<std::size_t>(r) * kStage;
  }
  unsigned char* box_data(int from, int to) {
    return base_ + layout_.box_data +
           static_cast<std::size_t>(from * n_ + to) * layout_.box_bytes;
  }
  std::size_t box_bytes() const { return layout_.box_bytes; }
  const std::string& name() const { return name_; }

  // Takes rank `r`'s slot for this process (kInvalidUsage, said on stderr,
  // when a live process holds it).
  int Join(int r);
  // Gives rank `r`'s slot up; the last rank to leave removes the segment.
  void Leave(int r);
  // Whether every rank that joined is gone (left, or its process died),
  // and at least one did: a finished or killed run's segment. Under mu.
  bool Stale();

  // -1: not known yet; 0: the ranks span processes; 1: all are this
  // process's.
  std::atomic<int> local{-1};

 private:
  const std::string name_;
  const int n_;
  const Layout layout_;
  unsigned char* const base_;
};

std::unique_ptr<Shm> Shm::Open(const std::string& name, int nranks,
                               std::string* error) {
  const Layout layout(nranks);
  bool made = true;
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    made = false;
    fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  }
  if (fd < 0) {
    *error = "shm_open(" + name + "): " + std::strerror(errno);
    return nullptr;
  }
  if (made && ::ftruncate(fd, static_cast<off_t>(layout.size)) != 0) {
    *error = "ftruncate(" + name + "): " + std::strerror(errno);
    ::close(fd);
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  struct stat st {};
  for (int i = 0; !made && i < 2000; ++i) {  // its maker sizes it
    if (::fstat(fd, &st) == 0 && st.st_size > 0) break;
    ::usleep(1000);
  }
  if (!made && static_cast<std::size_t>(st.st_size) != layout.size) {
    *error = name + " was made for another number of ranks than " +
             std::to_string(nranks) + " (every rank of a unique id must "
             "pass the same nranks)";
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, layout.size, PROT_READ | PROT_WRITE, MAP_SHARED,
                   fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    *error = "mmap(" + name + "): " + std::strerror(errno);
    return nullptr;
  }
  auto shm = std::make_unique<Shm>(name, nranks, p);
  ShmHead* h = shm->head();
  if (made) {
    h->nranks = nranks;
    h->creator = static_cast<std::int32_t>(::getpid());
    h->creator_start = fg::ProcessStartTime(h->creator);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&h->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    h->magic.store(kShmMagic, std::memory_order_release);
  } else {
    for (int i = 0; i < 2000; ++i) {
      if (h->magic.load(std::memory_order_acquire) == kShmMagic) break;
      ::usleep(1000);
    }
    if (h->magic.load(std::memory_order_acquire) != kShmMagic ||
        h->nranks != nranks) {
      *error = name + " is not a fake NCCL segment of " +
               std::to_string(nranks) + " ranks";
      return nullptr;
    }
  }
  return shm;
}

bool Shm::Stale() {
  bool any = false;
  for (int r = 0; r < n_; ++r) {
    ShmRank* s = rank(r);
    const int pid = s->pid.load();
    if (pid == 0) continue;
    any = true;
    if (s->state.load() == kJoined && fg::ProcessAlive(pid, s->start))
      return false;
  }
  return any;
}

int Shm::Join(int r) {
  ShmHead* h = head();
  NcclLock(&h->mu);
  if (Stale()) {  // a segment left by an earlier run of this id: reset
    for (int i = 0; i < n_; ++i) {
      ShmRank* s = rank(i);
      s->pid.store(0);
      s->state.store(kFree);
      s->phase.store(0);
      s->next.store(0);
      s->splits.store(0);
      s->splits_read.store(0);
      for (int j = 0; j < n_; ++j) {
        box(i, j)->seq.store(0);
        box(i, j)->full.store(0);
      }
    }
  }
  ShmRank* s = rank(r);
  const int pid = s->pid.load();
  if (pid != 0 && s->state.load() == kJoined &&
      fg::ProcessAlive(pid, s->start)) {
    pthread_mutex_unlock(&h->mu);
    std::fprintf(stderr,
                 "jaxlake fake GPU: ncclCommInitRank: rank %d of %s is "
                 "already held by process %d\n", r, name_.c_str(), pid);
    return kInvalidUsage;
  }
  s->start = fg::ProcessStartTime(static_cast<int>(::getpid()));
  s->phase.store(0);
  s->next.store(0);
  s->splits.store(0);
  s->splits_read.store(0);
  s->state.store(kJoined);
  s->pid.store(static_cast<std::int32_t>(::getpid()));
  pthread_mutex_unlock(&h->mu);
  return kSuccess;
}

void Shm::Leave(int r) {
  ShmHead* h = head();
  NcclLock(&h->mu);
  rank(r)->state.store(kLeft);
  bool last = true;
  for (int i = 0; i < n_ && last; ++i) {
    ShmRank* s = rank(i);
    last = s->state.load() == kLeft ||
           (s->pid.load() != 0 && !fg::ProcessAlive(s->pid.load(), s->start));
  }
  if (last) ::shm_unlink(name_.c_str());
  pthread_mutex_unlock(&h->mu);
}

// Removes the segments of this user whose processes are all gone.
void RemoveStaleSegments() {
  const std::string prefix =
      std::string(kShmPrefix + 1) + std::to_string(::getuid()) + "-";
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(dir))
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0)
      names.push_back(std::string("/") + e->d_name);
  ::closedir(dir);
  for (const std::string& name : names) {
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) continue;
    struct stat st {};
    void* p = MAP_FAILED;
    if (::fstat(fd, &st) == 0 &&
        static_cast<std::size_t>(st.st_size) >= sizeof(ShmHead))
      p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size),
                 PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) continue;
    auto* h = static_cast<ShmHead*>(p);
    if (h->magic.load(std::memory_order_acquire) == kShmMagic &&
        h->nranks > 0 &&
        Layout(h->nranks).size == static_cast<std::size_t>(st.st_size) &&
        !fg::ProcessAlive(h->creator, h->creator_start)) {
      Shm view(name, h->nranks, p);  // unmaps it when it goes
      NcclLock(&h->mu);
      bool gone = true;
      for (int r = 0; r < h->nranks && gone; ++r) {
        ShmRank* s = view.rank(r);
        gone = s->pid.load() == 0 || s->state.load() == kLeft ||
               !fg::ProcessAlive(s->pid.load(), s->start);
      }
      if (gone) ::shm_unlink(name.c_str());
      pthread_mutex_unlock(&h->mu);
      continue;
    }
    ::munmap(p, static_cast<std::size_t>(st.st_size));
  }
}

Clique::Clique(int n) : nranks(n) {}
Clique::~Clique() = default;

// Ends clique `c` with `code`, said once on stderr.
void Fail(Clique* c, int code, const std::string& why) {
  int none = 0;
  if (c->error.compare_exchange_strong(none, code))
    std::fprintf(stderr, "jaxlake fake GPU: %s (%s)\n", why.c_str(),
                 code == kRemoteError ? "ncclRemoteError" : "ncclSystemError");
}

// Waits until `ready()` (which may make progress) holds for clique `c`'s
// segment: kSuccess, or the clique's error once a peer's process is gone
// or kPeerWait has passed.
int WaitShared(Clique* c, const std::function<bool()>& ready,
               const char* what) {
  Shm* m = c->shm.get();
  const auto t0 = std::chrono::steady_clock::now();
  auto next_check = t0 + std::chrono::milliseconds(50);
  const int me = static_cast<int>(::getpid());
  for (unsigned i = 0;; ++i) {
    if (const int e = c->error.load()) return e;
    if (ready()) return kSuccess;
    if (i < 64) {
      sched_yield();
    } else {
      ::usleep(i < 2000 ? 20 : 200);
    }
    const auto now = std::chrono::steady_clock::now();
    if (now < next_check) continue;
    next_check = now + std::chrono::milliseconds(50);
    for (int r = 0; r < c->nranks; ++r) {
      ShmRank* s = m->rank(r);
      const int pid = s->pid.load();
      if (pid == 0 || pid == me || fg::ProcessAlive(pid, s->start)) continue;
      if (ready()) return kSuccess;  // it finished its part, then exited
      Fail(c, kRemoteError,
           std::string(what) + ": rank " + std::to_string(r) + " (process " +
               std::to_string(pid) + ") of " + m->name() +
               " exited; the communicator fails");
      return c->error.load();
    }
    if (now - t0 > kPeerWait) {
      Fail(c, kRemoteError,
           std::string(what) + " waited " +
               std::to_string(static_cast<long long>(kPeerWait.count())) +
               " s for its peers in " + m->name() + "; the communicator fails");
      return c->error.load();
    }
  }
}

// Whether clique `c`'s ranks span processes, once all have joined;
// *failed (and the clique's error set) when they do not all come.
bool Spans(Clique* c, const char* what, bool* failed) {
  *failed = false;
  Shm* m = c->shm.get();
  const int known = m->local.load();
  if (known >= 0) return known == 0;
  const int err = WaitShared(c, [&] {
    for (int r = 0; r < c->nranks; ++r)
      if (m->rank(r)->state.load() == kFree) return false;
    return true;
  }, what);
  if (err != kSuccess) {
    *failed = true;
    return true;
  }
  const int me = static_cast<int>(::getpid());
  int local = 1;
  for (int r = 0; r < c->nranks; ++r)
    if (m->rank(r)->pid.load() != me) local = 0;
  m->local.store(local);
  return local == 0;
}

// Every rank of clique `c` meets: rank `me` raises its counter and waits
// for all others to reach it.
int Barrier(Clique* c, int me, const char* what) {
  Shm* m = c->shm.get();
  const std::uint64_t v = m->rank(me)->phase.load() + 1;
  m->rank(me)->phase.store(v, std::memory_order_release);
  return WaitShared(c, [&] {
    for (int r = 0; r < c->nranks; ++r)
      if (m->rank(r)->phase.load(std::memory_order_acquire) < v) return false;
    return true;
  }, what);
}

// A collective meeting, run on rank `p.rank`'s stream.
void RunCollective(const Pending& p, const char* name) {
  Clique* c = p.clique.get();
  const int n = c->nranks, me = p.rank;
  std::unique_lock<std::mutex> lock(c->mu);
  const std::shared_ptr<Slot> s = SlotOf(c->collectives, p.seq);
  if (s->send.empty()) {
    s->send.assign(static_cast<std::size_t>(n), nullptr);
    s->recv.assign(static_cast<std::size_t>(n), nullptr);
  }
  s->send[static_cast<std::size_t>(me)] = p.send;
  s->recv[static_cast<std::size_t>(me)] = p.recv;
  ++s->arrived;
  c->cv.notify_all();
  if (!Wait(c, lock, [&] { return s->arrived == n; }, name)) return;
  lock.unlock();
  auto* to = static_cast<unsigned char*>(p.recv);
  for (int j = 0; j < n; ++j) {
    const auto* from =
        static_cast<const unsigned char*>(s->send[static_cast<std::size_t>(j)]);
    switch (p.op) {
      case Op::kAllToAll:  // my block j is rank j's block `me`
        fg::Move(to + j * p.bytes, from + me * p.bytes, p.bytes);
        break;
      case Op::kAllGather:  // my block j is rank j's buffer
        fg::Move(to + j * p.bytes, from, p.bytes);
        break;
      case Op::kBroadcast:
        if (j == p.root_or_peer && from != to) fg::Move(to, from, p.bytes);
        break;
      default:
        break;
    }
  }
  lock.lock();
  // No rank goes on (and overwrites its buffers) until all have read them.
  if (++s->left == n) c->collectives.erase(p.seq);
  c->cv.notify_all();
  Wait(c, lock, [&] { return s->left == n; }, name);
}

// A collective meeting across processes, run on rank `p.rank`'s stream.
int RunCollectiveShared(const Pending& p, const char* name) {
  Clique* c = p.clique.get();
  Shm* m = c->shm.get();
  const int n = c->nranks, me = p.rank;
  const std::size_t nn = static_cast<std::size_t>(n);
  // What each rank stages (a byte stream `total` long for every rank; a
  // broadcast's non-roots stage nothing).
  const auto* src = static_cast<const unsigned char*>(p.send);
  std::size_t mine = p.bytes, total = p.bytes;
  if (p.op == Op::kAllToAll) mine = total = nn * p.bytes;
  if (p.op == Op::kBroadcast && me != p.root_or_peer) mine = 0;
  auto* to = static_cast<unsigned char*>(p.recv);
  std::atomic<std::uint64_t>& next = m->rank(me)->next;
  if (const int e = WaitShared(
          c, [&] { return next.load(std::memory_order_acquire) == p.seq; },
          name))
    return e;
  struct Done {  // the next collective may run, however this one ends
    std::atomic<std::uint64_t>& next;
    std::uint64_t seq;
    ~Done() { next.store(seq + 1, std::memory_order_release); }
  } done{next, p.seq};
  for (std::size_t off = 0; off == 0 || off < total; off += kStage) {
    const std::size_t len = std::min(kStage, total - off);
    if (mine > off)
      std::memcpy(m->stage(me), src + off, std::min(len, mine - off));
    if (const int e = Barrier(c, me, name)) return e;
    for (int j = 0; j < n; ++j) {
      const unsigned char* st = m->stage(j);
      const std::size_t jj = static_cast<std::size_t>(j);
      switch (p.op) {
        case Op::kAllGather:  // my block j is rank j's buffer
          std::memcpy(to + jj * p.bytes + off, st, len);
          break;
        case Op::kAllToAll: {  // my block j is rank j's block `me`
          const std::size_t b = static_cast<std::size_t>(me) * p.bytes;
          const std::size_t lo = std::max(off, b);
          const std::size_t hi = std::min(off + len, b + p.bytes);
          if (lo < hi)
            std::memcpy(to + jj * p.bytes + (lo - b), st + (lo - off), hi - lo);
          break;
        }
        case Op::kBroadcast:
          if (j == p.root_or_peer) std::memcpy(to + off, st, len);
          break;
        default:
          break;
      }
    }
    // No rank stages the next round until all have read this one.
    if (const int e = Barrier(c, me, name)) return e;
  }
  return kSuccess;
}

// One rank's group across processes: its sends and receives move chunk by
// chunk through their pairs' mailboxes, all at once, then the collectives
// run in order.
void RunGroupShared(const std::vector<Pending>& ops) {
  Clique* c = ops.front().clique.get();
  Shm* m = c->shm.get();
  struct Transfer {
    const Pending* p;
    std::size_t done;
    bool finished;
  };
  std::vector<Transfer> transfers;
  for (const Pending& p : ops)
    if (p.op == Op::kSend || p.op == Op::kRecv)
      transfers.push_back({&p, 0, false});
  const auto step = [m](Transfer& t) {
    const Pending& p = *t.p;
    if (p.op == Op::kSend) {
      ShmBox* b = m->box(p.rank, p.root_or_peer);
      if (b->seq.load(std::memory_order_acquire) != p.seq ||
          b->full.load(std::memory_order_acquire) != 0)
        return;
      const std::size_t len = std::min(m->box_bytes(), p.bytes - t.done);
      std::memcpy(m->box_data(p.rank, p.root_or_peer),
                  static_cast<const unsigned char*>(p.send) + t.done, len);
      b->len = len;
      b->full.store(1, std::memory_order_release);
      t.done += len;
      t.finished = t.done == p.bytes;
    } else {
      ShmBox* b = m->box(p.root_or_peer, p.rank);
      if (b->seq.load(std::memory_order_acquire) != p.seq ||
          b->full.load(std::memory_order_acquire) == 0)
        return;
      const std::size_t len = std::min<std::size_t>(b->len, p.bytes - t.done);
      std::memcpy(static_cast<unsigned char*>(p.recv) + t.done,
                  m->box_data(p.root_or_peer, p.rank), len);
      t.done += len;
      t.finished = t.done == p.bytes || b->len < m->box_bytes();
      b->full.store(0, std::memory_order_release);
      if (t.finished) b->seq.store(p.seq + 1, std::memory_order_release);
    }
  };
  if (!transfers.empty()) {
    const char* what = transfers.front().p->op == Op::kSend ? "ncclSend"
                                                            : "ncclRecv";
    if (WaitShared(c, [&] {
          bool all = true;
          for (Transfer& t : transfers) {
            if (!t.finished) step(t);
            all = all && t.finished;
          }
          return all;
        }, what) != kSuccess)
      return;
  }
  for (const Pending& p : ops) {
    int e = kSuccess;
    switch (p.op) {
      case Op::kAllToAll: e = RunCollectiveShared(p, "ncclAlltoAll"); break;
      case Op::kAllGather: e = RunCollectiveShared(p, "ncclAllGather"); break;
      case Op::kBroadcast: e = RunCollectiveShared(p, "ncclBroadcast"); break;
      default: break;
    }
    if (e != kSuccess) return;
  }
}

// One rank's group on one stream: sends posted, receives copied, then the
// sends waited for (so that a group of sends and receives between two
// ranks cannot deadlock), then the collectives in order.
void RunGroup(const std::vector<Pending>& ops) {
  Clique* clique = ops.front().clique.get();
  if (clique->shm != nullptr) {
    bool failed = false;
    if (Spans(clique, "ncclCommInitRank", &failed)) {
      if (!failed) RunGroupShared(ops);
      return;
    }
  }
  for (const Pending& p : ops) {
    if (p.op != Op::kSend) continue;
    Clique* c = p.clique.get();
    std::lock_guard<std::mutex> lock(c->mu);
    const auto s = SlotOf(
        c->sends, std::make_tuple(p.rank, p.root_or_peer, p.seq));
    s->send = {p.send};
    s->arrived = 1;
    c->cv.notify_all();
  }
  for (const Pending& p : ops) {
    if (p.op != Op::kRecv) continue;
    Clique* c = p.clique.get();
    std::unique_lock<std::mutex> lock(c->mu);
    const auto s = SlotOf(
        c->sends, std::make_tuple(p.root_or_peer, p.rank, p.seq));
    if (!Wait(c, lock, [&] { return s->arrived == 1; }, "ncclRecv")) continue;
    lock.unlock();
    fg::Move(p.recv, s->send[0], p.bytes);
    lock.lock();
    s->consumed = true;
    c->cv.notify_all();
  }
  for (const Pending& p : ops) {
    if (p.op != Op::kSend) continue;
    Clique* c = p.clique.get();
    std::unique_lock<std::mutex> lock(c->mu);
    const auto key = std::make_tuple(p.rank, p.root_or_peer, p.seq);
    const auto s = SlotOf(c->sends, key);
    Wait(c, lock, [&] { return s->consumed; }, "ncclSend");
    c->sends.erase(key);
  }
  for (const Pending& p : ops) {
    switch (p.op) {
      case Op::kAllToAll: RunCollective(p, "ncclAlltoAll"); break;
      case Op::kAllGather: RunCollective(p, "ncclAllGather"); break;
      case Op::kBroadcast: RunCollective(p, "ncclBroadcast"); break;
      default: break;
    }
  }
}

// The calling thread's group (ncclGroupStart ... ncclGroupEnd).
thread_local int group_depth = 0;
thread_local std::vector<Pending> group_ops;

// Enqueues the pending operations, one work item a (communicator, stream).
int Flush() {
  std::vector<Pending> ops;
  ops.swap(group_ops);
  std::vector<std::pair<std::pair<Comm*, void*>, std::vector<Pending>>> units;
  for (const Pending& p : ops) {
    auto key = std::make_pair(p.comm, p.stream);  // identity only
    auto it = units.begin();
    while (it != units.end() && it->first != key) ++it;
    if (it == units.end()) {
      units.push_back({key, {}});
      it = units.end() - 1;
    }
    it->second.push_back(p);
  }
  for (auto& [key, unit] : units) {
    fg::Stream* s = fg::StreamOf(key.second, unit.front().device);
    if (s == nullptr) return kInvalidArgument;
    bool moves = false;
    for (const Pending& p : unit) moves |= p.op != Op::kNothing;
    if (!moves) {
      s->Enqueue([] {});  // a kernel: it does not run
      continue;
    }
    s->Enqueue([unit = std::move(unit)] { RunGroup(unit); });
  }
  return kSuccess;
}

int Issue(Pending p) {
  if (p.comm == nullptr) return kInvalidArgument;
  Comm* c = p.comm;
  if (const int e = c->clique->error.load()) return e;
  if (p.op == Op::kSend || p.op == Op::kRecv) {
    if (p.root_or_peer < 0 || p.root_or_peer >= c->clique->nranks)
      return kInvalidArgument;
    auto& counter = p.op == Op::kSend ? c->sent : c->received;
    p.seq = counter[p.root_or_peer]++;
  } else if (p.op != Op::kNothing) {
    p.seq = c->collectives++;
  }
  p.clique = c->clique;
  p.rank = c->rank;
  p.device = c->device;
  group_ops.push_back(std::move(p));
  return group_depth > 0 ? kSuccess : Flush();
}

Comm* AsComm(void* comm) { return static_cast<Comm*>(comm); }

int NewComm(void** out, std::shared_ptr<Clique> clique, int rank) {
  const int d = fg::CurrentDevice();
  *out = new Comm(std::move(clique), rank, d < 0 ? 0 : d);
  return kSuccess;
}

struct UniqueId {
  unsigned char internal[128];
};

// At exit, this process's ranks leave their segments (a program need not
// destroy its communicators).
void LeaveAtExit() {
  std::lock_guard<std::mutex> lock(R().mu);
  const int me = static_cast<int>(::getpid());
  for (auto& [id, clique] : R().by_id) {
    Shm* m = clique != nullptr ? clique->shm.get() : nullptr;
    if (m == nullptr) continue;
    for (int r = 0; r < clique->nranks; ++r)
      if (m->rank(r)->pid.load() == me && m->rank(r)->state.load() == kJoined)
        m->Leave(r);
  }
}

int InitRank(void** comm, int nranks, const UniqueId& id, int rank) {
  if (comm == nullptr || nranks <= 0 || rank < 0 || rank >= nranks)
    return kInvalidArgument;
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    const std::string key(reinterpret_cast<const char*>(id.internal),
                          sizeof id.internal);
    auto& slot = R().by_id[key];
    if (slot == nullptr || slot->nranks != nranks) {
      auto fresh = std::make_shared<Clique>(nranks);
      fresh->id = key;
      const char* name = reinterpret_cast<const char*>(id.internal);
      if (std::strncmp(name, kShmPrefix, sizeof kShmPrefix - 1) == 0 &&
          std::memchr(name, 0, sizeof id.internal) != nullptr) {
        std::string error;
        fresh->shm = Shm::Open(name, nranks, &error);
        if (fresh->shm == nullptr) {
          std::fprintf(stderr, "jaxlake fake GPU: ncclCommInitRank: %s\n",
                       error.c_str());
          R().by_id.erase(key);
          return kSystemError;
        }
        static const bool registered = [] {
          std::atexit(LeaveAtExit);
          return true;
        }();
        (void)registered;
      }
      slot = std::move(fresh);
    }
    clique = slot;
    if (clique->shm != nullptr) {
      if (const int e = clique->shm->Join(rank)) return e;
      ++clique->comms;
    }
  }
  return NewComm(comm, std::move(clique), rank);
}

// ncclCommSplit of a communicator whose ranks span processes: each rank
// publishes its color and key in the parent's segment and waits for every
// rank's; the ranks of one color then join the segment named by the
// parent's, the split's number and the color, ordered by (key, parent
// rank). Bounded like the collectives' waits (a dead peer fails the parent).
int SplitShared(Comm* parent, int color, int key, void** out) {
  Clique* c = parent->clique.get();
  Shm* m = c->shm.get();
  const int n = c->nranks, me = parent->rank;
  const std::uint64_t seq = parent->nsplits++;
  const auto all = [&](std::atomic<std::uint64_t> ShmRank::*field,
                       std::uint64_t at_least) {
    return [=] {
      for (int r = 0; r < n; ++r)
        if ((m->rank(r)->*field).load(std::memory_order_acquire) < at_least)
          return false;
      return true;
    };
  };
  // Every rank has read the previous split's colors before they change.
  if (const int e = WaitShared(c, all(&ShmRank::splits_read, seq),
                               "ncclCommSplit"))
    return e;
  ShmRank* mine = m->rank(me);
  mine->split_color.store(color);
  mine->split_key.store(key);
  mine->splits.store(seq + 1, std::memory_order_release);
  if (const int e = WaitShared(c, all(&ShmRank::splits, seq + 1),
                               "ncclCommSplit"))
    return e;
  std::vector<std::pair<int, int>> members;  // (key, parent rank)
  for (int r = 0; r < n && color >= 0; ++r)
    if (m->rank(r)->split_color.load() == color)
      members.emplace_back(m->rank(r)->split_key.load(), r);
  mine->splits_read.store(seq + 1, std::memory_order_release);
  if (color < 0) return kSuccess;  // NCCL_SPLIT_NOCOLOR: no communicator
  std::sort(members.begin(), members.end());
  const int rank = static_cast<int>(
      std::find(members.begin(), members.end(), std::make_pair(key, me)) -
      members.begin());
  const std::string name =
      m->name() + "-" + std::to_string(seq) + "c" + std::to_string(color);
  UniqueId id{};
  if (name.size() >= sizeof id.internal) {
    std::fprintf(stderr,
                 "jaxlake fake GPU: ncclCommSplit: the new communicator's "
                 "segment name %s is longer than a unique id holds (splits "
                 "nested too deep)\n", name.c_str());
    return kInvalidUsage;
  }
  std::memcpy(id.internal, name.data(), name.size());
  const int e =
      InitRank(out, static_cast<int>(members.size()), id, rank);
  if (e == kSuccess) AsComm(*out)->device = parent->device;
  return e;
}

}  // namespace

// ---- versions, ids and communicators ----------------------------------------

LIB int ncclGetVersion(int* v) {
  ENTER();
  if (v == nullptr) return kInvalidArgument;
  *v = kVersion;
  return kSuccess;
}

LIB int ncclGetUniqueId(UniqueId* id) {
  ENTER();
  if (id == nullptr) return kInvalidArgument;
  static std::atomic<unsigned> n{0};
  RemoveStaleSegments();
  // The segment's name: this user's, this process's, and random bits (a
  // later process may reuse the pid).
  std::uint64_t random = 0;
  if (std::FILE* f = std::fopen("/dev/urandom", "rb")) {
    if (std::fread(&random, sizeof random, 1, f) != 1) random = 0;
    std::fclose(f);
  }
  random ^= static_cast<std::uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(reinterpret_cast<char*>(id->internal), sizeof id->internal,
                "%s%u-%d-%u-%016llx", kShmPrefix,
                static_cast<unsigned>(::getuid()), static_cast<int>(::getpid()),
                n.fetch_add(1), static_cast<unsigned long long>(random));
  return kSuccess;
}

LIB int ncclCommInitRank(void** comm, int nranks, UniqueId id, int rank) {
  ENTER();
  return InitRank(comm, nranks, id, rank);
}

LIB int ncclCommInitRankConfig(void** comm, int nranks, UniqueId id, int rank,
                               void*) {
  ENTER();
  return InitRank(comm, nranks, id, rank);
}

LIB int ncclCommInitRankScalable(void** comm, int nranks, int rank, int nids,
                                 UniqueId* ids, void*) {
  ENTER();
  if (nids < 1 || ids == nullptr) return kInvalidArgument;
  return InitRank(comm, nranks, ids[0], rank);
}

LIB int ncclCommInitAll(void** comms, int n, const int* devices) {
  ENTER();
  if (comms == nullptr || n <= 0) return kInvalidArgument;
  auto clique = std::make_shared<Clique>(n);
  for (int i = 0; i < n; ++i) {
    const int d = devices != nullptr ? devices[i] : i;
    comms[i] = new Comm(clique, i, d);
  }
  return kSuccess;
}

// A split is collective: every rank of the parent calls it (NCCL_SPLIT_NOCOLOR
// for none). The new communicators are complete once every parent rank has
// split; ranks are ordered by key, then by parent rank. A parent whose ranks
// span processes splits through its segment (SplitShared): the call returns
// once every parent rank has made it.
LIB int ncclCommSplit(void* comm, int color, int key, void** out, void*) {
  ENTER();
  Comm* parent = AsComm(comm);
  if (parent == nullptr || out == nullptr) return kInvalidArgument;
  *out = nullptr;
  if (parent->clique == nullptr) {  // itself a split not yet complete
    std::fprintf(stderr,
                 "jaxlake fake GPU: ncclCommSplit: the parent is a split "
                 "that not every rank of its own parent has made yet\n");
    return kInvalidUsage;
  }
  if (const int e = parent->clique->error.load()) return e;
  if (parent->clique->shm != nullptr) {
    bool failed = false;
    if (Spans(parent->clique.get(), "ncclCommSplit", &failed)) {
      if (failed) return parent->clique->error.load();
      return SplitShared(parent, color, key, out);
    }
  }
  std::lock_guard<std::mutex> lock(R().mu);
  const std::uint64_t n = parent->nsplits++;
  auto& split = R().splits[{parent->clique.get(), n}];
  if (color >= 0) {
    auto* c = new Comm(nullptr, 0, parent->device);
    split.by_color[color].emplace_back(key, parent->rank, c);
    *out = c;
  }
  if (++split.called == parent->clique->nranks) {
    for (auto& [col, members] : split.by_color) {
      std::sort(members.begin(), members.end());
      auto clique = std::make_shared<Clique>(static_cast<int>(members.size()));
      for (std::size_t i = 0; i < members.size(); ++i) {
        Comm* c = std::get<2>(members[i]);
        c->clique = clique;
        c->rank = static_cast<int>(i);
      }
    }
    R().splits.erase({parent->clique.get(), n});
  }
  return kSuccess;
}

LIB int ncclCommDestroy(void* comm) {
  ENTER();
  Comm* c = AsComm(comm);
  if (c != nullptr && c->clique != nullptr && c->clique->shm != nullptr) {
    std::lock_guard<std::mutex> lock(R().mu);  // beside LeaveAtExit
    Clique* q = c->clique.get();
    ShmRank* s = q->shm->rank(c->rank);
    if (s->pid.load() == static_cast<int>(::getpid()) &&
        s->state.load() == kJoined)
      q->shm->Leave(c->rank);
    if (--q->comms == 0) {
      const auto it = R().by_id.find(q->id);
      if (it != R().by_id.end() && it->second.get() == q) R().by_id.erase(it);
    }
  }
  delete c;
  return kSuccess;
}
LIB int ncclCommAbort(void* comm) { return ncclCommDestroy(comm); }
LIB int ncclCommFinalize(void* comm) {
  ENTER();
  return comm == nullptr ? kInvalidArgument : kSuccess;
}

namespace {
// A split communicator is usable once every parent rank has split.
bool Ready(const Comm* c) { return c != nullptr && c->clique != nullptr; }
}  // namespace

LIB int ncclCommCount(const void* comm, int* n) {
  ENTER();
  const Comm* c = static_cast<const Comm*>(comm);
  if (n == nullptr || !Ready(c)) return kInvalidArgument;
  *n = c->clique->nranks;
  return kSuccess;
}
LIB int ncclCommUserRank(const void* comm, int* rank) {
  ENTER();
  const Comm* c = static_cast<const Comm*>(comm);
  if (rank == nullptr || !Ready(c)) return kInvalidArgument;
  *rank = c->rank;
  return kSuccess;
}
LIB int ncclCommCuDevice(const void* comm, int* device) {
  ENTER();
  const Comm* c = static_cast<const Comm*>(comm);
  if (device == nullptr || c == nullptr) return kInvalidArgument;
  *device = c->device;
  return kSuccess;
}
LIB int ncclCommGetAsyncError(void* comm, int* result) {
  ENTER();
  if (comm == nullptr || result == nullptr) return kInvalidArgument;
  const Comm* c = AsComm(comm);
  *result = c->clique != nullptr ? c->clique->error.load() : kSuccess;
  return kSuccess;
}

// ncclCommProperties_t's leading fields (nccl_device/host.h): the caller
// sets size, magic and version; the fake fills what it can say and zeroes
// the rest of the caller's size (no device API, no multimem, no GIN).
struct CommPropertiesHead {
  std::size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;
};

LIB int ncclCommQueryProperties(void* comm, CommPropertiesHead* props) {
  ENTER();
  const Comm* c = AsComm(comm);
  if (props == nullptr || !Ready(c) || props->size < sizeof *props)
    return kInvalidArgument;
  const std::size_t size = props->size;
  std::memset(reinterpret_cast<char*>(props) + 16, 0, size - 16);
  props->rank = c->rank;
  props->nRanks = c->clique->nranks;
  props->cudaDev = c->device;
  props->nvmlDev = c->device;
  return kSuccess;
}

LIB int ncclCommRegister(const void* comm, void* buff, std::size_t,
                         void** handle) {
  ENTER();
  if (comm == nullptr || handle == nullptr) return kInvalidArgument;
  *handle = buff;
  return kSuccess;
}
LIB int ncclCommDeregister(const void* comm, void*) {
  ENTER();
  return comm == nullptr ? kInvalidArgument : kSuccess;
}

LIB const char* ncclGetErrorString(int result) {
  switch (result) {
    case 0: return "no error";
    case 1: return "unhandled cuda error";
    case 2: return "unhandled system error";
    case 3: return "internal error";
    case 4: return "invalid argument";
    case 5: return "invalid usage";
    case 6: return "remote process exited or there was a network error";
    case 7: return "NCCL operation in progress";
    case 8: return "timeout";
    default: return "unknown result code";
  }
}
LIB const char* ncclGetLastError(void*) { return ""; }

// ---- groups and collectives -------------------------------------------------

LIB int ncclGroupStart() {
  ENTER();
  ++group_depth;
  return kSuccess;
}

LIB int ncclGroupEnd() {
  ENTER();
  if (group_depth == 0) return kInvalidUsage;
  return --group_depth == 0 ? Flush() : kSuccess;
}

namespace {
int Collective(Op op, const void* send, void* recv, std::size_t count,
               int type, int root, void* comm, void* stream) {
  Comm* c = AsComm(comm);
  const std::size_t size = TypeSize(type);
  if (!Ready(c) || size == 0) return kInvalidArgument;
  if (op != Op::kNothing && count > 0 && (send == nullptr || recv == nullptr))
    return kInvalidArgument;
  if (op == Op::kBroadcast && (root < 0 || root >= c->clique->nranks))
    return kInvalidArgument;
  if (count == 0) op = Op::kNothing;
  return Issue({op, c, stream, send, recv, count * size, root, 0, nullptr, 0, 0});
}
}  // namespace

// count is elements a block: sendbuff holds nranks blocks, block j for
// rank j; recvbuff's block j comes from rank j.
LIB int ncclAlltoAll(const void* send, void* recv, std::size_t count,
                     int type, void* comm, void* stream) {
  ENTER();
  return Collective(Op::kAllToAll, send, recv, count, type, 0, comm, stream);
}

LIB int ncclAllGather(const void* send, void* recv, std::size_t count,
                      int type, void* comm, void* stream) {
  ENTER();
  return Collective(Op::kAllGather, send, recv, count, type, 0, comm, stream);
}

LIB int ncclBroadcast(const void* send, void* recv, std::size_t count,
                      int type, int root, void* comm, void* stream) {
  ENTER();
  const bool is_root = Ready(AsComm(comm)) && AsComm(comm)->rank == root;
  return Collective(Op::kBroadcast, is_root ? send : recv, recv, count, type,
                    root, comm, stream);
}

LIB int ncclBcast(void* buff, std::size_t count, int type, int root,
                  void* comm, void* stream) {
  ENTER();
  return Collective(Op::kBroadcast, buff, buff, count, type, root, comm,
                    stream);
}

// The reductions compute: kernels, which do not run.
LIB int ncclAllReduce(const void*, void*, std::size_t count, int type, int,
                      void* comm, void* stream) {
  ENTER();
  return Collective(Op::kNothing, nullptr, nullptr, count, type, 0, comm,
                    stream);
}

LIB int ncclReduceScatter(const void*, void*, std::size_t count, int type,
                          int, void* comm, void* stream) {
  ENTER();
  return Collective(Op::kNothing, nullptr, nullptr, count, type, 0, comm,
                    stream);
}

LIB int ncclReduce(const void*, void*, std::size_t count, int type, int,
                   int root, void* comm, void* stream) {
  ENTER();
  Comm* c = AsComm(comm);
  if (Ready(c) && (root < 0 || root >= c->clique->nranks))
    return kInvalidArgument;
  return Collective(Op::kNothing, nullptr, nullptr, count, type, 0, comm,
                    stream);
}

LIB int ncclSend(const void* send, std::size_t count, int type, int peer,
                 void* comm, void* stream) {
  ENTER();
  Comm* c = AsComm(comm);
  const std::size_t size = TypeSize(type);
  if (!Ready(c) || size == 0 || (count > 0 && send == nullptr))
    return kInvalidArgument;
  return Issue(
      {Op::kSend, c, stream, send, nullptr, count * size, peer, 0, nullptr, 0, 0});
}

LIB int ncclRecv(void* recv, std::size_t count, int type, int peer,
                 void* comm, void* stream) {
  ENTER();
  Comm* c = AsComm(comm);
  const std::size_t size = TypeSize(type);
  if (!Ready(c) || size == 0 || (count > 0 && recv == nullptr))
    return kInvalidArgument;
  return Issue(
      {Op::kRecv, c, stream, nullptr, recv, count * size, peer, 0, nullptr, 0, 0});
}
