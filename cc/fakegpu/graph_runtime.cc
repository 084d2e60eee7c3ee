// The fake CUDA runtime's graphs and stream capture: the cudaGraph* and
// cudaStream*Capture* calls over the driver's (graph.cc). The runtime's
// handles are the driver's, and its parameter structs have the driver's
// layout except cudaMemcpy3DParms, which is converted. The driver's error
// codes these calls return have the same numbers in the runtime's enum
// (cudaErrorStreamCaptureUnsupported is 900 as CUDA_ERROR_..., and so on).
#include <cstddef>
#include <cstdint>

#include "cc/fakegpu/fakegpu.h"
#include "cc/fakegpu/memcpy3d.h"

// The driver's entry points this file calls (graph.cc, stream.cc).
extern "C" {
int cuStreamBeginCapture_v2(void*, int);
int cuStreamBeginCaptureToGraph(void*, void*, void* const*, const void*,
                                std::size_t, int);
int cuStreamEndCapture(void*, void**);
int cuStreamIsCapturing(void*, int*);
int cuStreamGetCaptureInfo_v2(void*, int*, unsigned long long*, void**,
                              void* const**, std::size_t*);
int cuStreamGetCaptureInfo_v3(void*, int*, unsigned long long*, void**,
                              void* const**, const void**, std::size_t*);
int cuStreamUpdateCaptureDependencies(void*, void**, std::size_t,
                                      unsigned int);
int cuThreadExchangeStreamCaptureMode(int*);
int cuGraphCreate(void**, unsigned int);
int cuGraphDestroy(void*);
int cuGraphClone(void**, void*);
int cuGraphInstantiateWithFlags(void**, void*, unsigned long long);
int cuGraphInstantiateWithParams(void**, void*, void*);
int cuGraphLaunch(void*, void*);
int cuGraphUpload(void*, void*);
int cuGraphExecDestroy(void*);
int cuGraphExecUpdate_v2(void*, void*, void*);
int cuGraphGetNodes(void*, void**, std::size_t*);
int cuGraphGetRootNodes(void*, void**, std::size_t*);
int cuGraphNodeGetType(void*, int*);
int cuGraphAddEmptyNode(void**, void*, void* const*, std::size_t);
int cuGraphAddKernelNode_v2(void**, void*, void* const*, std::size_t,
                            const void*);
int cuGraphAddMemcpyNode(void**, void*, void* const*, std::size_t,
                         const void*, void*);
int cuGraphAddMemsetNode(void**, void*, void* const*, std::size_t,
                         const void*, void*);
int cuGraphAddHostNode(void**, void*, void* const*, std::size_t,
                       const void*);
int cuGraphAddChildGraphNode(void**, void*, void* const*, std::size_t,
                             void*);
int cuGraphAddEventRecordNode(void**, void*, void* const*, std::size_t,
                              void*);
int cuGraphAddEventWaitNode(void**, void*, void* const*, std::size_t, void*);
int cuGraphAddMemAllocNode(void**, void*, void* const*, std::size_t, void*);
int cuGraphAddMemFreeNode(void**, void*, void* const*, std::size_t,
                          unsigned long long);
int cuGraphAddNode(void**, void*, void* const*, std::size_t, void*);
int cuGraphExecKernelNodeSetParams_v2(void*, void*, const void*);
int cuGraphExecMemcpyNodeSetParams(void*, void*, const void*, void*);
int cuGraphExecMemsetNodeSetParams(void*, void*, const void*, void*);
int cuGraphExecHostNodeSetParams(void*, void*, const void*);
int cuGraphExecChildGraphNodeSetParams(void*, void*, void*);
int cuGraphChildGraphNodeGetGraph(void*, void**);
int cuGraphConditionalHandleCreate(unsigned long long*, void*, void*,
                                   unsigned int, unsigned int);
int cuGraphNodeSetEnabled(void*, void*, unsigned int);
int cuGraphDebugDotPrint(void*, const char*, unsigned int);
int cuDeviceGetGraphMemAttribute(int, int, void*);
int cuDeviceSetGraphMemAttribute(int, int, void*);
int cuDeviceGraphMemTrim(int);
int cuGraphAddDependencies(void*, void* const*, void* const*, std::size_t);
int cuGraphRemoveDependencies(void*, void* const*, void* const*, std::size_t);
int cuGraphDestroyNode(void*);
int cuGraphEventRecordNodeGetEvent(void*, void**);
int cuGraphEventRecordNodeSetEvent(void*, void*);
int cuGraphEventWaitNodeGetEvent(void*, void**);
int cuGraphEventWaitNodeSetEvent(void*, void*);
int cuGraphExecEventRecordNodeSetEvent(void*, void*, void*);
int cuGraphExecEventWaitNodeSetEvent(void*, void*, void*);
int cuGraphExecGetFlags(void*, unsigned long long*);
int cuGraphExecNodeSetParams(void*, void*, void*);
int cuGraphNodeSetParams(void*, void*);
int cuGraphGetEdges(void*, void**, void**, std::size_t*);
int cuGraphHostNodeGetParams(void*, void*);
int cuGraphHostNodeSetParams(void*, const void*);
int cuGraphKernelNodeGetParams_v2(void*, void*);
int cuGraphKernelNodeSetParams_v2(void*, const void*);
int cuGraphKernelNodeGetAttribute(void*, int, void*);
int cuGraphKernelNodeSetAttribute(void*, int, const void*);
int cuGraphKernelNodeCopyAttributes(void*, void*);
int cuGraphMemAllocNodeGetParams(void*, void*);
int cuGraphMemFreeNodeGetParams(void*, unsigned long long*);
int cuGraphMemsetNodeGetParams(void*, void*);
int cuGraphMemsetNodeSetParams(void*, const void*);
int cuGraphMemcpyNodeSetParams(void*, const void*);
int cuGraphNodeFindInClone(void**, void*, void*);
int cuGraphNodeGetDependencies(void*, void**, std::size_t*);
int cuGraphNodeGetDependentNodes(void*, void**, std::size_t*);
int cuGraphNodeGetEnabled(void*, void*, unsigned int*);
}

namespace {

#define ENTER() JAXLAKE_FAKEGPU_ENTER()

// cudaMemcpy3DParms and its parts.
struct Pos {
  std::size_t x, y, z;
};
struct PitchedPtr {
  void* ptr;
  std::size_t pitch, xsize, ysize;
};
struct Memcpy3DParms {
  void* srcArray;
  Pos srcPos;
  PitchedPtr srcPtr;
  void* dstArray;
  Pos dstPos;
  PitchedPtr dstPtr;
  Pos extent;  // width (bytes), height, depth
  int kind;
};
using jaxlake::fakegpu::Memcpy3D;  // CUDA_MEMCPY3D

constexpr int kUnified = 4;  // CU_MEMORYTYPE_UNIFIED: one address space
constexpr int kErrorInvalidValue = 1;

int ToDriver(const Memcpy3DParms* p, Memcpy3D* out) {
  if (p == nullptr) return kErrorInvalidValue;
  if (p->srcArray != nullptr || p->dstArray != nullptr)
    return 801;  // cudaErrorNotSupported: the fake has no CUDA arrays
  *out = Memcpy3D{};
  out->srcMemoryType = kUnified;
  out->srcDevice = reinterpret_cast<std::uintptr_t>(p->srcPtr.ptr);
  out->srcXInBytes = p->srcPos.x;
  out->srcY = p->srcPos.y;
  out->srcZ = p->srcPos.z;
  out->srcPitch = p->srcPtr.pitch;
  out->srcHeight = p->srcPtr.ysize;
  out->dstMemoryType = kUnified;
  out->dstDevice = reinterpret_cast<std::uintptr_t>(p->dstPtr.ptr);
  out->dstXInBytes = p->dstPos.x;
  out->dstY = p->dstPos.y;
  out->dstZ = p->dstPos.z;
  out->dstPitch = p->dstPtr.pitch;
  out->dstHeight = p->dstPtr.ysize;
  out->WidthInBytes = p->extent.x;
  out->Height = p->extent.y;
  out->Depth = p->extent.z;
  return 0;
}

Memcpy3D Linear(void* dst, const void* src, std::size_t n) {
  Memcpy3D m{};
  m.srcMemoryType = m.dstMemoryType = kUnified;
  m.srcDevice = reinterpret_cast<std::uintptr_t>(src);
  m.dstDevice = reinterpret_cast<std::uintptr_t>(dst);
  m.WidthInBytes = n;
  m.Height = m.Depth = 1;
  return m;
}

}  // namespace

#define RT extern "C" __attribute__((visibility("default"))) int

// ---- stream capture ---------------------------------------------------------

RT cudaStreamBeginCapture(void* stream, int mode) {
  ENTER();
  return cuStreamBeginCapture_v2(stream, mode);
}
RT cudaStreamBeginCapture_ptsz(void* stream, int mode) {
  return cudaStreamBeginCapture(stream, mode);
}
RT cudaStreamBeginCaptureToGraph(void* stream, void* graph,
                                 void* const* deps, const void* edges,
                                 std::size_t n, int mode) {
  ENTER();
  return cuStreamBeginCaptureToGraph(stream, graph, deps, edges, n, mode);
}
RT cudaStreamBeginCaptureToGraph_ptsz(void* stream, void* graph,
                                      void* const* deps, const void* edges,
                                      std::size_t n, int mode) {
  return cudaStreamBeginCaptureToGraph(stream, graph, deps, edges, n, mode);
}
RT cudaStreamEndCapture(void* stream, void** graph) {
  ENTER();
  return cuStreamEndCapture(stream, graph);
}
RT cudaStreamEndCapture_ptsz(void* stream, void** graph) {
  return cudaStreamEndCapture(stream, graph);
}
RT cudaStreamIsCapturing(void* stream, int* status) {
  ENTER();
  return cuStreamIsCapturing(stream, status);
}
// The first version: status and id only.
RT cudaStreamGetCaptureInfo(void* stream, int* status,
                            unsigned long long* id) {
  ENTER();
  return cuStreamGetCaptureInfo_v2(stream, status, id, nullptr, nullptr,
                                   nullptr);
}
RT cudaStreamGetCaptureInfo_ptsz(void* stream, int* status,
                                 unsigned long long* id) {
  return cudaStreamGetCaptureInfo(stream, status, id);
}
RT cudaStreamGetCaptureInfo_v2(void* stream, int* status,
                               unsigned long long* id, void** graph,
                               void* const** deps, std::size_t* n) {
  ENTER();
  return cuStreamGetCaptureInfo_v2(stream, status, id, graph, deps, n);
}
RT cudaStreamGetCaptureInfo_v2_ptsz(void* stream, int* status,
                                    unsigned long long* id, void** graph,
                                    void* const** deps, std::size_t* n) {
  return cudaStreamGetCaptureInfo_v2(stream, status, id, graph, deps, n);
}
RT cudaStreamGetCaptureInfo_v3(void* stream, int* status,
                               unsigned long long* id, void** graph,
                               void* const** deps, const void** edges,
                               std::size_t* n) {
  ENTER();
  return cuStreamGetCaptureInfo_v3(stream, status, id, graph, deps, edges,
                                   n);
}
RT cudaStreamGetCaptureInfo_v3_ptsz(void* stream, int* status,
                                    unsigned long long* id, void** graph,
                                    void* const** deps, const void** edges,
                                    std::size_t* n) {
  return cudaStreamGetCaptureInfo_v3(stream, status, id, graph, deps, edges,
                                     n);
}
RT cudaStreamUpdateCaptureDependencies(void* stream, void** nodes,
                                       std::size_t n, unsigned int flags) {
  ENTER();
  return cuStreamUpdateCaptureDependencies(stream, nodes, n, flags);
}
RT cudaThreadExchangeStreamCaptureMode(int* mode) {
  ENTER();
  return cuThreadExchangeStreamCaptureMode(mode);
}

// ---- graphs -----------------------------------------------------------------

RT cudaGraphCreate(void** graph, unsigned int flags) {
  ENTER();
  return cuGraphCreate(graph, flags);
}
RT cudaGraphDestroy(void* graph) {
  ENTER();
  return cuGraphDestroy(graph);
}
RT cudaGraphClone(void** clone, void* graph) {
  ENTER();
  return cuGraphClone(clone, graph);
}
RT cudaGraphGetNodes(void* graph, void** nodes, std::size_t* n) {
  ENTER();
  return cuGraphGetNodes(graph, nodes, n);
}
RT cudaGraphGetRootNodes(void* graph, void** nodes, std::size_t* n) {
  ENTER();
  return cuGraphGetRootNodes(graph, nodes, n);
}
RT cudaGraphNodeGetType(void* node, int* type) {
  ENTER();
  return cuGraphNodeGetType(node, type);
}
RT cudaGraphAddEmptyNode(void** node, void* graph, void* const* deps,
                         std::size_t n) {
  ENTER();
  return cuGraphAddEmptyNode(node, graph, deps, n);
}
// cudaKernelNodeParams has CUDA_KERNEL_NODE_PARAMS's leading fields.
RT cudaGraphAddKernelNode(void** node, void* graph, void* const* deps,
                          std::size_t n, const void* params) {
  ENTER();
  return cuGraphAddKernelNode_v2(node, graph, deps, n, params);
}
RT cudaGraphAddMemcpyNode(void** node, void* graph, void* const* deps,
                          std::size_t n, const Memcpy3DParms* params) {
  ENTER();
  Memcpy3D m{};
  if (int r = ToDriver(params, &m); r != 0) return r;
  return cuGraphAddMemcpyNode(node, graph, deps, n, &m, nullptr);
}
RT cudaGraphAddMemcpyNode1D(void** node, void* graph, void* const* deps,
                            std::size_t n, void* dst, const void* src,
                            std::size_t count, int /*kind*/) {
  ENTER();
  const Memcpy3D m = Linear(dst, src, count);
  return cuGraphAddMemcpyNode(node, graph, deps, n, &m, nullptr);
}
// cudaMemsetParams and cudaHostNodeParams have the driver's layout.
RT cudaGraphAddMemsetNode(void** node, void* graph, void* const* deps,
                          std::size_t n, const void* params) {
  ENTER();
  return cuGraphAddMemsetNode(node, graph, deps, n, params, nullptr);
}
RT cudaGraphAddHostNode(void** node, void* graph, void* const* deps,
                        std::size_t n, const void* params) {
  ENTER();
  return cuGraphAddHostNode(node, graph, deps, n, params);
}
RT cudaGraphAddChildGraphNode(void** node, void* graph, void* const* deps,
                              std::size_t n, void* child) {
  ENTER();
  return cuGraphAddChildGraphNode(node, graph, deps, n, child);
}
RT cudaGraphAddEventRecordNode(void** node, void* graph, void* const* deps,
                               std::size_t n, void* event) {
  ENTER();
  return cuGraphAddEventRecordNode(node, graph, deps, n, event);
}
RT cudaGraphAddEventWaitNode(void** node, void* graph, void* const* deps,
                             std::size_t n, void* event) {
  ENTER();
  return cuGraphAddEventWaitNode(node, graph, deps, n, event);
}
// cudaMemAllocNodeParams has CUDA_MEM_ALLOC_NODE_PARAMS's layout and enum
// values.
RT cudaGraphAddMemAllocNode(void** node, void* graph, void* const* deps,
                            std::size_t n, void* params) {
  ENTER();
  return cuGraphAddMemAllocNode(node, graph, deps, n, params);
}
RT cudaGraphAddMemFreeNode(void** node, void* graph, void* const* deps,
                           std::size_t n, void* dptr) {
  ENTER();
  return cuGraphAddMemFreeNode(node, graph, deps, n,
                               reinterpret_cast<std::uintptr_t>(dptr));
}
RT cudaGraphAddNode(void** node, void* graph, void* const* deps,
                    std::size_t n, void* params) {
  ENTER();
  return cuGraphAddNode(node, graph, deps, n, params);
}
RT cudaGraphChildGraphNodeGetGraph(void* node, void** graph) {
  ENTER();
  return cuGraphChildGraphNodeGetGraph(node, graph);
}
RT cudaGraphConditionalHandleCreate(unsigned long long* handle, void* graph,
                                    unsigned int value, unsigned int flags) {
  ENTER();
  return cuGraphConditionalHandleCreate(handle, graph, nullptr, value, flags);
}
RT cudaGraphDebugDotPrint(void* graph, const char* path, unsigned int flags) {
  ENTER();
  return cuGraphDebugDotPrint(graph, path, flags);
}

// ---- executable graphs ------------------------------------------------------

RT cudaGraphInstantiate(void** exec, void* graph, unsigned long long flags) {
  ENTER();
  return cuGraphInstantiateWithFlags(exec, graph, flags);
}
RT cudaGraphInstantiateWithFlags(void** exec, void* graph,
                                 unsigned long long flags) {
  ENTER();
  return cuGraphInstantiateWithFlags(exec, graph, flags);
}
RT cudaGraphInstantiateWithParams(void** exec, void* graph, void* params) {
  ENTER();
  return cuGraphInstantiateWithParams(exec, graph, params);
}
RT cudaGraphInstantiateWithParams_ptsz(void** exec, void* graph,
                                       void* params) {
  return cudaGraphInstantiateWithParams(exec, graph, params);
}
RT cudaGraphLaunch(void* exec, void* stream) {
  ENTER();
  return cuGraphLaunch(exec, stream);
}
RT cudaGraphLaunch_ptsz(void* exec, void* stream) {
  return cudaGraphLaunch(exec, stream);
}
RT cudaGraphUpload(void* exec, void* stream) {
  ENTER();
  return cuGraphUpload(exec, stream);
}
RT cudaGraphUpload_ptsz(void* exec, void* stream) {
  return cudaGraphUpload(exec, stream);
}
RT cudaGraphExecDestroy(void* exec) {
  ENTER();
  return cuGraphExecDestroy(exec);
}
RT cudaGraphExecUpdate(void* exec, void* graph, void* info) {
  ENTER();
  return cuGraphExecUpdate_v2(exec, graph, info);
}
RT cudaGraphExecKernelNodeSetParams(void* exec, void* node,
                                    const void* params) {
  ENTER();
  return cuGraphExecKernelNodeSetParams_v2(exec, node, params);
}
RT cudaGraphExecMemcpyNodeSetParams(void* exec, void* node,
                                    const Memcpy3DParms* params) {
  ENTER();
  Memcpy3D m{};
  if (int r = ToDriver(params, &m); r != 0) return r;
  return cuGraphExecMemcpyNodeSetParams(exec, node, &m, nullptr);
}
RT cudaGraphExecMemcpyNodeSetParams1D(void* exec, void* node, void* dst,
                                      const void* src, std::size_t count,
                                      int /*kind*/) {
  ENTER();
  const Memcpy3D m = Linear(dst, src, count);
  return cuGraphExecMemcpyNodeSetParams(exec, node, &m, nullptr);
}
RT cudaGraphExecMemsetNodeSetParams(void* exec, void* node,
                                    const void* params) {
  ENTER();
  return cuGraphExecMemsetNodeSetParams(exec, node, params, nullptr);
}
RT cudaGraphExecHostNodeSetParams(void* exec, void* node,
                                  const void* params) {
  ENTER();
  return cuGraphExecHostNodeSetParams(exec, node, params);
}
RT cudaGraphExecChildGraphNodeSetParams(void* exec, void* node, void* child) {
  ENTER();
  return cuGraphExecChildGraphNodeSetParams(exec, node, child);
}
RT cudaGraphNodeSetEnabled(void* exec, void* node, unsigned int enabled) {
  ENTER();
  return cuGraphNodeSetEnabled(exec, node, enabled);
}

// ---- node queries and parameters --------------------------------------------

RT cudaGraphAddDependencies(void* graph, void* const* from, void* const* to,
                            std::size_t n) {
  ENTER();
  return cuGraphAddDependencies(graph, from, to, n);
}
RT cudaGraphAddDependencies_v2(void* graph, void* const* from,
                               void* const* to, const void* /*edges*/,
                               std::size_t n) {
  return cudaGraphAddDependencies(graph, from, to, n);
}
RT cudaGraphRemoveDependencies(void* graph, void* const* from,
                               void* const* to, std::size_t n) {
  ENTER();
  return cuGraphRemoveDependencies(graph, from, to, n);
}
RT cudaGraphRemoveDependencies_v2(void* graph, void* const* from,
                                  void* const* to, const void* /*edges*/,
                                  std::size_t n) {
  return cudaGraphRemoveDependencies(graph, from, to, n);
}
RT cudaGraphAddNode_v2(void** node, void* graph, void* const* deps,
                       const void* /*edges*/, std::size_t n, void* params) {
  return cudaGraphAddNode(node, graph, deps, n, params);
}
RT cudaGraphDestroyNode(void* node) {
  ENTER();
  return cuGraphDestroyNode(node);
}
RT cudaGraphGetEdges(void* graph, void** from, void** to, std::size_t* n) {
  ENTER();
  return cuGraphGetEdges(graph, from, to, n);
}
RT cudaGraphGetEdges_v2(void* graph, void** from, void** to, void* edges,
                        std::size_t* n) {
  if (edges != nullptr) return 801;  // the fake's edges carry no data
  return cudaGraphGetEdges(graph, from, to, n);
}
RT cudaGraphNodeGetDependencies(void* node, void** deps, std::size_t* n) {
  ENTER();
  return cuGraphNodeGetDependencies(node, deps, n);
}
RT cudaGraphNodeGetDependencies_v2(void* node, void** deps, void* edges,
                                   std::size_t* n) {
  if (edges != nullptr) return 801;
  return cudaGraphNodeGetDependencies(node, deps, n);
}
RT cudaGraphNodeGetDependentNodes(void* node, void** out, std::size_t* n) {
  ENTER();
  return cuGraphNodeGetDependentNodes(node, out, n);
}
RT cudaGraphNodeGetDependentNodes_v2(void* node, void** out, void* edges,
                                     std::size_t* n) {
  if (edges != nullptr) return 801;
  return cudaGraphNodeGetDependentNodes(node, out, n);
}
RT cudaGraphNodeFindInClone(void** out, void* node, void* clone) {
  ENTER();
  return cuGraphNodeFindInClone(out, node, clone);
}
RT cudaGraphNodeGetEnabled(void* exec, void* node, unsigned int* enabled) {
  ENTER();
  return cuGraphNodeGetEnabled(exec, node, enabled);
}
RT cudaGraphNodeSetParams(void* node, void* params) {
  ENTER();
  return cuGraphNodeSetParams(node, params);
}
RT cudaGraphExecNodeSetParams(void* exec, void* node, void* params) {
  ENTER();
  return cuGraphExecNodeSetParams(exec, node, params);
}
RT cudaGraphExecGetFlags(void* exec, unsigned long long* flags) {
  ENTER();
  return cuGraphExecGetFlags(exec, flags);
}
RT cudaGraphKernelNodeGetParams(void* node, void* params) {
  ENTER();
  return cuGraphKernelNodeGetParams_v2(node, params);
}
RT cudaGraphKernelNodeSetParams(void* node, const void* params) {
  ENTER();
  return cuGraphKernelNodeSetParams_v2(node, params);
}
RT cudaGraphKernelNodeGetAttribute(void* node, int attr, void* value) {
  ENTER();
  return cuGraphKernelNodeGetAttribute(node, attr, value);
}
RT cudaGraphKernelNodeSetAttribute(void* node, int attr, const void* value) {
  ENTER();
  return cuGraphKernelNodeSetAttribute(node, attr, value);
}
RT cudaGraphKernelNodeCopyAttributes(void* dst, void* src) {
  ENTER();
  return cuGraphKernelNodeCopyAttributes(dst, src);
}
RT cudaGraphHostNodeGetParams(void* node, void* params) {
  ENTER();
  return cuGraphHostNodeGetParams(node, params);
}
RT cudaGraphHostNodeSetParams(void* node, const void* params) {
  ENTER();
  return cuGraphHostNodeSetParams(node, params);
}
RT cudaGraphMemsetNodeGetParams(void* node, void* params) {
  ENTER();
  return cuGraphMemsetNodeGetParams(node, params);
}
RT cudaGraphMemsetNodeSetParams(void* node, const void* params) {
  ENTER();
  return cuGraphMemsetNodeSetParams(node, params);
}
RT cudaGraphMemcpyNodeSetParams(void* node, const Memcpy3DParms* params) {
  ENTER();
  Memcpy3D m{};
  if (int r = ToDriver(params, &m); r != 0) return r;
  return cuGraphMemcpyNodeSetParams(node, &m);
}
RT cudaGraphMemcpyNodeSetParams1D(void* node, void* dst, const void* src,
                                  std::size_t count, int /*kind*/) {
  ENTER();
  const Memcpy3D m = Linear(dst, src, count);
  return cuGraphMemcpyNodeSetParams(node, &m);
}
RT cudaGraphMemAllocNodeGetParams(void* node, void* params) {
  ENTER();
  return cuGraphMemAllocNodeGetParams(node, params);
}
RT cudaGraphMemFreeNodeGetParams(void* node, void** dptr) {
  ENTER();
  unsigned long long p = 0;
  const int r = cuGraphMemFreeNodeGetParams(node, &p);
  if (r == 0 && dptr != nullptr) *dptr = reinterpret_cast<void*>(p);
  return r;
}
RT cudaGraphEventRecordNodeGetEvent(void* node, void** event) {
  ENTER();
  return cuGraphEventRecordNodeGetEvent(node, event);
}
RT cudaGraphEventRecordNodeSetEvent(void* node, void* event) {
  ENTER();
  return cuGraphEventRecordNodeSetEvent(node, event);
}
RT cudaGraphEventWaitNodeGetEvent(void* node, void** event) {
  ENTER();
  return cuGraphEventWaitNodeGetEvent(node, event);
}
RT cudaGraphEventWaitNodeSetEvent(void* node, void* event) {
  ENTER();
  return cuGraphEventWaitNodeSetEvent(node, event);
}
RT cudaGraphExecEventRecordNodeSetEvent(void* exec, void* node, void* event) {
  ENTER();
  return cuGraphExecEventRecordNodeSetEvent(exec, node, event);
}
RT cudaGraphExecEventWaitNodeSetEvent(void* exec, void* node, void* event) {
  ENTER();
  return cuGraphExecEventWaitNodeSetEvent(exec, node, event);
}
RT cudaStreamUpdateCaptureDependencies_ptsz(void* stream, void** nodes,
                                            std::size_t n,
                                            unsigned int flags) {
  return cudaStreamUpdateCaptureDependencies(stream, nodes, n, flags);
}
RT cudaStreamUpdateCaptureDependencies_v2(void* stream, void** nodes,
                                          const void* /*edges*/,
                                          std::size_t n, unsigned int flags) {
  return cudaStreamUpdateCaptureDependencies(stream, nodes, n, flags);
}
RT cudaStreamUpdateCaptureDependencies_v2_ptsz(void* stream, void** nodes,
                                               const void* edges,
                                               std::size_t n,
                                               unsigned int flags) {
  return cudaStreamUpdateCaptureDependencies_v2(stream, nodes, edges, n,
                                                flags);
}

// ---- graph memory -----------------------------------------------------------

RT cudaDeviceGetGraphMemAttribute(int device, int attr, void* value) {
  ENTER();
  return cuDeviceGetGraphMemAttribute(device, attr, value);
}
RT cudaDeviceSetGraphMemAttribute(int device, int attr, void* value) {
  ENTER();
  return cuDeviceSetGraphMemAttribute(device, attr, value);
}
RT cudaDeviceGraphMemTrim(int device) {
  ENTER();
  return cuDeviceGraphMemTrim(device);
}
