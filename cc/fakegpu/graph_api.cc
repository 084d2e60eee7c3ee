// The fake driver's graph and node entry points: graphs, their nodes of
// every type (added, queried, their parameters got and set), edges,
// clones and the debug print. Shared state: graph_internal.h.

#include "cc/fakegpu/graph_internal.h"

using namespace jaxlake::fakegpu::graphs;  // NOLINT: the graphs' state

extern "C" {

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
  return WithGraph(graph, [&](Graphs&, Graph* p) -> CUresult {
    CUresult r = CUDA_SUCCESS;
    Node* out = AddNode(p, deps, n, &r);
    if (out != nullptr) *node = out;
    return r;
  });
}

}  // extern "C"

namespace {
// Adds a node of `type` whose parameters `set` fills; the node goes again
// when `set` refuses them.
template <typename F>
CUresult AddTyped(void** node, void* graph, void* const* deps, std::size_t n,
                  int type, F set) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return WithGraph(graph, [&](Graphs&, Graph* p) -> CUresult {
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
  });
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
  return WithGraph(graph, [&](Graphs&, Graph* p) -> CUresult {
    Node* out = nullptr;
    CUresult r = AddFromParams(p, deps, n, params, &out);
    if (r == CUDA_SUCCESS) *node = out;
    return r;
  });
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
  return WithGraph(graph, [&](Graphs&, Graph* p) -> CUresult {
    if (nodes != nullptr)
      for (std::size_t i = 0; i < std::min(*n, p->nodes.size()); ++i)
        nodes[i] = p->nodes[i].get();
    *n = p->nodes.size();
    return CUDA_SUCCESS;
  });
}

FAKE cuGraphGetRootNodes(void* graph, void** nodes, std::size_t* n) {
  ENTER();
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return WithGraph(graph, [&](Graphs&, Graph* p) -> CUresult {
    std::size_t count = 0;
    for (auto& x : p->nodes) {
      if (!x->deps.empty()) continue;
      if (nodes != nullptr && count < *n) nodes[count] = x.get();
      ++count;
    }
    *n = count;
    return CUDA_SUCCESS;
  });
}

FAKE cuGraphGetEdges(void* graph, void** from, void** to, std::size_t* n) {
  ENTER();
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return WithGraph(graph, [&](Graphs&, Graph* p) -> CUresult {
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
  });
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

// cuGraph<Name>NodeGetParams and cuGraph<Name>NodeSetParams of the node
// type `type`: its parameters `Params`, kept in Node::`field` and set by
// `set`.
#define JAXLAKE_NODE_PARAMS(Name, Params, type, field, set)              \
  FAKE cuGraph##Name##NodeGetParams(void* node, Params* params) {        \
    ENTER();                                                             \
    return GetTyped(node, type, params,                                  \
                    [](const Node& n) { return n.field; });             \
  }                                                                      \
  FAKE cuGraph##Name##NodeSetParams(void* node, const Params* params) {  \
    ENTER();                                                             \
    return SetTyped(node, type, [&](Node* n) { return set(n, params); }); \
  }
JAXLAKE_NODE_PARAMS(Memcpy, Memcpy3D, kMemcpy, copy, SetCopy)
JAXLAKE_NODE_PARAMS(Memset, MemsetParams, kMemset, memset, SetMemset)
JAXLAKE_NODE_PARAMS(Host, HostParams, kHost, host, SetHost)
#undef JAXLAKE_NODE_PARAMS
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

}  // extern "C"
