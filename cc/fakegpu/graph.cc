// The fake driver's CUDA graphs and stream capture. A graph holds nodes
// with their parameters and dependencies; instantiation clones it into an
// executable graph, whose nodes the exec setters change; a launch enqueues
// its nodes on the stream in dependency order: copies, memsets, host
// functions, event records and waits run there as stream work, kernels are
// counted and do nothing (as everywhere in the fake), child graphs run
// inline. A conditional node's body runs when its handle's value is nonzero
// (once, also for a while node: only kernels change the value, and they do
// not run). Memory alloc nodes get their address when they are created and
// count against the device from the launch that allocates them until a free
// node, cuMemFreeAsync or cuMemFree releases them. Stream capture records
// the work enqueued on a capturing stream as nodes instead of running it,
// and applies the driver's rules on calls a capture prohibits.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cc/fakegpu/driver.h"
#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

using namespace jaxlake::cuda;            // NOLINT: the driver's vocabulary
using namespace jaxlake::fakegpu::driver;  // NOLINT: its shared state
namespace fg = jaxlake::fakegpu;

namespace {

constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901;
constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903;
constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905;
constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908;
constexpr CUresult CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910;

// CUgraphNodeType
enum NodeType {
  kKernel = 0, kMemcpy = 1, kMemset = 2, kHost = 3, kGraph = 4, kEmpty = 5,
  kWaitEvent = 6, kEventRecord = 7, kMemAlloc = 10, kMemFree = 11,
  kBatchMemOp = 12, kConditional = 13,
};

// The public parameter structs of cuda.h, field for field (the fake keeps
// its own copies, as cc/vmm/cuda_types.h does).
struct Memcpy3D {  // CUDA_MEMCPY3D
  std::size_t srcXInBytes, srcY, srcZ, srcLOD;
  int srcMemoryType;
  const void* srcHost;
  CUdeviceptr srcDevice;
  void* srcArray;
  void* reserved0;
  std::size_t srcPitch, srcHeight;
  std::size_t dstXInBytes, dstY, dstZ, dstLOD;
  int dstMemoryType;
  void* dstHost;
  CUdeviceptr dstDevice;
  void* dstArray;
  void* reserved1;
  std::size_t dstPitch, dstHeight;
  std::size_t WidthInBytes, Height, Depth;
};
struct MemsetParams {  // CUDA_MEMSET_NODE_PARAMS (v2 adds ctx)
  CUdeviceptr dst;
  std::size_t pitch;
  unsigned int value;
  unsigned int elementSize;
  std::size_t width;
  std::size_t height;
};
struct HostParams {  // CUDA_HOST_NODE_PARAMS
  void (*fn)(void*);
  void* userData;
};
struct KernelParams {  // CUDA_KERNEL_NODE_PARAMS, the leading fields
  void* func;
  unsigned int grid[3];
  unsigned int block[3];
  unsigned int sharedMemBytes;
  void** kernelParams;
  void** extra;
};
struct MemLocation {  // CUmemLocation
  int type;
  int id;
};
struct PoolProps {  // CUmemPoolProps
  int allocType;
  int handleTypes;
  MemLocation location;
  void* win32SecurityAttributes;
  std::size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
};
struct MemAllocParams {  // CUDA_MEM_ALLOC_NODE_PARAMS
  PoolProps poolProps;
  const void* accessDescs;
  std::size_t accessDescCount;
  std::size_t bytesize;
  CUdeviceptr dptr;
};
struct ConditionalParams {  // CUDA_CONDITIONAL_NODE_PARAMS
  unsigned long long handle;
  int type;
  unsigned int size;
  void** phGraph_out;
  CUcontext ctx;
};
struct MemcpyNodeParams {  // CUDA_MEMCPY_NODE_PARAMS
  int flags;
  int reserved;
  CUcontext copyCtx;
  Memcpy3D copyParams;
};
struct NodeParams {  // CUgraphNodeParams
  int type;
  int reserved0[3];
  union {
    long long reserved1[29];
    KernelParams kernel;
    MemcpyNodeParams memcpy;
    MemsetParams memset;
    HostParams host;
    struct {
      void* graph;
      int ownership;  // 0 clone, 1 move
    } graph;
    struct {
      void* event;
    } event;
    MemAllocParams alloc;
    struct {
      CUdeviceptr dptr;
    } free;
    ConditionalParams conditional;
  };
  long long reserved2;
};
static_assert(sizeof(Memcpy3D) == 200, "CUDA_MEMCPY3D");
static_assert(sizeof(PoolProps) == 88, "CUmemPoolProps");
static_assert(sizeof(NodeParams) == 256, "CUgraphNodeParams");
struct InstantiateParams {  // CUDA_GRAPH_INSTANTIATE_PARAMS
  cuuint64_t flags;
  CUstream hUploadStream;
  void* hErrNode_out;
  int result_out;
};
struct UpdateResultInfo {  // CUgraphExecUpdateResultInfo
  int result;
  void* errorNode;
  void* errorFromNode;
};

struct Graph;

struct Node {
  int type = kEmpty;
  Graph* owner = nullptr;
  std::vector<Node*> deps;
  bool enabled = true;
  KernelParams kernel{};
  Memcpy3D copy{};
  MemsetParams memset{};
  HostParams host{};
  std::unique_ptr<Graph> child;        // kGraph
  std::shared_ptr<fg::Event> event;    // kWaitEvent, kEventRecord
  void* event_handle = nullptr;
  int device = 0;                      // kMemAlloc, kMemset's context
  std::size_t bytes = 0;               // kMemAlloc
  CUdeviceptr dptr = 0;                // kMemAlloc, kMemFree
  unsigned long long cond = 0;         // kConditional: its handle
  int cond_type = 0;
  std::vector<std::unique_ptr<Graph>> bodies;
  std::function<void()> work;          // kBatchMemOp (captured)
  const Node* origin = nullptr;        // in an executable: the graph's node
  // In an executable, a copy's or memset's device ranges and the VMM
  // mappings that backed them when its parameters were set (Remember).
  std::vector<std::pair<Touch, std::vector<Backing>>> backing;
};

struct Graph {
  std::vector<std::unique_ptr<Node>> nodes;
  Graph* parent = nullptr;  // a child or conditional body's owner
};

struct Exec {
  std::unique_ptr<Graph> graph;
  std::unordered_map<const Node*, Node*> by_origin;
  cuuint64_t flags = 0;
  std::vector<CUdeviceptr> allocations;  // its alloc nodes' addresses
};

struct Conditional {
  unsigned int default_value = 0;
  unsigned int flags = 0;
  unsigned int value = 0;
};

// A graph allocation: its address is the alloc node's for the node's life,
// its memory counts against the device while it is live.
struct Allocation {
  int device = 0;
  std::size_t bytes = 0;
  bool live = false;
  int owners = 1;  // the graph node and the executable graphs made from it
};

struct Capture {
  Graph* graph = nullptr;
  bool owns_graph = false;
  int mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  unsigned long long id = 0;
  bool invalid = false;
  fg::Stream* origin = nullptr;
};

struct StreamCapture {
  std::shared_ptr<Capture> capture;
  std::vector<Node*> deps;
  std::vector<Node*> reported;  // what cuStreamGetCaptureInfo returned
};

struct EventCapture {
  std::shared_ptr<Capture> capture;
  std::vector<Node*> deps;
};

struct Graphs {
  std::recursive_mutex mu;
  std::set<Graph*> graphs;  // top-level graphs the program owns
  std::set<Exec*> execs;
  std::map<unsigned long long, Conditional> conditionals;
  unsigned long long next_conditional = 1;
  std::map<CUdeviceptr, Allocation> allocations;
  std::vector<std::uint64_t> used, high;  // graph memory, per device
  std::map<fg::Stream*, StreamCapture> streams;
  std::map<const fg::Event*, EventCapture> events;
  unsigned long long next_capture = 1;
};

Graphs& G() {
  static Graphs* const g = [] {
    auto* p = new Graphs();
    p->used.assign(Count(), 0);
    p->high.assign(Count(), 0);
    return p;
  }();
  return *g;
}

using Lock = std::lock_guard<std::recursive_mutex>;

thread_local int t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

Graph* GraphOf(void* handle) {
  // Top-level graphs, and the bodies and children that nodes own (whose
  // handles XLA keeps for nested command buffers): checked by search.
  return static_cast<Graph*>(handle);
}

bool KnownGraph(Graph* g) {
  Graphs& s = G();
  if (g == nullptr) return false;
  if (s.graphs.count(g) != 0) return true;
  return g->parent != nullptr;
}

Node* AddNode(Graph* g, void* const* deps, std::size_t n, CUresult* r) {
  for (std::size_t i = 0; i < n; ++i) {
    auto* d = static_cast<Node*>(deps[i]);
    if (d == nullptr || d->owner != g) {
      *r = CUDA_ERROR_INVALID_VALUE;
      return nullptr;
    }
  }
  auto node = std::make_unique<Node>();
  node->owner = g;
  for (std::size_t i = 0; i < n; ++i)
    node->deps.push_back(static_cast<Node*>(deps[i]));
  g->nodes.push_back(std::move(node));
  *r = CUDA_SUCCESS;
  return g->nodes.back().get();
}

void ReleaseAllocation(CUdeviceptr p);

// Drops a graph's reference to the allocations its alloc nodes made.
void DropAllocations(Graph& g) {
  for (auto& n : g.nodes) {
    if (n->type == kMemAlloc) ReleaseAllocation(n->dptr);
    if (n->child) DropAllocations(*n->child);
    for (auto& b : n->bodies) DropAllocations(*b);
  }
}

void ReleaseAllocation(CUdeviceptr p) {
  Graphs& s = G();
  auto it = s.allocations.find(p);
  if (it == s.allocations.end() || --it->second.owners > 0) return;
  if (it->second.live) {
    s.used[it->second.device] -= it->second.bytes;
    fg::Uncharge(it->second.device, it->second.bytes);
  }
  fg::RemoveRange(p);
  fg::UnmapAnonymous(reinterpret_cast<void*>(p), it->second.bytes);
  s.allocations.erase(it);
}

std::unique_ptr<Graph> Clone(const Graph& src,
                             std::unordered_map<const Node*, Node*>* map,
                             bool executable) {
  auto out = std::make_unique<Graph>();
  std::unordered_map<const Node*, Node*> local;
  for (const auto& n : src.nodes) {
    auto c = std::make_unique<Node>();
    c->type = n->type;
    c->owner = out.get();
    c->enabled = n->enabled;
    c->kernel = n->kernel;
    c->copy = n->copy;
    c->memset = n->memset;
    c->host = n->host;
    c->event = n->event;
    c->event_handle = n->event_handle;
    c->device = n->device;
    c->bytes = n->bytes;
    c->dptr = n->dptr;
    c->cond = n->cond;
    c->cond_type = n->cond_type;
    c->work = n->work;
    c->origin = executable ? (n->origin != nullptr ? n->origin : n.get())
                           : nullptr;
    for (Node* d : n->deps) c->deps.push_back(local.at(d));
    if (n->child) {
      c->child = Clone(*n->child, map, executable);
      c->child->parent = out.get();
    }
    for (const auto& b : n->bodies) {
      c->bodies.push_back(Clone(*b, map, executable));
      c->bodies.back()->parent = out.get();
    }
    if (n->type == kMemAlloc) {
      auto it = G().allocations.find(n->dptr);
      if (it != G().allocations.end()) ++it->second.owners;
    }
    local[n.get()] = c.get();
    if (map != nullptr) (*map)[n.get()] = c.get();
    out->nodes.push_back(std::move(c));
  }
  return out;
}

// The nodes of `g` in an order that respects every dependency (insertion
// order among independent nodes); false when the dependencies have a cycle.
bool Order(const Graph& g, std::vector<Node*>* out) {
  std::unordered_map<const Node*, std::size_t> index;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) index[g.nodes[i].get()] = i;
  std::vector<int> state(g.nodes.size(), 0);  // 0 new, 1 visiting, 2 done
  bool ok = true;
  std::function<void(std::size_t)> visit = [&](std::size_t i) {
    if (state[i] == 2 || !ok) return;
    if (state[i] == 1) {
      ok = false;
      return;
    }
    state[i] = 1;
    for (Node* d : g.nodes[i]->deps) visit(index.at(d));
    state[i] = 2;
    out->push_back(g.nodes[i].get());
  };
  for (std::size_t i = 0; i < g.nodes.size(); ++i) visit(i);
  return ok;
}

void CopyRegion(const Memcpy3D& p) {
  auto* dst = reinterpret_cast<unsigned char*>(
      p.dstMemoryType == 1 ? reinterpret_cast<std::uintptr_t>(p.dstHost)
                           : static_cast<std::uintptr_t>(p.dstDevice));
  auto* src = reinterpret_cast<const unsigned char*>(
      p.srcMemoryType == 1 ? reinterpret_cast<std::uintptr_t>(p.srcHost)
                           : static_cast<std::uintptr_t>(p.srcDevice));
  const std::size_t h = std::max<std::size_t>(p.Height, 1);
  const std::size_t d = std::max<std::size_t>(p.Depth, 1);
  if (h == 1 && d == 1) {
    fg::Move(dst + p.dstXInBytes, src + p.srcXInBytes, p.WidthInBytes);
    return;
  }
  const std::size_t sh = p.srcHeight != 0 ? p.srcHeight : h;
  const std::size_t dh = p.dstHeight != 0 ? p.dstHeight : h;
  for (std::size_t z = 0; z < d; ++z)
    for (std::size_t y = 0; y < h; ++y)
      fg::Move(dst + p.dstXInBytes + ((p.dstZ + z) * dh + p.dstY + y) *
                                         p.dstPitch,
               src + p.srcXInBytes + ((p.srcZ + z) * sh + p.srcY + y) *
                                         p.srcPitch,
               p.WidthInBytes);
}

void SetRegion(const MemsetParams& p) {
  const std::size_t rows = std::max<std::size_t>(p.height, 1);
  for (std::size_t y = 0; y < rows; ++y) {
    void* row = reinterpret_cast<void*>(p.dst + y * p.pitch);
    switch (p.elementSize) {
      case 1:
        fg::Fill<unsigned char>(row, static_cast<unsigned char>(p.value),
                                p.width);
        break;
      case 2:
        fg::Fill<unsigned short>(row, static_cast<unsigned short>(p.value),
                                 p.width);
        break;
      default:
        fg::Fill<unsigned int>(row, p.value, p.width);
        break;
    }
  }
}

// The device ranges a copy or memset node writes or reads (kernels'
// arguments are not known to the fake: none). Host memory is left out.
std::vector<Touch> TouchesOf(const Node& n) {
  std::vector<Touch> out;
  if (n.type == kMemcpy) {
    const Memcpy3D& p = n.copy;
    const std::size_t h = std::max<std::size_t>(p.Height, 1);
    const std::size_t d = std::max<std::size_t>(p.Depth, 1);
    auto span = [&](CUdeviceptr base, std::size_t x, std::size_t y,
                    std::size_t z, std::size_t pitch, std::size_t height) {
      const std::size_t rows = height != 0 ? height : h;
      const std::size_t first = x + (z * rows + y) * pitch;
      const std::size_t last =
          h == 1 && d == 1
              ? x + p.WidthInBytes
              : x + ((z + d - 1) * rows + y + h - 1) * pitch + p.WidthInBytes;
      out.emplace_back(base + first, last - first);
    };
    if (p.srcMemoryType != 1)
      span(p.srcDevice, p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch,
           p.srcHeight);
    if (p.dstMemoryType != 1)
      span(p.dstDevice, p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch,
           p.dstHeight);
  } else if (n.type == kMemset) {
    const MemsetParams& p = n.memset;
    const std::size_t rows = std::max<std::size_t>(p.height, 1);
    out.emplace_back(p.dst,
                     (rows - 1) * p.pitch + p.width * p.elementSize);
  }
  return out;
}

// Records what backs each copy and memset node of an executable graph
// now: called when the executable is made and when its parameters change.
void Remember(Node& n) {
  n.backing.clear();
  for (const Touch& t : TouchesOf(n))
    n.backing.emplace_back(t, BackingOf(t.first, t.second));
}
void Remember(Graph& g) {
  for (auto& n : g.nodes) {
    Remember(*n);
    if (n->child) Remember(*n->child);
    for (auto& b : n->bodies) Remember(*b);
  }
}

// A launch of an executable graph whose copy or memset touches memory that
// was unmapped, or mapped to other memory, since its parameters were set:
// the device faults on it. Returns false (and names it) then.
bool StillBacked(const Graph& g) {
  for (const auto& n : g.nodes) {
    for (const auto& [t, was] : n->backing) {
      if (BackingOf(t.first, t.second) == was) continue;
      std::fprintf(stderr,
                   "jaxlake fake GPU: a graph launch touches [%#llx, +%zu), "
                   "unmapped or mapped to other memory since the "
                   "executable graph's parameters were set: "
                   "CUDA_ERROR_ILLEGAL_ADDRESS\n",
                   static_cast<unsigned long long>(t.first), t.second);
      return false;
    }
    if (n->child && !StillBacked(*n->child)) return false;
    for (const auto& b : n->bodies)
      if (!StillBacked(*b)) return false;
  }
  return true;
}

void Launched(std::uint64_t n) {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  d.launches += n;
}

// Makes the allocations of `g`'s alloc nodes live (charged to their
// devices): false (nothing charged) when one does not fit, or when one is
// still live from an earlier launch, unless `auto_free` (the instantiation
// flag AUTO_FREE_ON_LAUNCH: freed and allocated again at the same address,
// so it stays as it is).
bool Allocate(const std::vector<CUdeviceptr>& addresses, bool auto_free,
              CUresult* r) {
  Graphs& s = G();
  std::vector<CUdeviceptr> done;
  for (CUdeviceptr p : addresses) {
    auto it = s.allocations.find(p);
    if (it == s.allocations.end()) continue;
    if (it->second.live && auto_free) continue;
    if (it->second.live) {  // a previous launch's, not freed
      *r = CUDA_ERROR_INVALID_VALUE;
    } else if (!fg::Charge(it->second.device, it->second.bytes)) {
      *r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      it->second.live = true;
      s.used[it->second.device] += it->second.bytes;
      s.high[it->second.device] =
          std::max(s.high[it->second.device], s.used[it->second.device]);
      done.push_back(p);
      continue;
    }
    for (CUdeviceptr q : done) {
      auto& a = s.allocations[q];
      a.live = false;
      s.used[a.device] -= a.bytes;
      fg::Uncharge(a.device, a.bytes);
    }
    return false;
  }
  return true;
}

// Frees a live graph allocation once the stream reaches this point.
void EnqueueFree(fg::Stream* s, CUdeviceptr p) {
  s->Enqueue([p] {
    Graphs& g = G();
    Lock lock(g.mu);
    auto it = g.allocations.find(p);
    if (it == g.allocations.end() || !it->second.live) return;
    it->second.live = false;
    g.used[it->second.device] -= it->second.bytes;
    fg::Uncharge(it->second.device, it->second.bytes);
    fg::Zero(reinterpret_cast<void*>(p), it->second.bytes);  // drops pages
  });
}

void EnqueueGraph(const Graph& g, fg::Stream* s) {
  std::vector<Node*> order;
  Order(g, &order);
  std::uint64_t kernels = 0;
  for (Node* n : order) {
    if (!n->enabled) continue;
    switch (n->type) {
      case kKernel:
        ++kernels;
        break;
      case kMemcpy: {
        const Memcpy3D p = n->copy;
        EnqueueTouching(s, TouchesOf(*n), [p] { CopyRegion(p); });
        break;
      }
      case kMemset: {
        const MemsetParams p = n->memset;
        EnqueueTouching(s, TouchesOf(*n), [p] { SetRegion(p); });
        break;
      }
      case kHost: {
        const HostParams p = n->host;
        s->Enqueue([p] { p.fn(p.userData); });
        break;
      }
      case kGraph:
        EnqueueGraph(*n->child, s);
        break;
      case kWaitEvent:
        if (n->event) fg::WaitEvent(s, n->event);
        break;
      case kEventRecord:
        if (n->event) fg::RecordEvent(n->event, s);
        break;
      case kMemFree:
        EnqueueFree(s, n->dptr);
        break;
      case kBatchMemOp:
        if (n->work) s->Enqueue(n->work);
        break;
      case kConditional: {
        Conditional& c = G().conditionals[n->cond];
        if ((c.flags & 1) != 0) c.value = c.default_value;
        const unsigned v = c.value;
        if (n->cond_type == 2) {  // SWITCH
          if (v < n->bodies.size()) EnqueueGraph(*n->bodies[v], s);
        } else if (v != 0) {  // IF, WHILE: once (kernels set the value)
          EnqueueGraph(*n->bodies[0], s);
        } else if (n->cond_type == 0 && n->bodies.size() == 2) {
          EnqueueGraph(*n->bodies[1], s);
        }
        break;
      }
      default:  // empty, alloc (made live at the launch)
        break;
    }
  }
  if (kernels != 0) Launched(kernels);
}

void CollectAllocations(const Graph& g, std::vector<CUdeviceptr>* out) {
  for (const auto& n : g.nodes) {
    if (n->type == kMemAlloc) out->push_back(n->dptr);
    if (n->child) CollectAllocations(*n->child, out);
  }
}

// ---- capture ----------------------------------------------------------------

StreamCapture* CaptureOf(fg::Stream* s) {
  Graphs& g = G();
  auto it = g.streams.find(s);
  return it == g.streams.end() ? nullptr : &it->second;
}

// Adds a node for work enqueued on a capturing stream: its dependencies are
// the stream's, and it becomes the stream's only one.
Node* CaptureNode(StreamCapture* sc, int type, std::size_t bytes = 0) {
  fg::CountGraphNode(type, bytes);
  auto node = std::make_unique<Node>();
  node->type = type;
  node->owner = sc->capture->graph;
  node->deps = sc->deps;
  Node* n = node.get();
  sc->capture->graph->nodes.push_back(std::move(node));
  sc->deps.assign(1, n);
  return n;
}

// Whether the calling thread may not make a potentially unsafe call now:
// the driver's rule for the thread's capture mode.
bool Prohibited() {
  if (t_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  const auto me = std::this_thread::get_id();
  for (auto& [s, sc] : G().streams) {
    const Capture& c = *sc.capture;
    if (c.invalid) continue;
    if (c.thread == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED)
      return true;
    if (t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
        c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
      return true;
  }
  return false;
}

void EndCaptureOf(const std::shared_ptr<Capture>& c) {
  Graphs& g = G();
  for (auto it = g.streams.begin(); it != g.streams.end();) {
    if (it->second.capture == c) {
      it = g.streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = g.events.begin(); it != g.events.end();) {
    if (it->second.capture == c) {
      it = g.events.erase(it);
    } else {
      ++it;
    }
  }
}

CUresult BeginCapture(CUstream stream, Graph* into, void* const* deps,
                      std::size_t n, int mode) {
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
  if (stream == nullptr || reinterpret_cast<std::uintptr_t>(stream) <= 2)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the default streams
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Graphs& g = G();
  Lock lock(g.mu);
  if (g.streams.count(s) != 0) return CUDA_ERROR_ILLEGAL_STATE;
  auto c = std::make_shared<Capture>();
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->id = g.next_capture++;
  c->origin = s;
  if (into != nullptr) {
    if (!KnownGraph(into)) return CUDA_ERROR_INVALID_VALUE;
    c->graph = into;
  } else {
    c->graph = new Graph();
    c->owns_graph = true;
    g.graphs.insert(c->graph);
  }
  StreamCapture sc;
  sc.capture = c;
  for (std::size_t i = 0; i < n; ++i)
    sc.deps.push_back(static_cast<Node*>(deps[i]));
  g.streams[s] = std::move(sc);
  return CUDA_SUCCESS;
}

CUresult EndCapture(CUstream stream, void** graph) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Graphs& g = G();
  Lock lock(g.mu);
  StreamCapture* sc = CaptureOf(s);
  if (sc == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  std::shared_ptr<Capture> c = sc->capture;
  if (c->origin != s) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      c->thread != std::this_thread::get_id())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  EndCaptureOf(c);
  if (c->invalid) {
    if (c->owns_graph) {
      g.graphs.erase(c->graph);
      DropAllocations(*c->graph);
      delete c->graph;
    }
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *graph = c->graph;
  return CUDA_SUCCESS;
}

// cuStreamGetCaptureInfo and its versions.
CUresult CaptureInfo(CUstream stream, int* status, cuuint64_t* id,
                     void** graph, void* const** deps, std::size_t* n) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Graphs& g = G();
  Lock lock(g.mu);
  StreamCapture* sc = CaptureOf(s);
  if (sc == nullptr) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (n != nullptr) *n = 0;
    if (deps != nullptr) *deps = nullptr;
    if (graph != nullptr) *graph = nullptr;
    return CUDA_SUCCESS;
  }
  *status = sc->capture->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                 : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id != nullptr) *id = sc->capture->id;
  if (graph != nullptr) *graph = sc->capture->graph;
  sc->reported = sc->deps;
  if (deps != nullptr)
    *deps = reinterpret_cast<void* const*>(sc->reported.data());
  if (n != nullptr) *n = sc->reported.size();
  return CUDA_SUCCESS;
}

// ---- graph memory -----------------------------------------------------------

// An alloc node's address: reserved now, charged when a launch allocates.
CUresult NewGraphAllocation(int device, std::size_t bytes, CUdeviceptr* out) {
  if (!ValidDevice(device) || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t size = (bytes + 511) / 512 * 512;
  void* p = fg::MapAnonymous(size);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto v = reinterpret_cast<CUdeviceptr>(p);
  fg::AddRange({v, size, device, fg::Kind::kDevice, true});
  Allocation a;
  a.device = device;
  a.bytes = size;
  G().allocations[v] = a;
  *out = v;
  return CUDA_SUCCESS;
}

// ---- node parameters --------------------------------------------------------

CUresult SetCopy(Node* n, const Memcpy3D* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto host_or_device = [](int t) { return t >= 1 && t <= 4 && t != 3; };
  if (!host_or_device(p->srcMemoryType) || !host_or_device(p->dstMemoryType))
    return CUDA_ERROR_NOT_SUPPORTED;  // CUDA arrays
  n->copy = *p;
  return CUDA_SUCCESS;
}

CUresult SetMemset(Node* n, const MemsetParams* p) {
  if (p == nullptr || (p->elementSize != 1 && p->elementSize != 2 &&
                       p->elementSize != 4))
    return CUDA_ERROR_INVALID_VALUE;
  n->memset = *p;
  return CUDA_SUCCESS;
}

CUresult SetKernel(Node* n, const KernelParams* p) {
  if (p == nullptr || p->func == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->kernel = *p;
  return CUDA_SUCCESS;
}

CUresult SetHost(Node* n, const HostParams* p) {
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->host = *p;
  return CUDA_SUCCESS;
}

CUresult SetEvent(Node* n, void* event) {
  auto e = fg::EventOf(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  n->event = std::move(e);
  n->event_handle = event;
  return CUDA_SUCCESS;
}

bool HasMemoryNodes(const Graph& g) {
  for (const auto& n : g.nodes) {
    if (n->type == kMemAlloc || n->type == kMemFree) return true;
    if (n->child && HasMemoryNodes(*n->child)) return true;
  }
  return false;
}

// Removes `n` from its graph, with the edges that name it.
void DestroyNode(Node* n) {
  Graph* g = n->owner;
  for (auto& m : g->nodes) {
    auto& d = m->deps;
    d.erase(std::remove(d.begin(), d.end(), n), d.end());
  }
  if (n->type == kMemAlloc) ReleaseAllocation(n->dptr);
  if (n->child) DropAllocations(*n->child);
  g->nodes.erase(std::find_if(g->nodes.begin(), g->nodes.end(),
                              [n](const auto& p) { return p.get() == n; }));
}

// One node of any type from CUgraphNodeParams (cuGraphAddNode).
CUresult AddFromParams(Graph* g, void* const* deps, std::size_t count,
                       NodeParams* p, Node** out) {
  CUresult r = CUDA_SUCCESS;
  Node* n = AddNode(g, deps, count, &r);
  if (n == nullptr) return r;
  n->type = p->type;
  switch (p->type) {
    case kKernel:
      r = SetKernel(n, &p->kernel);
      break;
    case kMemcpy:
      r = SetCopy(n, &p->memcpy.copyParams);
      break;
    case kMemset:
      r = SetMemset(n, &p->memset);
      break;
    case kHost:
      r = SetHost(n, &p->host);
      break;
    case kGraph: {
      Graph* child = GraphOf(p->graph.graph);
      if (!KnownGraph(child)) {
        r = CUDA_ERROR_INVALID_VALUE;
      } else if (p->graph.ownership == 1) {  // MOVE
        Graphs& s = G();
        if (s.graphs.erase(child) == 0 && child->parent != nullptr) {
          r = CUDA_ERROR_INVALID_VALUE;
        } else {
          n->child.reset(child);
          child->parent = g;
        }
      } else if (HasMemoryNodes(*child)) {
        r = CUDA_ERROR_NOT_SUPPORTED;  // such a graph may only be moved
      } else {
        n->child = Clone(*child, nullptr, false);
        n->child->parent = g;
      }
      break;
    }
    case kEmpty:
      break;
    case kWaitEvent:
    case kEventRecord:
      r = SetEvent(n, p->event.event);
      break;
    case kMemAlloc: {
      const int dev = p->alloc.poolProps.location.id;
      r = NewGraphAllocation(dev, p->alloc.bytesize, &p->alloc.dptr);
      if (r == CUDA_SUCCESS) {
        n->device = dev;
        n->bytes = p->alloc.bytesize;
        n->dptr = p->alloc.dptr;
      }
      break;
    }
    case kMemFree:
      if (G().allocations.count(p->free.dptr) == 0) {
        r = CUDA_ERROR_INVALID_VALUE;
      } else {
        n->dptr = p->free.dptr;
      }
      break;
    case kConditional: {
      const ConditionalParams& c = p->conditional;
      const bool ok_size = c.type == 2 ? c.size >= 1
                                       : c.size == 1 ||
                                             (c.type == 0 && c.size == 2);
      if (G().conditionals.count(c.handle) == 0 || c.type < 0 ||
          c.type > 2 || !ok_size || c.phGraph_out == nullptr) {
        r = CUDA_ERROR_INVALID_VALUE;
        break;
      }
      n->cond = c.handle;
      n->cond_type = c.type;
      for (unsigned i = 0; i < c.size; ++i) {
        n->bodies.push_back(std::make_unique<Graph>());
        n->bodies.back()->parent = g;
        c.phGraph_out[i] = n->bodies.back().get();
      }
      break;
    }
    default:
      r = CUDA_ERROR_NOT_SUPPORTED;
  }
  if (r != CUDA_SUCCESS) {
    n->type = kEmpty;
    DestroyNode(n);
    return r;
  }
  fg::CountGraphNode(n->type, n->type == kMemAlloc ? n->bytes : 0);
  *out = n;
  return CUDA_SUCCESS;
}

// Whether `exec` can take `g`'s parameters: the same nodes, types and
// edges, in the same order (the driver's rule is about topology; the
// fake's graphs are built in one order by one program).
bool SameTopology(const Graph& a, const Graph& b, UpdateResultInfo* info) {
  if (a.nodes.size() != b.nodes.size()) {
    if (info != nullptr) info->result = 2;  // TOPOLOGY_CHANGED
    return false;
  }
  std::unordered_map<const Node*, std::size_t> ia, ib;
  for (std::size_t i = 0; i < a.nodes.size(); ++i) {
    ia[a.nodes[i].get()] = i;
    ib[b.nodes[i].get()] = i;
  }
  for (std::size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& x = *a.nodes[i];
    const Node& y = *b.nodes[i];
    if (x.type != y.type) {
      if (info != nullptr) {
        info->result = 3;  // NODE_TYPE_CHANGED
        info->errorNode = const_cast<Node*>(&y);
      }
      return false;
    }
    bool same = x.deps.size() == y.deps.size();
    for (std::size_t k = 0; same && k < x.deps.size(); ++k)
      same = ia[x.deps[k]] == ib[y.deps[k]];
    if (same && x.child) same = SameTopology(*x.child, *y.child, nullptr);
    if (same) same = x.bodies.size() == y.bodies.size();
    for (std::size_t k = 0; same && k < x.bodies.size(); ++k)
      same = SameTopology(*x.bodies[k], *y.bodies[k], nullptr);
    if (same && x.type == kMemAlloc) same = x.bytes == y.bytes;
    if (!same) {
      if (info != nullptr) {
        info->result = 2;
        info->errorNode = const_cast<Node*>(&y);
      }
      return false;
    }
  }
  return true;
}

// Copies the parameters of `from`'s nodes into `to`'s (same topology).
void TakeParams(Graph& to, const Graph& from) {
  for (std::size_t i = 0; i < to.nodes.size(); ++i) {
    Node& x = *to.nodes[i];
    const Node& y = *from.nodes[i];
    x.kernel = y.kernel;
    x.copy = y.copy;
    x.memset = y.memset;
    x.host = y.host;
    x.event = y.event;
    x.event_handle = y.event_handle;
    x.cond = y.cond;
    x.enabled = y.enabled;
    if (x.child) TakeParams(*x.child, *y.child);
    for (std::size_t k = 0; k < x.bodies.size(); ++k)
      TakeParams(*x.bodies[k], *y.bodies[k]);
  }
}

// Re-keys an executable graph's origin map after an update from `g`.
void MapOrigins(Exec* e, Graph& to, const Graph& from) {
  for (std::size_t i = 0; i < to.nodes.size(); ++i) {
    e->by_origin[from.nodes[i].get()] = to.nodes[i].get();
    if (to.nodes[i]->child)
      MapOrigins(e, *to.nodes[i]->child, *from.nodes[i]->child);
    for (std::size_t k = 0; k < to.nodes[i]->bodies.size(); ++k)
      MapOrigins(e, *to.nodes[i]->bodies[k], *from.nodes[i]->bodies[k]);
  }
}

Exec* ExecOf(void* handle) {
  Graphs& g = G();
  auto* e = static_cast<Exec*>(handle);
  return g.execs.count(e) != 0 ? e : nullptr;
}

Node* ExecNode(Exec* e, void* node) {
  auto it = e->by_origin.find(static_cast<Node*>(node));
  return it == e->by_origin.end() ? nullptr : it->second;
}

CUresult Instantiate(void** exec, void* graph, cuuint64_t flags) {
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& s = G();
  Lock lock(s.mu);
  Graph* g = GraphOf(graph);
  if (!KnownGraph(g)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<Node*> order;
  if (!Order(*g, &order)) return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_unique<Exec>();
  e->flags = flags;
  e->graph = Clone(*g, &e->by_origin, true);
  CollectAllocations(*e->graph, &e->allocations);
  Remember(*e->graph);
  *exec = e.get();
  s.execs.insert(e.release());
  return CUDA_SUCCESS;
}

CUresult Launch(void* exec, CUstream stream) {
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Graphs& g = G();
  Lock lock(g.mu);
  Exec* e = ExecOf(exec);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (StreamCapture* sc = CaptureOf(s)) {  // a child graph node
    Node* n = CaptureNode(sc, kGraph);
    n->child = Clone(*e->graph, nullptr, false);
    n->child->parent = sc->capture->graph;
    return CUDA_SUCCESS;
  }
  CUresult r = CUDA_SUCCESS;
  if (!StillBacked(*e->graph)) {  // it faults: nothing of it runs
    Fault(s->device());
    return CUDA_SUCCESS;
  }
  if (!Allocate(e->allocations, (e->flags & 1) != 0, &r)) return r;
  EnqueueGraph(*e->graph, s);
  return CUDA_SUCCESS;
}

// Work enqueued on `stream`: when the stream is being captured, *r =
// add(g, capture) under the graphs' lock (the work becomes nodes) and true;
// else false, and the caller runs the work.
template <typename F>
bool Captured(CUstream stream, CUresult* r, F add) {
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return false;
  Graphs& g = G();
  Lock lock(g.mu);
  StreamCapture* sc = CaptureOf(s);
  if (sc == nullptr) return false;
  *r = add(g, sc);
  return true;
}

}  // namespace

// ---- what the other driver files ask of capture ----------------------------

namespace jaxlake::fakegpu::driver {

bool CaptureCopy(CUstream stream, void* dst, const void* src, std::size_t n,
                 CUresult* r) {
  return Captured(stream, r, [&](Graphs&, StreamCapture* sc) {
    Node* node = CaptureNode(sc, kMemcpy);
    node->copy.srcMemoryType = 4;  // UNIFIED: one address space
    node->copy.srcDevice = reinterpret_cast<CUdeviceptr>(src);
    node->copy.dstMemoryType = 4;
    node->copy.dstDevice = reinterpret_cast<CUdeviceptr>(dst);
    node->copy.WidthInBytes = n;
    node->copy.Height = node->copy.Depth = 1;
    return CUDA_SUCCESS;
  });
}

bool CaptureMemset(CUstream stream, CUdeviceptr dst, unsigned value,
                   unsigned element, std::size_t count, CUresult* r) {
  return Captured(stream, r, [&](Graphs&, StreamCapture* sc) {
    CaptureNode(sc, kMemset)->memset =
        MemsetParams{dst, 0, value, element, count, 1};
    return CUDA_SUCCESS;
  });
}

bool CaptureHost(CUstream stream, void (*fn)(void*), void* data,
                 CUresult* r) {
  return Captured(stream, r, [&](Graphs&, StreamCapture* sc) {
    CaptureNode(sc, kHost)->host = HostParams{fn, data};
    return CUDA_SUCCESS;
  });
}

bool CaptureKernel(CUstream stream, void* f, CUresult* r) {
  return Captured(stream, r, [&](Graphs&, StreamCapture* sc) {
    CaptureNode(sc, kKernel)->kernel.func = f;
    return CUDA_SUCCESS;
  });
}

// An event recorded on a capturing stream marks the stream's place in the
// capture (for another stream to wait on and join), as the driver does.
bool CaptureEventRecord(CUstream stream, CUevent event, CUresult* r) {
  fg::Stream* s = StreamFor(stream);
  auto e = fg::EventOf(event);
  if (s == nullptr || e == nullptr) return false;
  Graphs& g = G();
  Lock lock(g.mu);
  StreamCapture* sc = CaptureOf(s);
  if (sc == nullptr) {
    g.events.erase(e.get());  // recorded outside any capture now
    return false;
  }
  g.events[e.get()] = EventCapture{sc->capture, sc->deps};
  *r = CUDA_SUCCESS;
  return true;
}

// A wait on an event recorded in a capture: a capturing stream takes the
// event's place as more dependencies; another stream joins the capture.
// A capturing stream waiting on an event from outside the capture gets an
// event wait node.
bool CaptureEventWait(CUstream stream, CUevent event, CUresult* r) {
  fg::Stream* s = StreamFor(stream);
  auto e = fg::EventOf(event);
  if (s == nullptr || e == nullptr) return false;
  Graphs& g = G();
  Lock lock(g.mu);
  StreamCapture* sc = CaptureOf(s);
  auto ev = g.events.find(e.get());
  if (ev == g.events.end()) {
    if (sc == nullptr) return false;
    Node* node = CaptureNode(sc, kWaitEvent);
    node->event = e;
    node->event_handle = event;
    *r = CUDA_SUCCESS;
    return true;
  }
  if (sc == nullptr) {
    StreamCapture joined;
    joined.capture = ev->second.capture;
    joined.deps = ev->second.deps;
    g.streams[s] = std::move(joined);
  } else if (sc->capture != ev->second.capture) {
    *r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    return true;
  } else {
    for (Node* d : ev->second.deps)
      if (std::find(sc->deps.begin(), sc->deps.end(), d) == sc->deps.end())
        sc->deps.push_back(d);
  }
  *r = CUDA_SUCCESS;
  return true;
}

bool CaptureMemOp(CUstream stream, std::function<void()> work,
                  CUresult* r) {
  return Captured(stream, r, [&](Graphs&, StreamCapture* sc) {
    CaptureNode(sc, kBatchMemOp)->work = std::move(work);
    return CUDA_SUCCESS;
  });
}

bool CaptureAlloc(CUstream stream, int device, std::size_t bytes,
                  CUdeviceptr* out, CUresult* r) {
  return Captured(stream, r, [&](Graphs&, StreamCapture* sc) {
    CUdeviceptr p = 0;
    const CUresult made = NewGraphAllocation(device, bytes, &p);
    if (made != CUDA_SUCCESS) return made;
    Node* node = CaptureNode(sc, kMemAlloc, bytes);
    node->device = device;
    node->bytes = bytes;
    node->dptr = p;
    *out = p;
    return CUDA_SUCCESS;
  });
}

bool CaptureFree(CUstream stream, CUdeviceptr p, CUresult* r) {
  return Captured(stream, r, [&](Graphs& g, StreamCapture* sc) {
    if (g.allocations.count(p) == 0)
      return CUDA_ERROR_INVALID_VALUE;  // only graph allocations
    CaptureNode(sc, kMemFree)->dptr = p;
    return CUDA_SUCCESS;
  });
}

bool FreeGraphAllocation(CUdeviceptr p, CUstream stream) {
  Graphs& g = G();
  Lock lock(g.mu);
  auto it = g.allocations.find(p);
  if (it == g.allocations.end()) return false;
  fg::Stream* s = StreamFor(stream);
  if (s != nullptr && it->second.live) EnqueueFree(s, p);
  return true;
}

CUresult CheckUnsafe() {
  Graphs& g = G();
  Lock lock(g.mu);
  if (!Prohibited()) return CUDA_SUCCESS;
  // The calling thread's own captures are invalidated.
  const auto me = std::this_thread::get_id();
  for (auto& [s, sc] : g.streams)
    if (sc.capture->thread == me) sc.capture->invalid = true;
  fg::CountCaptureRefusal();
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult CheckEventSync(CUevent event) {
  auto e = fg::EventOf(event);
  if (e == nullptr) return CUDA_SUCCESS;
  Graphs& g = G();
  Lock lock(g.mu);
  auto it = g.events.find(e.get());
  if (it == g.events.end()) return CUDA_SUCCESS;
  it->second.capture->invalid = true;
  fg::CountCaptureRefusal();
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

CUresult CheckSync(CUstream stream) {
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_SUCCESS;
  Graphs& g = G();
  Lock lock(g.mu);
  StreamCapture* sc = CaptureOf(s);
  if (sc == nullptr) return CUDA_SUCCESS;
  sc->capture->invalid = true;
  fg::CountCaptureRefusal();
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

}  // namespace jaxlake::fakegpu::driver

extern "C" {

// ---- stream capture ---------------------------------------------------------

FAKE cuStreamBeginCapture_v2(CUstream stream, int mode) {
  ENTER();
  return BeginCapture(stream, nullptr, nullptr, 0, mode);
}
FAKE cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode) {
  ENTER();
  return BeginCapture(stream, nullptr, nullptr, 0, mode);
}
// The first version has no mode: global.
FAKE cuStreamBeginCapture(CUstream stream) {
  ENTER();
  return BeginCapture(stream, nullptr, nullptr, 0,
                      CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FAKE cuStreamBeginCapture_ptsz(CUstream stream) {
  ENTER();
  return BeginCapture(stream, nullptr, nullptr, 0,
                      CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FAKE cuStreamBeginCaptureToGraph(CUstream stream, void* graph,
                                 void* const* deps, const void* /*edges*/,
                                 std::size_t n, int mode) {
  ENTER();
  if (graph == nullptr || (n != 0 && deps == nullptr))
    return CUDA_ERROR_INVALID_VALUE;
  return BeginCapture(stream, GraphOf(graph), deps, n, mode);
}
FAKE cuStreamBeginCaptureToGraph_ptsz(CUstream stream, void* graph,
                                      void* const* deps, const void* edges,
                                      std::size_t n, int mode) {
  return cuStreamBeginCaptureToGraph(stream, graph, deps, edges, n, mode);
}

FAKE cuStreamEndCapture(CUstream stream, void** graph) {
  ENTER();
  return EndCapture(stream, graph);
}
FAKE cuStreamEndCapture_ptsz(CUstream stream, void** graph) {
  ENTER();
  return EndCapture(stream, graph);
}

FAKE cuStreamIsCapturing(CUstream stream, int* status) {
  ENTER();
  return CaptureInfo(stream, status, nullptr, nullptr, nullptr, nullptr);
}
FAKE cuStreamIsCapturing_ptsz(CUstream stream, int* status) {
  ENTER();
  return CaptureInfo(stream, status, nullptr, nullptr, nullptr, nullptr);
}

FAKE cuStreamGetCaptureInfo(CUstream stream, int* status, cuuint64_t* id) {
  ENTER();
  return CaptureInfo(stream, status, id, nullptr, nullptr, nullptr);
}
FAKE cuStreamGetCaptureInfo_ptsz(CUstream stream, int* status,
                                 cuuint64_t* id) {
  ENTER();
  return CaptureInfo(stream, status, id, nullptr, nullptr, nullptr);
}
FAKE cuStreamGetCaptureInfo_v2(CUstream stream, int* status, cuuint64_t* id,
                               void** graph, void* const** deps,
                               std::size_t* n) {
  ENTER();
  return CaptureInfo(stream, status, id, graph, deps, n);
}
FAKE cuStreamGetCaptureInfo_v2_ptsz(CUstream stream, int* status,
                                    cuuint64_t* id, void** graph,
                                    void* const** deps, std::size_t* n) {
  ENTER();
  return CaptureInfo(stream, status, id, graph, deps, n);
}
// _v3 adds edge data, which the fake's edges never carry (all default).
FAKE cuStreamGetCaptureInfo_v3(CUstream stream, int* status, cuuint64_t* id,
                               void** graph, void* const** deps,
                               const void** edges, std::size_t* n) {
  ENTER();
  if (edges != nullptr) *edges = nullptr;
  return CaptureInfo(stream, status, id, graph, deps, n);
}
FAKE cuStreamGetCaptureInfo_v3_ptsz(CUstream stream, int* status,
                                    cuuint64_t* id, void** graph,
                                    void* const** deps, const void** edges,
                                    std::size_t* n) {
  return cuStreamGetCaptureInfo_v3(stream, status, id, graph, deps, edges, n);
}

FAKE cuStreamUpdateCaptureDependencies(CUstream stream, void** nodes,
                                       std::size_t n, unsigned int flags) {
  ENTER();
  if (flags > 1 || (n != 0 && nodes == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Graphs& g = G();
  Lock lock(g.mu);
  StreamCapture* sc = CaptureOf(s);
  if (sc == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  if (flags == 1) sc->deps.clear();  // SET
  for (std::size_t i = 0; i < n; ++i) {
    auto* node = static_cast<Node*>(nodes[i]);
    if (node == nullptr || node->owner != sc->capture->graph)
      return CUDA_ERROR_INVALID_VALUE;
    if (std::find(sc->deps.begin(), sc->deps.end(), node) == sc->deps.end())
      sc->deps.push_back(node);
  }
  return CUDA_SUCCESS;
}
FAKE cuStreamUpdateCaptureDependencies_ptsz(CUstream stream, void** nodes,
                                            std::size_t n,
                                            unsigned int flags) {
  return cuStreamUpdateCaptureDependencies(stream, nodes, n, flags);
}
FAKE cuStreamUpdateCaptureDependencies_v2(CUstream stream, void** nodes,
                                          const void* /*edges*/,
                                          std::size_t n, unsigned int flags) {
  return cuStreamUpdateCaptureDependencies(stream, nodes, n, flags);
}
FAKE cuStreamUpdateCaptureDependencies_v2_ptsz(CUstream stream, void** nodes,
                                               const void* edges,
                                               std::size_t n,
                                               unsigned int flags) {
  return cuStreamUpdateCaptureDependencies_v2(stream, nodes, edges, n, flags);
}

FAKE cuThreadExchangeStreamCaptureMode(int* mode) {
  ENTER();
  if (mode == nullptr || *mode < 0 || *mode > 2)
    return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

// ---- graphs -----------------------------------------------------------------

FAKE cuGraphCreate(void** graph, unsigned int flags) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (graph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  auto* p = new Graph();
  g.graphs.insert(p);
  *graph = p;
  return CUDA_SUCCESS;
}

FAKE cuGraphDestroy(void* graph) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  auto* p = GraphOf(graph);
  if (g.graphs.erase(p) == 0) return CUDA_ERROR_INVALID_VALUE;
  DropAllocations(*p);
  delete p;
  return CUDA_SUCCESS;
}

FAKE cuGraphClone(void** clone, void* graph) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (clone == nullptr || !KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  if (HasMemoryNodes(*p)) return CUDA_ERROR_NOT_SUPPORTED;
  Graph* c = Clone(*p, nullptr, false).release();
  g.graphs.insert(c);
  *clone = c;
  return CUDA_SUCCESS;
}

FAKE cuGraphAddEmptyNode(void** node, void* graph, void* const* deps,
                         std::size_t n) {
  ENTER();
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_SUCCESS;
  Node* out = AddNode(p, deps, n, &r);
  if (out != nullptr) *node = out;
  return r;
}

}  // extern "C"

namespace {
// Adds a node of `type` whose parameters `set` fills; the node goes again
// when `set` refuses them.
template <typename F>
CUresult AddTyped(void** node, void* graph, void* const* deps, std::size_t n,
                  int type, F set) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_SUCCESS;
  Node* out = AddNode(p, deps, n, &r);
  if (out == nullptr) return r;
  out->type = type;
  r = set(out);
  if (r != CUDA_SUCCESS) {
    out->type = kEmpty;
    DestroyNode(out);
    return r;
  }
  fg::CountGraphNode(out->type, out->type == kMemAlloc ? out->bytes : 0);
  *node = out;
  return CUDA_SUCCESS;
}

// The node a handle names when it is a node of `type`, else nullptr (its
// getters and setters then answer CUDA_ERROR_INVALID_VALUE).
Node* Typed(void* node, int type) {
  auto* n = static_cast<Node*>(node);
  return n != nullptr && n->type == type ? n : nullptr;
}

// A node getter: *out = get(node), for a node of `type` and an `out`.
template <typename T, typename F>
CUresult GetTyped(void* node, int type, T* out, F get) {
  const Node* n = Typed(node, type);
  if (n == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = get(*n);
  return CUDA_SUCCESS;
}

// A node setter: set(node) under the graphs' lock, for a node of `type`.
template <typename F>
CUresult SetTyped(void* node, int type, F set) {
  Node* n = Typed(node, type);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  return set(n);
}
}  // namespace

extern "C" {

FAKE cuGraphAddKernelNode_v2(void** node, void* graph, void* const* deps,
                             std::size_t n, const KernelParams* params) {
  ENTER();
  return AddTyped(node, graph, deps, n, kKernel,
                  [&](Node* x) { return SetKernel(x, params); });
}
FAKE cuGraphAddKernelNode(void** node, void* graph, void* const* deps,
                          std::size_t n, const KernelParams* params) {
  return cuGraphAddKernelNode_v2(node, graph, deps, n, params);
}

FAKE cuGraphAddMemcpyNode(void** node, void* graph, void* const* deps,
                          std::size_t n, const Memcpy3D* params,
                          CUcontext /*ctx*/) {
  ENTER();
  return AddTyped(node, graph, deps, n, kMemcpy,
                  [&](Node* x) { return SetCopy(x, params); });
}

FAKE cuGraphAddMemsetNode(void** node, void* graph, void* const* deps,
                          std::size_t n, const MemsetParams* params,
                          CUcontext /*ctx*/) {
  ENTER();
  return AddTyped(node, graph, deps, n, kMemset,
                  [&](Node* x) { return SetMemset(x, params); });
}

FAKE cuGraphAddHostNode(void** node, void* graph, void* const* deps,
                        std::size_t n, const HostParams* params) {
  ENTER();
  return AddTyped(node, graph, deps, n, kHost,
                  [&](Node* x) { return SetHost(x, params); });
}

FAKE cuGraphAddEventRecordNode(void** node, void* graph, void* const* deps,
                               std::size_t n, CUevent event) {
  ENTER();
  return AddTyped(node, graph, deps, n, kEventRecord,
                  [&](Node* x) { return SetEvent(x, event); });
}

FAKE cuGraphAddEventWaitNode(void** node, void* graph, void* const* deps,
                             std::size_t n, CUevent event) {
  ENTER();
  return AddTyped(node, graph, deps, n, kWaitEvent,
                  [&](Node* x) { return SetEvent(x, event); });
}

FAKE cuGraphAddChildGraphNode(void** node, void* graph, void* const* deps,
                              std::size_t n, void* child) {
  ENTER();
  return AddTyped(node, graph, deps, n, kGraph, [&](Node* x) -> CUresult {
    Graph* c = GraphOf(child);
    if (!KnownGraph(c)) return CUDA_ERROR_INVALID_VALUE;
    if (HasMemoryNodes(*c)) return CUDA_ERROR_NOT_SUPPORTED;
    x->child = Clone(*c, nullptr, false);
    x->child->parent = x->owner;
    return CUDA_SUCCESS;
  });
}

FAKE cuGraphAddMemAllocNode(void** node, void* graph, void* const* deps,
                            std::size_t n, MemAllocParams* params) {
  ENTER();
  if (params == nullptr ||
      params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      params->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
    return CUDA_ERROR_INVALID_VALUE;
  return AddTyped(node, graph, deps, n, kMemAlloc, [&](Node* x) -> CUresult {
    const int dev = params->poolProps.location.id;
    CUresult r = NewGraphAllocation(dev, params->bytesize, &params->dptr);
    if (r != CUDA_SUCCESS) return r;
    x->device = dev;
    x->bytes = params->bytesize;
    x->dptr = params->dptr;
    return CUDA_SUCCESS;
  });
}

FAKE cuGraphAddMemFreeNode(void** node, void* graph, void* const* deps,
                           std::size_t n, CUdeviceptr dptr) {
  ENTER();
  return AddTyped(node, graph, deps, n, kMemFree, [&](Node* x) -> CUresult {
    if (G().allocations.count(dptr) == 0) return CUDA_ERROR_INVALID_VALUE;
    x->dptr = dptr;
    return CUDA_SUCCESS;
  });
}

FAKE cuGraphAddNode(void** node, void* graph, void* const* deps,
                    std::size_t n, NodeParams* params) {
  ENTER();
  if (node == nullptr || params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  Node* out = nullptr;
  CUresult r = AddFromParams(p, deps, n, params, &out);
  if (r == CUDA_SUCCESS) *node = out;
  return r;
}
FAKE cuGraphAddNode_v2(void** node, void* graph, void* const* deps,
                       const void* /*edges*/, std::size_t n,
                       NodeParams* params) {
  return cuGraphAddNode(node, graph, deps, n, params);
}

FAKE cuGraphConditionalHandleCreate(unsigned long long* handle, void* graph,
                                    CUcontext /*ctx*/, unsigned int value,
                                    unsigned int flags) {
  ENTER();
  if (handle == nullptr || flags > 1) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  if (!KnownGraph(GraphOf(graph))) return CUDA_ERROR_INVALID_VALUE;
  const unsigned long long h = g.next_conditional++;
  g.conditionals[h] = Conditional{value, flags, value};
  *handle = h;
  return CUDA_SUCCESS;
}

FAKE cuGraphDestroyNode(void* node) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  auto* n = static_cast<Node*>(node);
  if (n == nullptr || n->owner == nullptr) return CUDA_ERROR_INVALID_VALUE;
  DestroyNode(n);
  return CUDA_SUCCESS;
}

// ---- node and graph queries -------------------------------------------------

FAKE cuGraphGetNodes(void* graph, void** nodes, std::size_t* n) {
  ENTER();
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  if (nodes != nullptr)
    for (std::size_t i = 0; i < std::min(*n, p->nodes.size()); ++i)
      nodes[i] = p->nodes[i].get();
  *n = p->nodes.size();
  return CUDA_SUCCESS;
}

FAKE cuGraphGetRootNodes(void* graph, void** nodes, std::size_t* n) {
  ENTER();
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  std::size_t count = 0;
  for (auto& x : p->nodes) {
    if (!x->deps.empty()) continue;
    if (nodes != nullptr && count < *n) nodes[count] = x.get();
    ++count;
  }
  *n = count;
  return CUDA_SUCCESS;
}

FAKE cuGraphGetEdges(void* graph, void** from, void** to, std::size_t* n) {
  ENTER();
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  std::size_t count = 0;
  for (auto& x : p->nodes) {
    for (Node* d : x->deps) {
      if (from != nullptr && to != nullptr && count < *n) {
        from[count] = d;
        to[count] = x.get();
      }
      ++count;
    }
  }
  *n = count;
  return CUDA_SUCCESS;
}
FAKE cuGraphGetEdges_v2(void* graph, void** from, void** to, void* edges,
                        std::size_t* n) {
  if (edges != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return cuGraphGetEdges(graph, from, to, n);
}

FAKE cuGraphNodeGetType(void* node, int* type) {
  ENTER();
  auto* n = static_cast<Node*>(node);
  if (n == nullptr || type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = n->type;
  return CUDA_SUCCESS;
}

FAKE cuGraphNodeGetDependencies(void* node, void** deps, std::size_t* n) {
  ENTER();
  auto* x = static_cast<Node*>(node);
  if (x == nullptr || n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  if (deps != nullptr)
    for (std::size_t i = 0; i < std::min(*n, x->deps.size()); ++i)
      deps[i] = x->deps[i];
  *n = x->deps.size();
  return CUDA_SUCCESS;
}
FAKE cuGraphNodeGetDependencies_v2(void* node, void** deps, void* edges,
                                   std::size_t* n) {
  if (edges != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return cuGraphNodeGetDependencies(node, deps, n);
}

FAKE cuGraphNodeGetDependentNodes(void* node, void** out, std::size_t* n) {
  ENTER();
  auto* x = static_cast<Node*>(node);
  if (x == nullptr || n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  std::size_t count = 0;
  for (auto& m : x->owner->nodes) {
    if (std::find(m->deps.begin(), m->deps.end(), x) == m->deps.end())
      continue;
    if (out != nullptr && count < *n) out[count] = m.get();
    ++count;
  }
  *n = count;
  return CUDA_SUCCESS;
}
FAKE cuGraphNodeGetDependentNodes_v2(void* node, void** out, void* edges,
                                     std::size_t* n) {
  if (edges != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return cuGraphNodeGetDependentNodes(node, out, n);
}

FAKE cuGraphAddDependencies(void* graph, void* const* from, void* const* to,
                            std::size_t n) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p) || (n != 0 && (from == nullptr || to == nullptr)))
    return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < n; ++i) {
    auto* a = static_cast<Node*>(from[i]);
    auto* b = static_cast<Node*>(to[i]);
    if (a == nullptr || b == nullptr || a->owner != p || b->owner != p ||
        a == b)
      return CUDA_ERROR_INVALID_VALUE;
    if (std::find(b->deps.begin(), b->deps.end(), a) == b->deps.end())
      b->deps.push_back(a);
  }
  return CUDA_SUCCESS;
}
FAKE cuGraphAddDependencies_v2(void* graph, void* const* from,
                               void* const* to, const void* /*edges*/,
                               std::size_t n) {
  return cuGraphAddDependencies(graph, from, to, n);
}

FAKE cuGraphRemoveDependencies(void* graph, void* const* from,
                               void* const* to, std::size_t n) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p) || (n != 0 && (from == nullptr || to == nullptr)))
    return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < n; ++i) {
    auto* a = static_cast<Node*>(from[i]);
    auto* b = static_cast<Node*>(to[i]);
    if (a == nullptr || b == nullptr || b->owner != p)
      return CUDA_ERROR_INVALID_VALUE;
    auto it = std::find(b->deps.begin(), b->deps.end(), a);
    if (it == b->deps.end()) return CUDA_ERROR_INVALID_VALUE;
    b->deps.erase(it);
  }
  return CUDA_SUCCESS;
}
FAKE cuGraphRemoveDependencies_v2(void* graph, void* const* from,
                                  void* const* to, const void* /*edges*/,
                                  std::size_t n) {
  return cuGraphRemoveDependencies(graph, from, to, n);
}

FAKE cuGraphChildGraphNodeGetGraph(void* node, void** graph) {
  ENTER();
  return GetTyped(node, kGraph, graph,
                  [](const Node& n) -> void* { return n.child.get(); });
}

FAKE cuGraphKernelNodeGetParams_v2(void* node, KernelParams* params) {
  ENTER();
  return GetTyped(node, kKernel, params,
                  [](const Node& n) { return n.kernel; });
}
FAKE cuGraphKernelNodeSetParams_v2(void* node, const KernelParams* params) {
  ENTER();
  return SetTyped(node, kKernel, [&](Node* n) { return SetKernel(n, params); });
}
FAKE cuGraphKernelNodeGetParams(void* node, KernelParams* params) {
  return cuGraphKernelNodeGetParams_v2(node, params);
}
FAKE cuGraphKernelNodeSetParams(void* node, const KernelParams* params) {
  return cuGraphKernelNodeSetParams_v2(node, params);
}

// Launch attributes (priority, access policy): kept by no one, since
// kernels do not run.
FAKE cuGraphKernelNodeSetAttribute(void* node, int /*attr*/,
                                   const void* value) {
  ENTER();
  return Typed(node, kKernel) != nullptr && value != nullptr
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}
FAKE cuGraphKernelNodeGetAttribute(void* node, int /*attr*/, void* value) {
  ENTER();
  if (Typed(node, kKernel) == nullptr || value == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  std::memset(value, 0, 64);  // CUlaunchAttributeValue: the defaults
  return CUDA_SUCCESS;
}
FAKE cuGraphKernelNodeCopyAttributes(void* dst, void* src) {
  ENTER();
  return Typed(dst, kKernel) != nullptr && Typed(src, kKernel) != nullptr
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}

FAKE cuGraphMemcpyNodeGetParams(void* node, Memcpy3D* params) {
  ENTER();
  return GetTyped(node, kMemcpy, params, [](const Node& n) { return n.copy; });
}
FAKE cuGraphMemcpyNodeSetParams(void* node, const Memcpy3D* params) {
  ENTER();
  return SetTyped(node, kMemcpy, [&](Node* n) { return SetCopy(n, params); });
}
FAKE cuGraphMemsetNodeGetParams(void* node, MemsetParams* params) {
  ENTER();
  return GetTyped(node, kMemset, params,
                  [](const Node& n) { return n.memset; });
}
FAKE cuGraphMemsetNodeSetParams(void* node, const MemsetParams* params) {
  ENTER();
  return SetTyped(node, kMemset,
                  [&](Node* n) { return SetMemset(n, params); });
}
FAKE cuGraphHostNodeGetParams(void* node, HostParams* params) {
  ENTER();
  return GetTyped(node, kHost, params, [](const Node& n) { return n.host; });
}
FAKE cuGraphHostNodeSetParams(void* node, const HostParams* params) {
  ENTER();
  return SetTyped(node, kHost, [&](Node* n) { return SetHost(n, params); });
}
FAKE cuGraphEventRecordNodeGetEvent(void* node, CUevent* event) {
  ENTER();
  return GetTyped(node, kEventRecord, event, [](const Node& n) {
    return static_cast<CUevent>(n.event_handle);
  });
}
FAKE cuGraphEventWaitNodeGetEvent(void* node, CUevent* event) {
  ENTER();
  return GetTyped(node, kWaitEvent, event, [](const Node& n) {
    return static_cast<CUevent>(n.event_handle);
  });
}
FAKE cuGraphEventRecordNodeSetEvent(void* node, CUevent event) {
  ENTER();
  return SetTyped(node, kEventRecord,
                  [&](Node* n) { return SetEvent(n, event); });
}
FAKE cuGraphEventWaitNodeSetEvent(void* node, CUevent event) {
  ENTER();
  return SetTyped(node, kWaitEvent,
                  [&](Node* n) { return SetEvent(n, event); });
}

FAKE cuGraphMemAllocNodeGetParams(void* node, MemAllocParams* params) {
  ENTER();
  return GetTyped(node, kMemAlloc, params, [](const Node& n) {
    MemAllocParams out{};
    out.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    out.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    out.poolProps.location.id = n.device;
    out.bytesize = n.bytes;
    out.dptr = n.dptr;
    return out;
  });
}

FAKE cuGraphMemFreeNodeGetParams(void* node, CUdeviceptr* dptr) {
  ENTER();
  return GetTyped(node, kMemFree, dptr, [](const Node& n) { return n.dptr; });
}

FAKE cuGraphNodeFindInClone(void** out, void* node, void* clone) {
  ENTER();
  auto* n = static_cast<Node*>(node);
  Graph* c = GraphOf(clone);
  if (out == nullptr || n == nullptr || c == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  const auto& src = n->owner->nodes;
  for (std::size_t i = 0; i < src.size() && i < c->nodes.size(); ++i) {
    if (src[i].get() == n) {
      *out = c->nodes[i].get();
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

FAKE cuGraphDebugDotPrint(void* graph, const char* path, unsigned int) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(graph);
  if (!KnownGraph(p) || path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::fprintf(f, "digraph fakegpu {\n");
  for (auto& n : p->nodes) {
    std::fprintf(f, "  n%p [label=\"type %d\"];\n",
                 static_cast<void*>(n.get()), n->type);
    for (Node* d : n->deps)
      std::fprintf(f, "  n%p -> n%p;\n", static_cast<void*>(d),
                   static_cast<void*>(n.get()));
  }
  std::fprintf(f, "}\n");
  std::fclose(f);
  return CUDA_SUCCESS;
}

// ---- executable graphs ------------------------------------------------------

FAKE cuGraphInstantiateWithFlags(void** exec, void* graph,
                                 unsigned long long flags) {
  ENTER();
  return Instantiate(exec, graph, flags);
}
// The first version: (exec, graph, error node, log, log size).
FAKE cuGraphInstantiate(void** exec, void* graph, void** error_node,
                        char* log, std::size_t log_size) {
  ENTER();
  if (error_node != nullptr) *error_node = nullptr;
  if (log != nullptr && log_size > 0) log[0] = '\0';
  return Instantiate(exec, graph, 0);
}
FAKE cuGraphInstantiate_v2(void** exec, void* graph, void** error_node,
                           char* log, std::size_t log_size) {
  return cuGraphInstantiate(exec, graph, error_node, log, log_size);
}
FAKE cuGraphInstantiateWithParams(void** exec, void* graph,
                                  InstantiateParams* params) {
  ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  params->hErrNode_out = nullptr;
  const CUresult r = Instantiate(exec, graph, params->flags);
  params->result_out = r == CUDA_SUCCESS ? 0 : 1;
  return r;
}
FAKE cuGraphInstantiateWithParams_ptsz(void** exec, void* graph,
                                       InstantiateParams* params) {
  return cuGraphInstantiateWithParams(exec, graph, params);
}

FAKE cuGraphExecGetFlags(void* exec, cuuint64_t* flags) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  Exec* e = ExecOf(exec);
  if (e == nullptr || flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = e->flags;
  return CUDA_SUCCESS;
}

FAKE cuGraphExecDestroy(void* exec) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  Exec* e = ExecOf(exec);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  g.execs.erase(e);
  DropAllocations(*e->graph);
  delete e;
  return CUDA_SUCCESS;
}

FAKE cuGraphLaunch(void* exec, CUstream stream) {
  ENTER();
  return Launch(exec, stream);
}
FAKE cuGraphLaunch_ptsz(void* exec, CUstream stream) {
  ENTER();
  return Launch(exec, stream);
}

// Nothing to move to a device that is the host: only the checks.
FAKE cuGraphUpload(void* exec, CUstream stream) {
  ENTER();
  if (StreamFor(stream) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Graphs& g = G();
  Lock lock(g.mu);
  return ExecOf(exec) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE cuGraphUpload_ptsz(void* exec, CUstream stream) {
  return cuGraphUpload(exec, stream);
}

FAKE cuGraphExecUpdate_v2(void* exec, void* graph, UpdateResultInfo* info) {
  ENTER();
  Graphs& g = G();
  Lock lock(g.mu);
  Exec* e = ExecOf(exec);
  Graph* p = GraphOf(graph);
  if (e == nullptr || !KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  UpdateResultInfo local{0, nullptr, nullptr};
  UpdateResultInfo* out = info != nullptr ? info : &local;
  *out = UpdateResultInfo{0, nullptr, nullptr};
  if (!SameTopology(*e->graph, *p, out))
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  TakeParams(*e->graph, *p);
  MapOrigins(e, *e->graph, *p);
  Remember(*e->graph);
  return CUDA_SUCCESS;
}
// The first version: (exec, graph, error node, result).
FAKE cuGraphExecUpdate(void* exec, void* graph, void** error_node,
                       int* result) {
  UpdateResultInfo info{0, nullptr, nullptr};
  const CUresult r = cuGraphExecUpdate_v2(exec, graph, &info);
  if (error_node != nullptr) *error_node = info.errorNode;
  if (result != nullptr) *result = info.result;
  return r;
}

}  // extern "C"

namespace {
// The executable graph's copy of `node`, under the lock.
template <typename F>
CUresult ExecSet(void* exec, void* node, int type, F set) {
  Graphs& g = G();
  Lock lock(g.mu);
  Exec* e = ExecOf(exec);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Node* n = ExecNode(e, node);
  if (n == nullptr || (type >= 0 && n->type != type))
    return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = set(n);
  if (r == CUDA_SUCCESS) {
    Remember(*n);
    if (n->child) Remember(*n->child);
  }
  return r;
}
}  // namespace

extern "C" {

FAKE cuGraphExecKernelNodeSetParams_v2(void* exec, void* node,
                                       const KernelParams* params) {
  ENTER();
  return ExecSet(exec, node, kKernel,
                 [&](Node* n) { return SetKernel(n, params); });
}
FAKE cuGraphExecKernelNodeSetParams(void* exec, void* node,
                                    const KernelParams* params) {
  return cuGraphExecKernelNodeSetParams_v2(exec, node, params);
}
FAKE cuGraphExecMemcpyNodeSetParams(void* exec, void* node,
                                    const Memcpy3D* params, CUcontext) {
  ENTER();
  return ExecSet(exec, node, kMemcpy,
                 [&](Node* n) { return SetCopy(n, params); });
}
FAKE cuGraphExecMemsetNodeSetParams(void* exec, void* node,
                                    const MemsetParams* params, CUcontext) {
  ENTER();
  return ExecSet(exec, node, kMemset,
                 [&](Node* n) { return SetMemset(n, params); });
}
FAKE cuGraphExecHostNodeSetParams(void* exec, void* node,
                                  const HostParams* params) {
  ENTER();
  return ExecSet(exec, node, kHost,
                 [&](Node* n) { return SetHost(n, params); });
}
FAKE cuGraphExecEventRecordNodeSetEvent(void* exec, void* node,
                                        CUevent event) {
  ENTER();
  return ExecSet(exec, node, kEventRecord,
                 [&](Node* n) { return SetEvent(n, event); });
}
FAKE cuGraphExecEventWaitNodeSetEvent(void* exec, void* node, CUevent event) {
  ENTER();
  return ExecSet(exec, node, kWaitEvent,
                 [&](Node* n) { return SetEvent(n, event); });
}
// A child graph node takes the parameters of `child`, whose topology must
// be the node's.
FAKE cuGraphExecChildGraphNodeSetParams(void* exec, void* node, void* child) {
  ENTER();
  return ExecSet(exec, node, kGraph, [&](Node* n) -> CUresult {
    Graph* c = GraphOf(child);
    if (!KnownGraph(c)) return CUDA_ERROR_INVALID_VALUE;
    if (!SameTopology(*n->child, *c, nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    TakeParams(*n->child, *c);
    return CUDA_SUCCESS;
  });
}
FAKE cuGraphExecNodeSetParams(void* exec, void* node, NodeParams* params) {
  ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return ExecSet(exec, node, params->type, [&](Node* n) -> CUresult {
    switch (params->type) {
      case kKernel: return SetKernel(n, &params->kernel);
      case kMemcpy: return SetCopy(n, &params->memcpy.copyParams);
      case kMemset: return SetMemset(n, &params->memset);
      case kHost: return SetHost(n, &params->host);
      case kWaitEvent:
      case kEventRecord: return SetEvent(n, params->event.event);
      case kEmpty: return CUDA_SUCCESS;
      default: return CUDA_ERROR_NOT_SUPPORTED;
    }
  });
}
FAKE cuGraphNodeSetParams(void* node, NodeParams* params) {
  ENTER();
  auto* n = static_cast<Node*>(node);
  if (n == nullptr || params == nullptr || n->type != params->type)
    return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  switch (params->type) {
    case kKernel: return SetKernel(n, &params->kernel);
    case kMemcpy: return SetCopy(n, &params->memcpy.copyParams);
    case kMemset: return SetMemset(n, &params->memset);
    case kHost: return SetHost(n, &params->host);
    case kWaitEvent:
    case kEventRecord: return SetEvent(n, params->event.event);
    case kEmpty: return CUDA_SUCCESS;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

FAKE cuGraphNodeSetEnabled(void* exec, void* node, unsigned int enabled) {
  ENTER();
  return ExecSet(exec, node, -1, [&](Node* n) -> CUresult {
    if (n->type != kKernel && n->type != kMemcpy && n->type != kMemset)
      return CUDA_ERROR_INVALID_VALUE;
    n->enabled = enabled != 0;
    return CUDA_SUCCESS;
  });
}
FAKE cuGraphNodeGetEnabled(void* exec, void* node, unsigned int* enabled) {
  ENTER();
  if (enabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return ExecSet(exec, node, -1, [&](Node* n) -> CUresult {
    *enabled = n->enabled ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

// ---- graph memory -----------------------------------------------------------

// CUgraphMem_attribute: USED_MEM_CURRENT, USED_MEM_HIGH,
// RESERVED_MEM_CURRENT, RESERVED_MEM_HIGH (the fake reserves exactly what
// is in use: a free node or a free gives the memory back at once).
FAKE cuDeviceGetGraphMemAttribute(CUdevice device, int attr, void* value) {
  ENTER();
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr || attr < 0 || attr > 3)
    return CUDA_ERROR_INVALID_VALUE;
  Graphs& g = G();
  Lock lock(g.mu);
  *static_cast<cuuint64_t*>(value) =
      attr % 2 == 0 ? g.used[device] : g.high[device];
  return CUDA_SUCCESS;
}

FAKE cuDeviceSetGraphMemAttribute(CUdevice device, int attr, void* value) {
  ENTER();
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr || (attr != 1 && attr != 3) ||
      *static_cast<cuuint64_t*>(value) != 0)
    return CUDA_ERROR_INVALID_VALUE;  // only a reset of a high mark
  Graphs& g = G();
  Lock lock(g.mu);
  g.high[device] = g.used[device];
  return CUDA_SUCCESS;
}

FAKE cuDeviceGraphMemTrim(CUdevice device) {
  ENTER();
  return ValidDevice(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

}  // extern "C"
