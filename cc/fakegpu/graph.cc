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
//
// This file holds the graphs' core; graph_internal.h says where the rest
// is.

#include "cc/fakegpu/graph_internal.h"

using namespace jaxlake::fakegpu::graphs;  // NOLINT: the graphs' state

namespace jaxlake::fakegpu::graphs {

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

CUresult SetFromParams(Node* n, const NodeParams* params) {
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

}  // namespace jaxlake::fakegpu::graphs
