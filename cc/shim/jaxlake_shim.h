/* jaxlake shim: the C API of jaxlake/_lib/libcuda.so.1, for Python (ctypes).
 *
 * The shim is a stand-in for the CUDA driver library: loaded (RTLD_GLOBAL)
 * before anything opens libcuda.so.1, it is what later dlopen("libcuda.so.1")
 * calls return. It forwards every driver entry point to the real driver and
 * serves cuMemAllocFromPoolAsync/cuMemFreeAsync on the devices' default pools
 * from one jaxlake lake per device. See cc/shim/README.md.
 *
 * Loading the shim does nothing else: the real driver is found, and the
 * JAXLAKE_* options are read, at the first call into the shim, be it a
 * driver entry point or a function below. So after loading it, call
 * jaxlake_shim_active() (and jaxlake_shim_reason()) to find out whether a
 * real driver was found; if not, the shim can still be closed again before
 * anything else opened libcuda.so.1.
 *
 * Strings come back through caller buffers, snprintf-style: a function
 * writes at most `size` bytes including the terminating NUL (nothing when
 * `size` is 0 or `buf` is NULL) and returns the length of the whole string
 * without the NUL. Call it with (NULL, 0) for the length, or retry with a
 * larger buffer while the result is >= size (figures may grow between
 * calls). Every function may be called from any thread at any time; none
 * blocks for long.
 */
#ifndef JAXLAKE_SHIM_JAXLAKE_SHIM_H_
#define JAXLAKE_SHIM_JAXLAKE_SHIM_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JAXLAKE_SHIM_EXPORT_API __attribute__((visibility("default")))

/* The version of this API; raised when a function changes or goes. */
#define JAXLAKE_SHIM_API_VERSION 1

/* JAXLAKE_SHIM_API_VERSION of the loaded shim. Its presence also tells a
 * library apart from the real driver. */
JAXLAKE_SHIM_EXPORT_API int jaxlake_shim_api_version(void);

/* The jaxlake version the shim was built from (a static string). */
JAXLAKE_SHIM_EXPORT_API const char* jaxlake_shim_version(void);

/* 1 when the hooks serve allocations: a real driver was loaded, the
 * JAXLAKE_* options are valid and JAXLAKE_SHIM_HOOKS is not 0. Else 0, and
 * every call goes to the real driver. */
JAXLAKE_SHIM_EXPORT_API int jaxlake_shim_active(void);

/* Why the shim is inactive, and why any device has no lake (its
 * allocations then go to the real driver); "" when there is nothing to say. */
JAXLAKE_SHIM_EXPORT_API size_t jaxlake_shim_reason(char* buf, size_t size);

/* Makes the shim forward every new request to the real driver from now on,
 * with `reason` as jaxlake_shim_reason() (jaxlake.configure() calls it when
 * it finds the lake cannot be active, so that the loaded shim changes
 * nothing). Lakes that exist keep taking back their own addresses. */
JAXLAKE_SHIM_EXPORT_API void jaxlake_shim_disable(const char* reason);

/* Number of lakes (devices that have served an allocation). */
JAXLAKE_SHIM_EXPORT_API int jaxlake_shim_num_lakes(void);

/* Writes the ordinals of the devices with a lake, at most `max` of them, in
 * increasing order. Returns how many lakes there are. */
JAXLAKE_SHIM_EXPORT_API int jaxlake_shim_lake_devices(int* out, int max);

/* The lake of `device`, made now if it has none yet (as the first request
 * on its default pool would make it; jax.Device.memory_stats() under the
 * lake asks for it). Returns 1 when the device has a lake, 0 when it
 * cannot have one (the shim is inactive, or the device was refused: see
 * jaxlake_shim_reason). Needs an initialised driver. */
JAXLAKE_SHIM_EXPORT_API int jaxlake_shim_open_lake(int device);

/* The report JAXLAKE_EXIT_REPORT=1 prints on stderr at process exit (a line
 * naming the process, then per device: allocations served, forwarded and
 * captured, peak in use, peak reserved, U, stitches), as it stands now; ""
 * when no pool request reached the shim. Size as jaxlake_shim_reason(). */
JAXLAKE_SHIM_EXPORT_API size_t jaxlake_shim_exit_report(char* buf,
                                                        size_t size);

/* Statistics of the lake of `device` as a JSON object:
 *   {"device": 0, "capacity": B, "granularity": B, "total_memory": B,
 *    "free": {"bytes": B, "largest_block": B},
 *    "allocations": {"served": N, "forwarded": N, "captured": N},
 *    "gauges": {"bytes_in_use": {"current": N, "peak": N}, ...},
 *    "counters": {"allocs": N, ...},
 *    "driver_calls": {"reserve": N, ...}}
 * with every gauge, counter and driver call of cc/stats/stats.h and
 * cc/vmm/driver.h. "free": the free physical bytes the lake holds, and its
 * largest run of adjacent free chunks; "allocations": the device's default
 * pool requests served by the lake, forwarded to the driver, and of those
 * made under stream capture. Returns -1 (and writes nothing) when the
 * device has no lake. */
JAXLAKE_SHIM_EXPORT_API long long jaxlake_shim_stats_json(int device,
                                                          char* buf,
                                                          size_t size);

/* Call counts of the hooked entry points as a JSON object:
 *   {"cuMemAllocFromPoolAsync": {"calls": N, "served": N, "forwarded": N,
 *    "failed": N, "captured": N, "forwarded_bytes": N}, ...}
 * served: answered by the shim (a lake, or a rewritten cuGetProcAddress
 * answer); forwarded: passed to the real driver; failed: returned an error;
 * captured: allocations and frees made under stream capture (forwarded, or
 * refused for a lake address); forwarded_bytes: device bytes of the
 * successful forwarded allocations (a running total; 0 for the entry
 * points that allocate nothing). */
JAXLAKE_SHIM_EXPORT_API size_t jaxlake_shim_hooks_json(char* buf,
                                                       size_t size);

/* Everything about the shim as a JSON object: api_version, version, active,
 * reason, real_libcuda (path), self (path), forwarded_names (exported
 * names forwarded), forwarded_found (of those, found in the real driver),
 * lakes (device ordinals), options (the JAXLAKE_* values in force),
 * outside_pool ({"current": N, "peak": N, "allocations": N}: device bytes
 * the program took outside the lakes through the shim, the peak since the
 * last trace start, see README.md) and trace ({"active": bool, "path":
 * str}). */
JAXLAKE_SHIM_EXPORT_API size_t jaxlake_shim_status_json(char* buf,
                                                        size_t size);

/* Releases the cached memory of the lake of `device` (cached stitched
 * ranges, free segments whose last use is complete), or of every lake when
 * `device` is -1. Returns the physical bytes released, or -1 when the
 * device has no lake. */
JAXLAKE_SHIM_EXPORT_API long long jaxlake_shim_empty_cache(int device);

/* Checks the invariants of the lake of `device` (every lake for -1): their
 * problems, one line each ("device N: ..."), or "" when there are none;
 * the size in the style of jaxlake_shim_reason(). */
JAXLAKE_SHIM_EXPORT_API size_t jaxlake_shim_check(int device, char* buf,
                                                  size_t size);

/* Starts writing the allocation trace (JSON lines, docs/traces.md, source
 * "shim") to `path`, truncating it; a running trace is stopped first.
 * `name` goes into the header (NULL: "shim"). Returns 0, or -errno when the
 * file cannot be opened (-EINVAL for a NULL path). */
JAXLAKE_SHIM_EXPORT_API int jaxlake_shim_trace_start(const char* path,
                                                     const char* name);

/* Stops the trace and closes its file. Returns the number of events
 * written, or -1 when no trace was running. */
JAXLAKE_SHIM_EXPORT_API long long jaxlake_shim_trace_stop(void);

#ifdef __cplusplus
}
#endif

#endif /* JAXLAKE_SHIM_JAXLAKE_SHIM_H_ */
