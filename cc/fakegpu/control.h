/* The fake GPU's control API: what a test of a program over the fake
 * (libjaxlake_fakegpu.so) may ask or set beyond NVIDIA's public APIs. None
 * of it is a CUDA name; a program that only uses CUDA never sees it.
 *
 * The rest of the fake's setup is its options, environment variables read
 * once, at the first call (cc/fakegpu/README.md): the device count, model,
 * memory and driver version, devices without virtual memory management
 * (JAXLAKE_FAKEGPU_NO_VMM) and fault injection (JAXLAKE_FAKEGPU_FAIL). A
 * test sets those before it loads the library, then drives the fake
 * through its CUDA entry points and reads or holds it through these. Look
 * them up with dlsym() in the loaded library (the shim's tests load it as
 * the real driver, by path) or call them through ctypes.
 */
#ifndef JAXLAKE_FAKEGPU_CONTROL_H_
#define JAXLAKE_FAKEGPU_CONTROL_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Calls of the entry point `name` (any library's) so far, failed ones and
 * those fault injection failed included. */
unsigned long long jaxlake_fakegpu_calls(const char* name);

/* Calls refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED by the capture
 * rules so far (cc/fakegpu/README.md, "CUDA graphs"). */
unsigned long long jaxlake_fakegpu_capture_refusals(void);

/* Kernels launched so far (none of them ran), and the eleven arguments of
 * the last cuLaunchKernel call as integers, in order. */
unsigned long long jaxlake_fakegpu_launches(void);
void jaxlake_fakegpu_last_launch(unsigned long long out[11]);

/* Per device (0 for an ordinal out of range; -1 for the references):
 * device bytes in use (VMM handles, cuMemAlloc and the pool), bytes of
 * cuMemCreate handles not released, bytes of the driver's own
 * stream-ordered pool in use, and references to the primary context. */
unsigned long long jaxlake_fakegpu_used(int device);
unsigned long long jaxlake_fakegpu_created_bytes(int device);
unsigned long long jaxlake_fakegpu_pool_bytes(int device);
int jaxlake_fakegpu_primary_refs(int device);

/* The devices a VMM mapping holding `address` was granted access to by
 * cuMemSetAccess, one bit per ordinal; 0 when no mapping holds it. */
unsigned long long jaxlake_fakegpu_access(unsigned long long address);

/* The VMM books, all devices together: "reserved" (address space),
 * "mapped", "physical" (bytes of handles whose memory is alive) and
 * "handles", and the live "events"; 0 for another name. */
unsigned long long jaxlake_fakegpu_vmm(const char* figure);
/* 1 when every byte of [address, address + size) is mapped with access. */
int jaxlake_fakegpu_accessible(unsigned long long address,
                               unsigned long long size);

/* Holds a stream (null: the calling thread's current device's default
 * stream): work enqueued on it from now on, event records included, waits
 * until the stream is released, as work behind a long kernel would.
 * Release ends every hold of the stream. 0, or -1 for an unknown stream. */
int jaxlake_fakegpu_hold_stream(void* stream);
int jaxlake_fakegpu_release_stream(void* stream);

/* Waits until the work enqueued so far on every stream of `device` (-1:
 * of every device) has run, held streams aside, as cuCtxSynchronize
 * would, but with no current context and no capture rules. */
void jaxlake_fakegpu_synchronize(int device);

/* Fault injection armed from inside the program (the schedule of
 * JAXLAKE_FAKEGPU_FAIL): the `nth` call of `name` from now on (1: the next)
 * fails with `code` (nonzero). 0, or -1 for a bad argument. Defined in
 * state.cc. */
int jaxlake_fakegpu_fail_call(const char* name, unsigned long long nth,
                              int code);

/* With shared device memory (JAXLAKE_FAKEGPU_SHARED): each process's
 * bytes on `device`, up to `max` of them in pids and used; returns the
 * number of processes with a slot, or -1 when the memory is not shared.
 * Defined in driver.cc. */
int jaxlake_fakegpu_shared_usage(int device, int* pids,
                                 unsigned long long* used, int max);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* JAXLAKE_FAKEGPU_CONTROL_H_ */
