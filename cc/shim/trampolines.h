// jaxlake shim: forwarding of the driver entry points it does not hook.
//
// Each forwarded name is an exported assembly trampoline (generated at build
// time from cuda_symbols.txt by gen_trampolines.cmake) that jumps through
// one slot of jaxlake_shim_table. Until the real driver is loaded every slot
// points at jaxlake_shim_lazy, which calls jaxlake_shim_resolve(slot) with
// the caller's arguments saved, then continues to the function it returns.
// Loading fills each slot with the real driver's function of that name, or
// with jaxlake_shim_missing when the real driver lacks it (or no real
// driver was found): that stub returns CUDA_ERROR_NOT_FOUND. So a call
// through the shim never jumps to a null pointer, whatever the order in
// which libraries are initialised.
#ifndef JAXLAKE_SHIM_TRAMPOLINES_H_
#define JAXLAKE_SHIM_TRAMPOLINES_H_

#include <cstddef>

#if !defined(__x86_64__) || !defined(__linux__)
#error "the jaxlake shim supports x86-64 Linux only"
#endif

#define JAXLAKE_SHIM_HIDDEN __attribute__((visibility("hidden")))

namespace jaxlake::shim {

// The forwarded names in slot order, and their number (generated).
extern const char* const kForwardedNames[];
extern const std::size_t kNumForwarded;

// Points every slot at the real driver's function of its name, or at
// jaxlake_shim_missing. `real` is the real driver's dlopen handle, or
// nullptr when there is none. Returns the number of names found.
std::size_t FillForwardingTable(void* real);

}  // namespace jaxlake::shim

extern "C" {
// kNumForwarded slots (defined in the generated assembly).
JAXLAKE_SHIM_HIDDEN extern void* jaxlake_shim_table[];
// Makes sure the real driver is loaded; returns the function for `slot`.
JAXLAKE_SHIM_HIDDEN void* jaxlake_shim_resolve(unsigned slot);
// The stand-in for a name the real driver lacks: CUDA_ERROR_NOT_FOUND.
JAXLAKE_SHIM_HIDDEN int jaxlake_shim_missing();
}

#endif  // JAXLAKE_SHIM_TRAMPOLINES_H_
