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
// parent form a clique; only ranks of one process meet (the fake has no
// network).
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
constexpr int kSuccess = 0, kInvalidArgument = 4, kInvalidUsage = 5;
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

struct Clique {
  explicit Clique(int n) : nranks(n) {}
  const int nranks;
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

// One rank's group on one stream: sends posted, receives copied, then the
// sends waited for (so that a group of sends and receives between two
// ranks cannot deadlock), then the collectives in order.
void RunGroup(const std::vector<Pending>& ops) {
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

int InitRank(void** comm, int nranks, const UniqueId& id, int rank) {
  if (comm == nullptr || nranks <= 0 || rank < 0 || rank >= nranks)
    return kInvalidArgument;
  std::shared_ptr<Clique> clique;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    auto& slot = R().by_id[std::string(
        reinterpret_cast<const char*>(id.internal), sizeof id.internal)];
    if (slot == nullptr || slot->nranks != nranks)
      slot = std::make_shared<Clique>(nranks);
    clique = slot;
  }
  return NewComm(comm, std::move(clique), rank);
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
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(reinterpret_cast<char*>(id->internal), sizeof id->internal,
                "jaxlake-fakegpu-%u", n.fetch_add(1));
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
// split; ranks are ordered by key, then by parent rank.
LIB int ncclCommSplit(void* comm, int color, int key, void** out, void*) {
  ENTER();
  Comm* parent = AsComm(comm);
  if (parent == nullptr || out == nullptr) return kInvalidArgument;
  *out = nullptr;
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
  delete AsComm(comm);
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
  *result = kSuccess;
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
