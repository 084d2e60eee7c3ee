// jaxlake shim: the slow path of the forwarding trampolines (see
// trampolines.h) and the filling of their table.
#include "cc/shim/trampolines.h"

#include <dlfcn.h>

#include "cc/shim/loader.h"
#include "cc/vmm/cuda_types.h"

// jaxlake_shim_lazy: entered by a trampoline's jump, with the caller's
// arguments in place and the slot number in %r11. Saves every register that
// can carry an argument (the six integer ones, %rax for variadic calls and
// %xmm0-7), asks jaxlake_shim_resolve for the slot's function, restores them
// and jumps there, so the callee sees exactly the original call. On entry
// %rsp is 8 mod 16; after %rbp, eight pushes and 128 bytes it is 0 mod 16 at
// the call, as the ABI requires.
asm(R"(
  .text
  .globl jaxlake_shim_lazy
  .hidden jaxlake_shim_lazy
  .type jaxlake_shim_lazy, @function
  .p2align 4
jaxlake_shim_lazy:
  endbr64
  pushq %rbp
  movq %rsp, %rbp
  pushq %rdi
  pushq %rsi
  pushq %rdx
  pushq %rcx
  pushq %r8
  pushq %r9
  pushq %rax
  pushq %r11
  subq $128, %rsp
  movdqu %xmm0, 0(%rsp)
  movdqu %xmm1, 16(%rsp)
  movdqu %xmm2, 32(%rsp)
  movdqu %xmm3, 48(%rsp)
  movdqu %xmm4, 64(%rsp)
  movdqu %xmm5, 80(%rsp)
  movdqu %xmm6, 96(%rsp)
  movdqu %xmm7, 112(%rsp)
  movl %r11d, %edi
  call jaxlake_shim_resolve
  movq %rax, %r10
  movdqu 0(%rsp), %xmm0
  movdqu 16(%rsp), %xmm1
  movdqu 32(%rsp), %xmm2
  movdqu 48(%rsp), %xmm3
  movdqu 64(%rsp), %xmm4
  movdqu 80(%rsp), %xmm5
  movdqu 96(%rsp), %xmm6
  movdqu 112(%rsp), %xmm7
  addq $128, %rsp
  popq %r11
  popq %rax
  popq %r9
  popq %r8
  popq %rcx
  popq %rdx
  popq %rsi
  popq %rdi
  popq %rbp
  jmpq *%r10
  .size jaxlake_shim_lazy, .-jaxlake_shim_lazy
)");

extern "C" int jaxlake_shim_missing() {
  return jaxlake::cuda::CUDA_ERROR_NOT_FOUND;
}

// Called only from the assembly above, which link-time optimisation does
// not see: `used` keeps it.
extern "C" __attribute__((used)) void* jaxlake_shim_resolve(unsigned slot) {
  try {
    jaxlake::shim::Real();  // loads the real driver (once), fills the table
  } catch (...) {
    return reinterpret_cast<void*>(&jaxlake_shim_missing);
  }
  if (slot >= jaxlake::shim::kNumForwarded)
    return reinterpret_cast<void*>(&jaxlake_shim_missing);
  return __atomic_load_n(&jaxlake_shim_table[slot], __ATOMIC_ACQUIRE);
}

namespace jaxlake::shim {

std::size_t FillForwardingTable(void* real) {
  std::size_t found = 0;
  for (std::size_t i = 0; i < kNumForwarded; ++i) {
    void* fn = real != nullptr ? ::dlsym(real, kForwardedNames[i]) : nullptr;
    if (fn != nullptr) {
      ++found;
    } else {
      fn = reinterpret_cast<void*>(&jaxlake_shim_missing);
    }
    __atomic_store_n(&jaxlake_shim_table[i], fn, __ATOMIC_RELEASE);
  }
  return found;
}

}  // namespace jaxlake::shim
