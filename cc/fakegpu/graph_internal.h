// The fake driver's CUDA graphs, shared by their files: the public
// parameter structs, graphs, nodes, executables, graph allocations and
// captures, under one lock, and the helpers the files share. graph.cc
// holds the graphs' core (order, launch, instantiation, parameters),
// graph_capture.cc stream capture, graph_api.cc the graph and node entry
// points, graph_exec.cc the executable graphs'. What the fake does is said
// at the top of graph.cc.
#ifndef JAXLAKE_FAKEGPU_GRAPH_INTERNAL_H_
#define JAXLAKE_FAKEGPU_GRAPH_INTERNAL_H_

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
#include "cc/fakegpu/memcpy3d.h"
#include "cc/vmm/cuda_types.h"

namespace jaxlake::fakegpu::graphs {

using namespace jaxlake::cuda;            // NOLINT: the driver's vocabulary
using namespace jaxlake::fakegpu::driver;  // NOLINT: its shared state
namespace fg = jaxlake::fakegpu;

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
using Memcpy3D = fg::Memcpy3D;  // CUDA_MEMCPY3D (memcpy3d.h)
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

inline Graphs& G() {
  static Graphs* const g = [] {
    auto* p = new Graphs();
    p->used.assign(Count(), 0);
    p->high.assign(Count(), 0);
    return p;
  }();
  return *g;
}

using Lock = std::lock_guard<std::recursive_mutex>;

// The calling thread's capture mode (cuThreadExchangeStreamCaptureMode).
extern thread_local int t_mode;

// ---- the graphs' core (graph.cc) --------------------------------------------

Graph* GraphOf(void* handle);

bool KnownGraph(Graph* g);

Node* AddNode(Graph* g, void* const* deps, std::size_t n, CUresult* r);

// Drops a graph's reference to the allocations its alloc nodes made.
void DropAllocations(Graph& g);

// Gives up one owner's hold on a graph allocation; the last frees it.
void ReleaseAllocation(CUdeviceptr p);

std::unique_ptr<Graph> Clone(const Graph& src,
                             std::unordered_map<const Node*, Node*>* map,
                             bool executable);

// The nodes of `g` in an order that respects every dependency (insertion
// order among independent nodes); false when the dependencies have a cycle.
bool Order(const Graph& g, std::vector<Node*>* out);

void CopyRegion(const Memcpy3D& p);

void SetRegion(const MemsetParams& p);

// The device ranges a copy or memset node writes or reads (kernels'
// arguments are not known to the fake: none). Host memory is left out.
std::vector<Touch> TouchesOf(const Node& n);

// Records what backs each copy and memset node of an executable graph
// now: called when the executable is made and when its parameters change.
void Remember(Node& n);

void Remember(Graph& g);

// A launch of an executable graph whose copy or memset touches memory that
// was unmapped, or mapped to other memory, since its parameters were set:
// the device faults on it. Returns false (and names it) then.
bool StillBacked(const Graph& g);

void Launched(std::uint64_t n);

// Makes the allocations of `g`'s alloc nodes live (charged to their
// devices): false (nothing charged) when one does not fit, or when one is
// still live from an earlier launch, unless `auto_free` (the instantiation
// flag AUTO_FREE_ON_LAUNCH: freed and allocated again at the same address,
// so it stays as it is).
bool Allocate(const std::vector<CUdeviceptr>& addresses, bool auto_free,
              CUresult* r);

// Frees a live graph allocation once the stream reaches this point.
void EnqueueFree(fg::Stream* s, CUdeviceptr p);

void EnqueueGraph(const Graph& g, fg::Stream* s);

void CollectAllocations(const Graph& g, std::vector<CUdeviceptr>* out);

// An alloc node's address: reserved now, charged when a launch allocates.
CUresult NewGraphAllocation(int device, std::size_t bytes, CUdeviceptr* out);

CUresult SetCopy(Node* n, const Memcpy3D* p);

CUresult SetMemset(Node* n, const MemsetParams* p);

CUresult SetKernel(Node* n, const KernelParams* p);

CUresult SetHost(Node* n, const HostParams* p);

CUresult SetEvent(Node* n, void* event);

// Sets `n`'s parameters from CUgraphNodeParams of its type.
CUresult SetFromParams(Node* n, const NodeParams* params);

bool HasMemoryNodes(const Graph& g);

// Removes `n` from its graph, with the edges that name it.
void DestroyNode(Node* n);

// One node of any type from CUgraphNodeParams (cuGraphAddNode).
CUresult AddFromParams(Graph* g, void* const* deps, std::size_t count,
                       NodeParams* p, Node** out);

// Whether `exec` can take `g`'s parameters: the same nodes, types and
// edges, in the same order (the driver's rule is about topology; the
// fake's graphs are built in one order by one program).
bool SameTopology(const Graph& a, const Graph& b, UpdateResultInfo* info);

// Copies the parameters of `from`'s nodes into `to`'s (same topology).
void TakeParams(Graph& to, const Graph& from);

// Re-keys an executable graph's origin map after an update from `g`.
void MapOrigins(Exec* e, Graph& to, const Graph& from);

Exec* ExecOf(void* handle);

Node* ExecNode(Exec* e, void* node);

CUresult Instantiate(void** exec, void* graph, cuuint64_t flags);

CUresult Launch(void* exec, CUstream stream);

// ---- capture (graph_capture.cc) ---------------------------------------------

StreamCapture* CaptureOf(fg::Stream* s);

// Adds a node for work enqueued on a capturing stream: its dependencies are
// the stream's, and it becomes the stream's only one.
Node* CaptureNode(StreamCapture* sc, int type, std::size_t bytes = 0);

// Whether the calling thread may not make a potentially unsafe call now:
// the driver's rule for the thread's capture mode.
bool Prohibited();

void EndCaptureOf(const std::shared_ptr<Capture>& c);

CUresult BeginCapture(CUstream stream, Graph* into, void* const* deps,
                      std::size_t n, int mode);

CUresult EndCapture(CUstream stream, void** graph);

// cuStreamGetCaptureInfo and its versions.
CUresult CaptureInfo(CUstream stream, int* status, cuuint64_t* id,
                     void** graph, void* const** deps, std::size_t* n);

// f(graphs, the stream, its capture or null) under the graphs' lock, for
// a stream the driver knows; else CUDA_ERROR_INVALID_HANDLE.
template <typename F>
CUresult WithStreamCapture(CUstream stream, F f) {
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Graphs& g = G();
  Lock lock(g.mu);
  return f(g, s, CaptureOf(s));
}

// f(graphs, the graph `handle` names) under the graphs' lock, for a graph
// the program knows; else CUDA_ERROR_INVALID_VALUE.
template <typename F>
CUresult WithGraph(void* handle, F f) {
  Graphs& g = G();
  Lock lock(g.mu);
  Graph* p = GraphOf(handle);
  if (!KnownGraph(p)) return CUDA_ERROR_INVALID_VALUE;
  return f(g, p);
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

}  // namespace jaxlake::fakegpu::graphs

#endif  // JAXLAKE_FAKEGPU_GRAPH_INTERNAL_H_
