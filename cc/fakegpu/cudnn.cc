// The fake GPU's cuDNN: handles, streams, versions and status strings, and
// the backend (graph) API that cudnn-frontend, compiled into XLA, drives:
// descriptors that hold their attributes, finalization that computes the
// read-only ones, engine heuristics, execution plans and their JSON form,
// variant packs, and execution in stream order.
//
// The rules of the fake (cc/fakegpu/README.md, "cuDNN"):
// - A descriptor keeps every attribute as set: its type, its element count
//   and its bytes. cudnnBackendGetAttribute returns them as set, and the
//   attributes finalization computes; a descriptor-valued attribute fills
//   the caller's descriptors with copies of the stored ones, as cuDNN does.
// - Every operation graph has two engines: engine 0 needs no workspace,
//   engine 1 needs the workspace rule's; heuristics, in every mode, return
//   one engine config, of engine 1. (XLA with autotuning off runs engine 0
//   of a convolution with a scratch buffer of no bytes, so engine 0 must
//   need none.)
// - The workspace rule: the size in bytes of the largest non-virtual
//   tensor the operation graph reads or writes (a tensor's bytes: (1 + sum
//   over dimensions of (dim - 1) * stride) elements of its data type;
//   by-value tensors excluded). It is the fake's rule, not cuDNN's, whose
//   workspace depends on the engine and its knobs.
// - cudnnBackendExecute checks the variant pack against the plan (every
//   non-virtual tensor's pointer is device memory of the tensor's bytes,
//   the workspace is device memory of the plan's size) and enqueues, on the
//   handle's stream, work that does nothing to the data: it is a kernel.
// - The engines carry no behavior note: in particular not
//   SUPPORTS_CUDA_GRAPH_NATIVE_API, so cudnnBackendPopulateCudaGraph and
//   cudnnBackendUpdateCudaGraph refuse, and a CUDA graph gets a plan by
//   capturing cudnnBackendExecute.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "cc/fakegpu/cudnn_backend.h"
#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;
using namespace jaxlake::fakegpu::cudnn;  // NOLINT: the backend's names

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

bool Cuda13() { return fg::Opts().cuda_major == 13; }

constexpr int kCudnnMajor = 9, kCudnnMinor = 19, kCudnnPatch = 0;

}  // namespace

// ---- library, handles and streams -------------------------------------------

LIB std::size_t cudnnGetVersion() {
  return kCudnnMajor * 10000 + kCudnnMinor * 100 + kCudnnPatch;
}
LIB std::size_t cudnnGetCudartVersion() { return Cuda13() ? 13000 : 12090; }
LIB std::size_t cudnnGetMaxDeviceVersion() { return 1200; }

// cuDNN 9's sub-libraries (graph, ops, cnn, adv) check that their versions
// agree; XLA calls these when it starts cuDNN. The fake is one library, so
// they always agree.
LIB int cudnnGraphVersionCheck() { return CUDNN_STATUS_SUCCESS; }
LIB int cudnnOpsVersionCheck() { return CUDNN_STATUS_SUCCESS; }
LIB int cudnnCnnVersionCheck() { return CUDNN_STATUS_SUCCESS; }
LIB int cudnnAdvVersionCheck() { return CUDNN_STATUS_SUCCESS; }

LIB int cudnnGetProperty(int type, int* value) {
  ENTER();
  if (value == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  *value = type == 0 ? kCudnnMajor : type == 1 ? kCudnnMinor : kCudnnPatch;
  return CUDNN_STATUS_SUCCESS;
}

LIB const char* cudnnGetErrorString(int status) { return StatusName(status); }

// The message of the calling thread's last error, then cleared.
LIB void cudnnGetLastErrorString(char* message, std::size_t n) {
  if (message == nullptr || n == 0) return;
  std::snprintf(message, n, "%s", last_error.c_str());
  last_error.clear();
}

LIB int cudnnCreate(void** handle) {
  ENTER();
  if (handle == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  auto* h = new Handle;
  std::lock_guard<std::mutex> lock(R().mu);
  R().handles.insert(h);
  *handle = h;
  return CUDNN_STATUS_SUCCESS;
}

LIB int cudnnDestroy(void* handle) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  auto* h = static_cast<Handle*>(handle);
  if (R().handles.erase(h) == 0)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnDestroy: not a cuDNN handle");
  delete h;
  return CUDNN_STATUS_SUCCESS;
}

LIB int cudnnSetStream(void* handle, void* stream) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  auto* h = static_cast<Handle*>(handle);
  if (R().handles.count(h) == 0)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnSetStream: not a cuDNN handle");
  h->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

LIB int cudnnGetStream(void* handle, void** stream) {
  ENTER();
  if (stream == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  std::lock_guard<std::mutex> lock(R().mu);
  auto* h = static_cast<Handle*>(handle);
  if (R().handles.count(h) == 0)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnGetStream: not a cuDNN handle");
  *stream = h->stream;
  return CUDNN_STATUS_SUCCESS;
}

// ---- the backend API --------------------------------------------------------

LIB int cudnnBackendCreateDescriptor(int type, void** descriptor) {
  ENTER();
  if (descriptor == nullptr) return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
  if (type < 0 || type > kDescLast)
    return Fail(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendCreateDescriptor: unknown " +
                                   Named(type));
  auto d = std::make_shared<Descriptor>();
  d->type = type;
  std::lock_guard<std::mutex> lock(R().mu);
  R().descriptors[d.get()] = d;
  *descriptor = d.get();
  return CUDNN_STATUS_SUCCESS;
}

LIB int cudnnBackendDestroyDescriptor(void* descriptor) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  if (R().descriptors.erase(static_cast<Descriptor*>(descriptor)) == 0)
    return Fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnBackendDestroyDescriptor: not a backend descriptor");
  return CUDNN_STATUS_SUCCESS;
}

LIB int cudnnBackendInitialize(void* descriptor) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  const Ref d = Find(descriptor);
  if (d == nullptr)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendInitialize: not a backend descriptor");
  const int type = d->type;
  *d = Descriptor();
  d->type = type;
  return CUDNN_STATUS_SUCCESS;
}

LIB int cudnnBackendSetAttribute(void* descriptor, int name, int type,
                                 std::int64_t count, const void* elements) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  const Ref d = Find(descriptor);
  if (d == nullptr)
    return Fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnBackendSetAttribute: not a backend descriptor");
  if (d->finalized)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: attribute " +
                               std::to_string(name) + " of a finalized " +
                               Named(d->type));
  const std::size_t size = ElementSize(type);
  if (size == 0 || count < 0 || (count > 0 && elements == nullptr))
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: attribute " +
                               std::to_string(name) + ": bad type " +
                               std::to_string(type) + " or count " +
                               std::to_string(count));
  Attribute a;
  a.type = type;
  a.count = count;
  a.bytes.resize(static_cast<std::size_t>(count) * size);
  if (count > 0) std::memcpy(a.bytes.data(), elements, a.bytes.size());
  if (type == kTypeBackendDescriptor) {
    for (std::int64_t i = 0; i < count; ++i) {
      void* p = static_cast<void* const*>(elements)[i];
      Ref r = Find(p);
      if (r == nullptr)
        return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendSetAttribute: element " +
                                   std::to_string(i) + " of attribute " +
                                   std::to_string(name) +
                                   " is not a backend descriptor");
      a.refs.push_back(std::move(r));
    }
  }
  d->attrs[name] = std::move(a);
  return CUDNN_STATUS_SUCCESS;
}

LIB int cudnnBackendGetAttribute(void* descriptor, int name, int type,
                                 std::int64_t requested, std::int64_t* count,
                                 void* elements) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  const Ref d = Find(descriptor);
  if (d == nullptr)
    return Fail(CUDNN_STATUS_BAD_PARAM,
                "cudnnBackendGetAttribute: not a backend descriptor");
  if (requested < 0)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: bad requested count " +
                               std::to_string(requested));
  if (elements == nullptr) requested = 0;  // a query of the count
  const Attribute* a = Get(*d, name);
  if (a == nullptr) {
    if (!d->finalized)
      return Fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "cudnnBackendGetAttribute: attribute " +
                                     std::to_string(name) + " of an "
                                     "unfinalized " + Named(d->type));
    fg::Unsupported("cudnn",
                    ("cudnnBackendGetAttribute(attribute " +
                     std::to_string(name) + ", " + Named(d->type) + ")")
                        .c_str(),
                    CUDNN_STATUS_BAD_PARAM);
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: attribute " +
                               std::to_string(name) + " of " +
                               Named(d->type) + " was not set");
  }
  if (a->type != type)
    return Fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "cudnnBackendGetAttribute: attribute " +
                                    std::to_string(name) + " has type " +
                                    std::to_string(a->type) + ", not " +
                                    std::to_string(type));
  if (count != nullptr) *count = a->count;
  const std::int64_t n = requested < a->count ? requested : a->count;
  if (type == kTypeBackendDescriptor) {
    for (std::int64_t i = 0; i < n; ++i) {
      const Ref dst = Find(static_cast<void**>(elements)[i]);
      if (dst == nullptr)
        return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendGetAttribute: element " +
                                   std::to_string(i) +
                                   " is not a backend descriptor");
      const Ref& src = a->refs[static_cast<std::size_t>(i)];
      if (dst->type != src->type)
        return Fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, "cudnnBackendGetAttribute: element " +
                                         std::to_string(i) + " is a " +
                                         Named(dst->type) + ", not a " +
                                         Named(src->type));
      if (dst != src) *dst = *src;
    }
  } else if (n > 0) {
    std::memcpy(elements, a->bytes.data(),
                static_cast<std::size_t>(n) * ElementSize(type));
  }
  return CUDNN_STATUS_SUCCESS;
}

LIB int cudnnBackendFinalize(void* descriptor) {
  ENTER();
  std::lock_guard<std::mutex> lock(R().mu);
  const Ref d = Find(descriptor);
  if (d == nullptr)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: not a backend descriptor");
  if (d->finalized)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendFinalize: already finalized");
  const int r = Finalize(d.get());
  if (r == CUDNN_STATUS_SUCCESS) d->finalized = true;
  return r;
}

LIB int cudnnBackendExecute(void* handle, void* plan, void* pack) {
  ENTER();
  fg::Stream* stream = nullptr;
  {
    std::lock_guard<std::mutex> lock(R().mu);
    auto* h = static_cast<Handle*>(handle);
    if (R().handles.count(h) == 0)
      return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: not a cuDNN handle");
    const Ref p = Find(plan), v = Find(pack);
    if (p == nullptr || p->type != kExecutionPlan || v == nullptr ||
        v->type != kVariantPack)
      return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: needs an execution plan "
                             "and a variant pack");
    if (!p->finalized || !v->finalized)
      return Fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "cudnnBackendExecute: the plan or the "
                                 "variant pack is not finalized");
    if (int r = CheckVariantPack(*p, *v); r != CUDNN_STATUS_SUCCESS) return r;
    stream = fg::StreamOf(h->stream, fg::CurrentDevice());
  }
  if (stream == nullptr)
    return Fail(CUDNN_STATUS_BAD_PARAM, "cudnnBackendExecute: the handle's stream is not "
                           "a stream");
  stream->Enqueue([] {});  // the plan's kernels, which do not run
  return CUDNN_STATUS_SUCCESS;
}

// The fake's engines carry no CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API
// note, so a plan is put in a CUDA graph by capturing cudnnBackendExecute,
// as cuDNN requires of such plans; the native calls refuse it.
LIB int cudnnBackendPopulateCudaGraph(void*, void*, void*, void*) {
  ENTER();
  return Fail(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API, "cudnnBackendPopulateCudaGraph: the plan's engine does "
                    "not support the native CUDA graph API (capture "
                    "cudnnBackendExecute instead)");
}

LIB int cudnnBackendUpdateCudaGraph(void*, void*, void*, void*) {
  ENTER();
  return Fail(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API, "cudnnBackendUpdateCudaGraph: the plan's engine does "
                    "not support the native CUDA graph API");
}
