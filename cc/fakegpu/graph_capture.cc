// The fake driver's stream capture: work enqueued on a capturing stream
// becomes nodes of the capture's graph instead of running; events join
// streams to a capture; the driver's rules on calls a capture prohibits
// (cc/fakegpu/README.md). Shared state: graph_internal.h.

#include "cc/fakegpu/graph_internal.h"

using namespace jaxlake::fakegpu::graphs;  // NOLINT: the graphs' state

namespace jaxlake::fakegpu::graphs {

// ---- capture ----------------------------------------------------------------

StreamCapture* CaptureOf(fg::Stream* s) {
  Graphs& g = G();
  auto it = g.streams.find(s);
  return it == g.streams.end() ? nullptr : &it->second;
}

// Adds a node for work enqueued on a capturing stream: its dependencies are
// the stream's, and it becomes the stream's only one.
Node* CaptureNode(StreamCapture* sc, int type, std::size_t bytes) {
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
  return WithStreamCapture(
      stream, [&](Graphs& g, fg::Stream* s, StreamCapture* sc) -> CUresult {
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
  });
}

// cuStreamGetCaptureInfo and its versions.
CUresult CaptureInfo(CUstream stream, int* status, cuuint64_t* id,
                     void** graph, void* const** deps, std::size_t* n) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return WithStreamCapture(
      stream, [&](Graphs&, fg::Stream*, StreamCapture* sc) -> CUresult {
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
  });
}

}  // namespace jaxlake::fakegpu::graphs

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

namespace {
// An event call on `stream`: f(graphs, stream, event, its capture or null)
// under the graphs' lock, or false when the stream or event is unknown.
template <typename F>
bool WithEvent(CUstream stream, CUevent event, F f) {
  fg::Stream* s = StreamFor(stream);
  auto e = fg::EventOf(event);
  if (s == nullptr || e == nullptr) return false;
  Graphs& g = G();
  Lock lock(g.mu);
  return f(g, s, e, CaptureOf(s));
}
}  // namespace

// An event recorded on a capturing stream marks the stream's place in the
// capture (for another stream to wait on and join), as the driver does.
bool CaptureEventRecord(CUstream stream, CUevent event, CUresult* r) {
  return WithEvent(stream, event, [&](Graphs& g, fg::Stream*, auto& e,
                                      StreamCapture* sc) {
    if (sc == nullptr) {
      g.events.erase(e.get());  // recorded outside any capture now
      return false;
    }
    g.events[e.get()] = EventCapture{sc->capture, sc->deps};
    *r = CUDA_SUCCESS;
    return true;
  });
}

// A wait on an event recorded in a capture: a capturing stream takes the
// event's place as more dependencies; another stream joins the capture.
// A capturing stream waiting on an event from outside the capture gets an
// event wait node.
bool CaptureEventWait(CUstream stream, CUevent event, CUresult* r) {
  return WithEvent(stream, event, [&](Graphs& g, fg::Stream* s, auto& e,
                                      StreamCapture* sc) {
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
  });
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
  return WithStreamCapture(
      stream, [&](Graphs&, fg::Stream*, StreamCapture* sc) -> CUresult {
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
  });
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

}  // extern "C"
