// jaxlake: the host driver (memfd + mmap behind SimDriver's hooks).
//
// SimDriver checks every rule and keeps the books; the hooks here only make
// the operating system agree with it. They run with SimDriver's mutex held,
// so Fds needs no lock of its own.
//
//   reservation  an anonymous PROT_NONE MAP_NORESERVE mapping, over-allocated
//                by one granule and trimmed so that it starts aligned
//   handle       a memfd of the handle's size (pages are committed on touch)
//   map          mmap(MAP_SHARED|MAP_FIXED) of the memfd over the placeholder,
//                with no access
//   unmap        a fresh PROT_NONE placeholder over the range, so the
//                reservation stays whole
//   set_access   mprotect(PROT_READ|PROT_WRITE)
//
// The memfd is closed at release(); mappings still made from it keep its
// pages alive, and the kernel frees them with the last mapping, as CUDA does.
// Each live handle holds one file descriptor, and each mapping is one kernel
// memory area (bounded by RLIMIT_NOFILE and vm.max_map_count).
#include "cc/vmm/host_driver.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>

namespace jaxlake::vmm {
namespace {

// An owned file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// An owned range of address space, unmapped on destruction.
class UniqueRegion {
 public:
  UniqueRegion(std::uintptr_t start, std::size_t size)
      : start_(start), size_(size) {}
  UniqueRegion(UniqueRegion&& other) noexcept
      : start_(std::exchange(other.start_, 0)),
        size_(std::exchange(other.size_, 0)) {}
  UniqueRegion& operator=(UniqueRegion&&) = delete;
  UniqueRegion(const UniqueRegion&) = delete;
  UniqueRegion& operator=(const UniqueRegion&) = delete;
  ~UniqueRegion() {
    if (size_ != 0) ::munmap(reinterpret_cast<void*>(start_), size_);
  }

  // Unmaps now; on success the region is empty.
  bool Unmap() {
    if (size_ != 0 && ::munmap(reinterpret_cast<void*>(start_), size_) != 0)
      return false;
    size_ = 0;
    return true;
  }

 private:
  std::uintptr_t start_;
  std::size_t size_;
};

Status FromErrno(int err) {
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EFBIG:
    case EMFILE:
    case ENFILE:
      return Status::kOutOfMemory;
    default:
      return Status::kDriverError;
  }
}

void* Ptr(std::uintptr_t va) { return reinterpret_cast<void*>(va); }

}  // namespace

struct HostDriver::Fds {
  std::unordered_map<Handle, UniqueFd> fds;            // live handles
  std::map<std::uintptr_t, UniqueRegion> reservations;  // by aligned start
};

SimOptions HostDefaults() {
  SimOptions o;
  o.granularity = std::size_t{2} << 20;
  o.device_bytes = std::size_t{4} << 30;
  return o;
}

HostDriver::HostDriver(const SimOptions& options)
    : SimDriver(options), fds_(std::make_unique<Fds>()) {}

// Fds' destructor unmaps every reservation (and with it every mapping made
// inside one) and closes every memfd.
HostDriver::~HostDriver() = default;

Status HostDriver::os_reserve(std::size_t size, std::uintptr_t* va) {
  const std::size_t g = granularity();
  if (size > std::numeric_limits<std::size_t>::max() - g)
    return Status::kOutOfMemory;
  const std::size_t padded = size + g;
  void* p = ::mmap(nullptr, padded, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return FromErrno(errno);
  const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t start = (base + (g - 1)) & ~(std::uintptr_t{g} - 1);
  const std::size_t head = start - base;
  const std::size_t tail = padded - head - size;
  // Trimming whole pages of a fresh mapping does not fail; if it did, the
  // untrimmed pages would only be leaked address space.
  if (head != 0) ::munmap(p, head);
  if (tail != 0) ::munmap(Ptr(start + size), tail);
  fds_->reservations.emplace(start, UniqueRegion(start, size));
  *va = start;
  return Status::kOk;
}

Status HostDriver::os_address_free(std::uintptr_t va, std::size_t) {
  auto it = fds_->reservations.find(va);
  if (it == fds_->reservations.end()) return Status::kInvalidValue;
  if (!it->second.Unmap()) return FromErrno(errno);
  fds_->reservations.erase(it);
  return Status::kOk;
}

Status HostDriver::os_create(std::size_t size, Handle handle) {
  UniqueFd fd(::memfd_create("jaxlake", MFD_CLOEXEC));
  if (fd.get() < 0) return FromErrno(errno);
  if (size > static_cast<std::size_t>(std::numeric_limits<off_t>::max()))
    return Status::kOutOfMemory;
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    return FromErrno(errno);
  fds_->fds[handle] = std::move(fd);
  return Status::kOk;
}

void HostDriver::os_release_handle(Handle handle) { fds_->fds.erase(handle); }

void HostDriver::os_release_memory(Handle handle) {
  // Normally closed at release already; the kernel frees the pages with the
  // last mapping.
  fds_->fds.erase(handle);
}

Status HostDriver::os_map(std::uintptr_t va, std::size_t size,
                          std::size_t offset, Handle handle) {
  auto it = fds_->fds.find(handle);
  if (it == fds_->fds.end()) return Status::kInvalidValue;
  void* p = ::mmap(Ptr(va), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                   it->second.get(), static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    const int err = errno;
    // A failed MAP_FIXED may have removed the placeholder: put it back.
    ::mmap(Ptr(va), size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return FromErrno(err);
  }
  return Status::kOk;
}

Status HostDriver::os_unmap(std::uintptr_t va, std::size_t size) {
  void* p = ::mmap(Ptr(va), size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                   -1, 0);
  return p == MAP_FAILED ? FromErrno(errno) : Status::kOk;
}

Status HostDriver::os_set_access(std::uintptr_t va, std::size_t size) {
  if (::mprotect(Ptr(va), size, PROT_READ | PROT_WRITE) != 0)
    return FromErrno(errno);
  return Status::kOk;
}

}  // namespace jaxlake::vmm
