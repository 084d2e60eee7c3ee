// The fake driver's executable graphs: instantiation, launch and upload,
// exec updates and the exec node setters, graph memory attributes.
// Shared state: graph_internal.h.

#include "cc/fakegpu/graph_internal.h"

using namespace jaxlake::fakegpu::graphs;  // NOLINT: the graphs' state

extern "C" {

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
// A child graph node of an executable graph takes the parameters of
// `child`, whose topology must be the node's (under the lock).
CUresult SetChildParams(Node* n, void* child) {
  Graph* c = GraphOf(child);
  if (!KnownGraph(c)) return CUDA_ERROR_INVALID_VALUE;
  if (!SameTopology(*n->child, *c, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  TakeParams(*n->child, *c);
  return CUDA_SUCCESS;
}

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
  return ExecSet(exec, node, kGraph,
                 [&](Node* n) { return SetChildParams(n, child); });
}
// Any node type of SetFromParams, and a child graph node as
// cuGraphExecChildGraphNodeSetParams updates it (newer XLA updates its
// command buffers' child graphs this way).
FAKE cuGraphExecNodeSetParams(void* exec, void* node, NodeParams* params) {
  ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (params->type == kGraph)
    return ExecSet(exec, node, kGraph, [&](Node* n) {
      return SetChildParams(n, params->graph.graph);
    });
  return ExecSet(exec, node, params->type,
                 [&](Node* n) { return SetFromParams(n, params); });
}
FAKE cuGraphNodeSetParams(void* node, NodeParams* params) {
  ENTER();
  auto* n = static_cast<Node*>(node);
  if (n == nullptr || params == nullptr || n->type != params->type)
    return CUDA_ERROR_INVALID_VALUE;
  Lock lock(G().mu);
  return SetFromParams(n, params);
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
