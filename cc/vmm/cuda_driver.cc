// jaxlake: the CUDA driver backend (see cuda_driver.h).
#include "cc/vmm/cuda_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

namespace jaxlake::vmm {

using cuda::CUcontext;
using cuda::CUresult;

// ---- the library ------------------------------------------------------------

CudaLibrary::CudaLibrary(void* handle, std::string path)
    : handle_(handle), path_(std::move(path)) {}

CudaLibrary::~CudaLibrary() {
  if (handle_ != nullptr) ::dlclose(handle_);
}

std::shared_ptr<CudaLibrary> CudaLibrary::Open(const std::string& path,
                                               std::string* error) {
  std::string why;
  std::shared_ptr<CudaLibrary> lib;
  if (path.empty() || path[0] != '/') {
    why = "the CUDA driver path '" + path + "' is not absolute";
  } else if (void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    lib.reset(new CudaLibrary(handle, path));
    CudaApi& api = lib->api_;
#define JAXLAKE_X(member, symbol, params)                            \
  if (why.empty()) {                                                 \
    api.member = reinterpret_cast<decltype(api.member)>(             \
        ::dlsym(handle, symbol));                                    \
    if (api.member == nullptr)                                       \
      why = "the CUDA driver " + path + " has no " symbol            \
            " (a driver older than CUDA 10.2 lacks the VMM API)";    \
  }
    JAXLAKE_CUDA_API(JAXLAKE_X)
#undef JAXLAKE_X
    api.GetErrorName = reinterpret_cast<decltype(api.GetErrorName)>(
        ::dlsym(handle, "cuGetErrorName"));
    if (!why.empty()) lib.reset();
  } else {
    const char* msg = ::dlerror();
    why = "cannot load the CUDA driver " + path + ": " +
          (msg != nullptr ? msg : "unknown error");
  }
  if (error != nullptr) *error = why;
  return lib;
}

std::string CudaLibrary::ErrorName(CUresult r) const {
  const char* name = nullptr;
  if (api_.GetErrorName != nullptr && api_.GetErrorName(r, &name) == 0 &&
      name != nullptr) {
    return std::string(name) + " (" + std::to_string(r) + ")";
  }
  return "CUresult " + std::to_string(r);
}

// ---- RAII helpers -----------------------------------------------------------

// The device's primary context, retained for the driver's lifetime.
class CudaDriver::PrimaryContext {
 public:
  static std::unique_ptr<PrimaryContext> Retain(const CudaApi& api,
                                                cuda::CUdevice device,
                                                CUresult* result) {
    CUcontext ctx = nullptr;
    *result = api.PrimaryCtxRetain(&ctx, device);
    if (*result != cuda::CUDA_SUCCESS) return nullptr;
    return std::unique_ptr<PrimaryContext>(
        new PrimaryContext(api, device, ctx));
  }
  ~PrimaryContext() { api_.PrimaryCtxRelease(device_); }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  CUcontext get() const { return ctx_; }

 private:
  PrimaryContext(const CudaApi& api, cuda::CUdevice device, CUcontext ctx)
      : api_(api), device_(device), ctx_(ctx) {}
  const CudaApi& api_;
  const cuda::CUdevice device_;
  const CUcontext ctx_;
};

// Makes `want` the calling thread's current context for one scope, when it
// is not already, and restores the previous one (possibly none) after.
class CudaDriver::ScopedCurrent {
 public:
  ScopedCurrent(const CudaApi& api, CUcontext want) : api_(api) {
    CUcontext current = nullptr;
    if (api_.CtxGetCurrent(&current) == cuda::CUDA_SUCCESS &&
        current == want)
      return;
    if (api_.CtxSetCurrent(want) == cuda::CUDA_SUCCESS) {
      previous_ = current;
      switched_ = true;
    }
  }
  ~ScopedCurrent() {
    if (switched_) api_.CtxSetCurrent(previous_);
  }
  ScopedCurrent(const ScopedCurrent&) = delete;
  ScopedCurrent& operator=(const ScopedCurrent&) = delete;

 private:
  const CudaApi& api_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

// What the driver handed out and was not given back yet.
struct CudaDriver::Live {
  std::mutex mu;
  std::unordered_set<Handle> handles;
  std::map<std::uintptr_t, std::size_t> reservations;  // start -> size
  std::map<std::uintptr_t, std::size_t> mappings;      // start -> size
  std::unordered_set<Event> events;
  std::atomic<CUresult> last_error{cuda::CUDA_SUCCESS};
};

namespace {

cuda::CUmemAllocationProp DeviceProp(int ordinal) {
  cuda::CUmemAllocationProp prop{};
  prop.type = cuda::CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = cuda::CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = cuda::CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  return prop;
}

constexpr int kVmmAttribute =
    cuda::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;

cuda::CUdeviceptr Ptr(std::uintptr_t va) {
  return static_cast<cuda::CUdeviceptr>(va);
}
cuda::CUevent EventOf(Event e) { return reinterpret_cast<cuda::CUevent>(e); }

}  // namespace

// ---- creation ---------------------------------------------------------------

std::unique_ptr<CudaDriver> CudaDriver::Create(
    std::shared_ptr<CudaLibrary> lib, int ordinal, std::string* reason,
    const CudaDriverOptions& options) {
  std::string why;
  std::unique_ptr<CudaDriver> driver;
  auto fail = [&](const std::string& what, CUresult r) {
    why = what + " failed: " + lib->ErrorName(r);
  };
  if (lib == nullptr) {
    why = "no CUDA driver library";
  } else {
    const CudaApi& api = lib->api();
    int version = 0, count = 0, vmm = 0;
    cuda::CUdevice device = 0;
    std::size_t gran = 0, total = 0;
    CUresult r;
    if ((r = api.Init(0)) != cuda::CUDA_SUCCESS) {
      fail("cuInit", r);
    } else if ((r = api.DriverGetVersion(&version)) != cuda::CUDA_SUCCESS) {
      fail("cuDriverGetVersion", r);
    } else if (version < cuda::kVmmDriverVersion) {
      why = "the CUDA driver supports API version " +
            std::to_string(version / 1000) + "." +
            std::to_string(version % 1000 / 10) +
            "; virtual memory management needs 10.2 or newer";
    } else if ((r = api.DeviceGetCount(&count)) != cuda::CUDA_SUCCESS) {
      fail("cuDeviceGetCount", r);
    } else if (ordinal < 0 || ordinal >= count) {
      why = "device " + std::to_string(ordinal) + " does not exist (" +
            std::to_string(count) + " devices)";
    } else if ((r = api.DeviceGet(&device, ordinal)) != cuda::CUDA_SUCCESS) {
      fail("cuDeviceGet(" + std::to_string(ordinal) + ")", r);
    } else if ((r = api.DeviceGetAttribute(&vmm, kVmmAttribute, device)) !=
               cuda::CUDA_SUCCESS) {
      fail("cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", r);
    } else if (vmm == 0) {
      why = "device " + std::to_string(ordinal) +
            " does not support virtual memory management";
    } else if ((r = api.DeviceTotalMem(&total, device)) !=
               cuda::CUDA_SUCCESS) {
      fail("cuDeviceTotalMem", r);
    } else {
      std::unique_ptr<PrimaryContext> ctx =
          PrimaryContext::Retain(api, device, &r);
      if (ctx == nullptr) {
        fail("cuDevicePrimaryCtxRetain", r);
      } else {
        const cuda::CUmemAllocationProp prop = DeviceProp(ordinal);
        {
          ScopedCurrent current(api, ctx->get());
          r = api.MemGetAllocationGranularity(
              &gran, &prop, cuda::CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        }
        if (r != cuda::CUDA_SUCCESS) {
          fail("cuMemGetAllocationGranularity", r);
        } else if (gran == 0 || (gran & (gran - 1)) != 0) {
          why = "device " + std::to_string(ordinal) +
                " reports an allocation granularity of " +
                std::to_string(gran) + " bytes, not a power of two";
        } else {
          std::vector<int> peers;
          for (int p = 0; options.peer_access && p < count; ++p) {
            cuda::CUdevice peer = 0;
            int can = 0;
            if (p != ordinal && api.DeviceGet(&peer, p) == cuda::CUDA_SUCCESS &&
                api.DeviceCanAccessPeer(&can, peer, device) ==
                    cuda::CUDA_SUCCESS &&
                can == 1)
              peers.push_back(p);
          }
          driver.reset(new CudaDriver(std::move(lib), ordinal, device,
                                      version, std::move(ctx), gran, total,
                                      std::move(peers)));
        }
      }
    }
  }
  if (reason != nullptr) *reason = why;
  return driver;
}

CudaDriver::CudaDriver(std::shared_ptr<CudaLibrary> lib, int ordinal,
                       cuda::CUdevice device, int driver_version,
                       std::unique_ptr<PrimaryContext> context,
                       std::size_t granularity, std::size_t total_memory,
                       std::vector<int> peers)
    : lib_(std::move(lib)),
      api_(lib_->api()),
      ordinal_(ordinal),
      device_(device),
      driver_version_(driver_version),
      context_(std::move(context)),
      granularity_(granularity),
      total_memory_(total_memory),
      access_count_(1 + peers.size()),
      live_(std::make_unique<Live>()) {
  peers.insert(peers.begin(), ordinal);
  for (int d : peers) {
    cuda::CUmemAccessDesc desc{};
    desc.location.type = cuda::CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = d;
    desc.flags = cuda::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access_.push_back(desc);
  }
}

// Gives back whatever the caller left behind, in the order the driver
// requires (mappings before their handles and reservations), then releases
// the primary context (context_) and the library (lib_) as members go.
CudaDriver::~CudaDriver() {
  Live& l = *live_;
  std::lock_guard<std::mutex> lock(l.mu);
  ScopedCurrent current(api_, context_->get());
  for (const auto& [va, size] : l.mappings) api_.MemUnmap(Ptr(va), size);
  for (Handle h : l.handles) api_.MemRelease(h);
  for (const auto& [va, size] : l.reservations)
    api_.MemAddressFree(Ptr(va), size);
  for (Event e : l.events) api_.EventDestroy(EventOf(e));
}

cuda::CUresult CudaDriver::last_error() const {
  return live_->last_error.load(std::memory_order_relaxed);
}

std::vector<int> CudaDriver::access_devices() const {
  std::vector<int> out;
  const std::size_t n = access_count_.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < n; ++i) out.push_back(access_[i].location.id);
  return out;
}

bool CudaDriver::owns_address(std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(live_->mu);
  auto it = live_->reservations.upper_bound(address);
  if (it == live_->reservations.begin()) return false;
  --it;
  return address - it->first < it->second;
}

Status CudaDriver::Check(CUresult r) {
  if (r == cuda::CUDA_SUCCESS) return Status::kOk;
  if (r != cuda::CUDA_ERROR_NOT_READY)
    live_->last_error.store(r, std::memory_order_relaxed);
  switch (r) {
    case cuda::CUDA_ERROR_OUT_OF_MEMORY:
      return Status::kOutOfMemory;
    case cuda::CUDA_ERROR_INVALID_VALUE:
    case cuda::CUDA_ERROR_INVALID_HANDLE:
      return Status::kInvalidValue;
    case cuda::CUDA_ERROR_NOT_READY:
      return Status::kNotReady;
    case cuda::CUDA_ERROR_NOT_SUPPORTED:
      return Status::kNotSupported;
    default:
      return Status::kDriverError;
  }
}

// ---- address space ----------------------------------------------------------

Status CudaDriver::do_reserve(std::size_t size, std::uintptr_t* va) {
  if (va == nullptr || size == 0 || size % granularity_ != 0)
    return Status::kInvalidValue;
  cuda::CUdeviceptr ptr = 0;
  Status s;
  {
    ScopedCurrent current(api_, context_->get());
    s = Check(api_.MemAddressReserve(&ptr, size, granularity_, 0, 0));
  }
  if (s != Status::kOk) return s;
  *va = static_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(live_->mu);
  live_->reservations.emplace(*va, size);
  return Status::kOk;
}

Status CudaDriver::do_address_free(std::uintptr_t va, std::size_t size) {
  Status s;
  {
    ScopedCurrent current(api_, context_->get());
    s = Check(api_.MemAddressFree(Ptr(va), size));
  }
  if (s != Status::kOk) return s;
  std::lock_guard<std::mutex> lock(live_->mu);
  live_->reservations.erase(va);
  return Status::kOk;
}

// ---- physical memory --------------------------------------------------------

Status CudaDriver::do_create(std::size_t size, Handle* handle) {
  if (handle == nullptr || size == 0 || size % granularity_ != 0)
    return Status::kInvalidValue;
  const cuda::CUmemAllocationProp prop = DeviceProp(ordinal_);
  cuda::CUmemGenericAllocationHandle h = 0;
  Status s;
  {
    ScopedCurrent current(api_, context_->get());
    s = Check(api_.MemCreate(&h, size, &prop, 0));
  }
  if (s != Status::kOk) return s;
  *handle = h;
  std::lock_guard<std::mutex> lock(live_->mu);
  live_->handles.insert(h);
  return Status::kOk;
}

Status CudaDriver::do_release(Handle handle) {
  Status s;
  {
    ScopedCurrent current(api_, context_->get());
    s = Check(api_.MemRelease(handle));
  }
  if (s != Status::kOk) return s;
  std::lock_guard<std::mutex> lock(live_->mu);
  live_->handles.erase(handle);
  return Status::kOk;
}

// ---- mappings ---------------------------------------------------------------

Status CudaDriver::do_map(std::uintptr_t va, std::size_t size,
                          std::size_t offset, Handle handle) {
  Status s;
  {
    ScopedCurrent current(api_, context_->get());
    s = Check(api_.MemMap(Ptr(va), size, offset, handle, 0));
  }
  if (s != Status::kOk) return s;
  std::lock_guard<std::mutex> lock(live_->mu);
  live_->mappings.emplace(va, size);
  return Status::kOk;
}

Status CudaDriver::do_unmap(std::uintptr_t va, std::size_t size) {
  Status s;
  {
    ScopedCurrent current(api_, context_->get());
    s = Check(api_.MemUnmap(Ptr(va), size));
  }
  if (s != Status::kOk) return s;
  // One unmap may cover a run of whole mappings.
  std::lock_guard<std::mutex> lock(live_->mu);
  auto& m = live_->mappings;
  m.erase(m.lower_bound(va), m.lower_bound(va + size));
  return Status::kOk;
}

Status CudaDriver::do_set_access(std::uintptr_t va, std::size_t size) {
  ScopedCurrent current(api_, context_->get());
  const std::size_t n = access_count_.load(std::memory_order_relaxed);
  CUresult r = api_.MemSetAccess(Ptr(va), size, access_.data(), n);
  if (r != cuda::CUDA_SUCCESS && n > 1 &&
      api_.MemSetAccess(Ptr(va), size, access_.data(), 1) ==
          cuda::CUDA_SUCCESS) {
    // A peer was refused: this device alone from now on.
    access_count_.store(1, std::memory_order_relaxed);
    r = cuda::CUDA_SUCCESS;
  }
  return Check(r);
}

// ---- events -----------------------------------------------------------------

Status CudaDriver::do_event_create(Event* event) {
  if (event == nullptr) return Status::kInvalidValue;
  cuda::CUevent e = nullptr;
  Status s;
  {
    ScopedCurrent current(api_, context_->get());
    s = Check(api_.EventCreate(&e, cuda::CU_EVENT_DISABLE_TIMING));
  }
  if (s != Status::kOk) return s;
  *event = reinterpret_cast<Event>(e);
  std::lock_guard<std::mutex> lock(live_->mu);
  live_->events.insert(*event);
  return Status::kOk;
}

Status CudaDriver::do_event_destroy(Event event) {
  Status s;
  {
    ScopedCurrent current(api_, context_->get());
    s = Check(api_.EventDestroy(EventOf(event)));
  }
  if (s != Status::kOk) return s;
  std::lock_guard<std::mutex> lock(live_->mu);
  live_->events.erase(event);
  return Status::kOk;
}

Status CudaDriver::do_event_record(Event event, Stream stream) {
  ScopedCurrent current(api_, context_->get());
  return Check(api_.EventRecord(EventOf(event),
                                reinterpret_cast<cuda::CUstream>(stream)));
}

Status CudaDriver::do_event_query(Event event) {
  ScopedCurrent current(api_, context_->get());
  return Check(api_.EventQuery(EventOf(event)));
}

Status CudaDriver::do_event_synchronize(Event event) {
  ScopedCurrent current(api_, context_->get());
  return Check(api_.EventSynchronize(EventOf(event)));
}

// ---- convenience ------------------------------------------------------------

std::unique_ptr<CudaDriver> MakeCudaDriver(const std::string& libcuda_path,
                                           int ordinal, std::string* reason,
                                           const CudaDriverOptions& options) {
  std::shared_ptr<CudaLibrary> lib = CudaLibrary::Open(libcuda_path, reason);
  if (lib == nullptr) return nullptr;
  return CudaDriver::Create(std::move(lib), ordinal, reason, options);
}

}  // namespace jaxlake::vmm
