# The C++ library sources, listed once. CMakeLists.txt includes this file;
# any other build of the libraries must list the same files.
set(JAXLAKE_VMM_SOURCES
  cc/vmm/driver.cc
  cc/vmm/latency.cc
  cc/vmm/sim_driver.cc
  cc/vmm/host_driver.cc
  cc/vmm/faulty_driver.cc
  cc/vmm/make_driver.cc
  cc/vmm/cuda_driver.cc
)
set(JAXLAKE_LAKE_SOURCES
  cc/lake/lake.cc
  cc/lake/arena.cc
  cc/lake/small_pool.cc
  cc/lake/span.cc
  cc/lake/stitch.cc
  cc/lake/stream_clock.cc
  cc/lake/stitch_cache.cc
  cc/lake/reclaim.cc
  cc/lake/check.cc
)
set(JAXLAKE_REPLAY_SOURCES
  cc/replay/trace.cc
  cc/replay/policy.cc
  cc/replay/lake_policy.cc
  cc/replay/bfc.cc
  cc/replay/torch.cc
  cc/replay/gmlake.cc
  cc/replay/xla_vmm.cc
  cc/replay/bfc_growth.cc
  cc/replay/fit.cc
  cc/replay/engine.cc
  cc/replay/lake_view.cc
)
# The libcuda.so.1 stand-in (cc/shim, x86-64 Linux). Its forwarding
# trampolines are generated at build time from cc/shim/cuda_symbols.txt.
set(JAXLAKE_SHIM_SOURCES
  cc/shim/api.cc
  cc/shim/hooks.cc
  cc/shim/lakes.cc
  cc/shim/loader.cc
  cc/shim/options.cc
  cc/shim/proc_address.cc
  cc/shim/trace.cc
  cc/shim/trampolines.cc
)
# The fake GPU (cc/fakegpu, x86-64 Linux): NVIDIA's libraries at their
# public APIs on host memory, for `jaxlake run --fake-gpu`.
set(JAXLAKE_FAKEGPU_SOURCES
  cc/fakegpu/state.cc
  cc/fakegpu/driver.cc
  cc/fakegpu/control.cc
  cc/fakegpu/device.cc
  cc/fakegpu/memory.cc
  cc/fakegpu/memory_alloc.cc
  cc/fakegpu/stream.cc
  cc/fakegpu/module.cc
  cc/fakegpu/graph.cc
  cc/fakegpu/graph_api.cc
  cc/fakegpu/graph_capture.cc
  cc/fakegpu/graph_exec.cc
  cc/fakegpu/runtime.cc
  cc/fakegpu/shared.cc
  cc/fakegpu/cudnn.cc
  cc/fakegpu/cudnn_backend.cc
  cc/fakegpu/cublas.cc
  cc/fakegpu/nccl.cc
  cc/fakegpu/graph_runtime.cc
  cc/fakegpu/libs.cc
  cc/fakegpu/cupti.cc
  cc/fakegpu/stubs.cc
)
# The fake GPU's loader guard (cc/fakegpu/interpose.cc), preloaded by
# `jaxlake run --fake-gpu`: it routes loads of NVIDIA's libraries to the
# fake's. A list of its own, since it is a library of its own.
set(JAXLAKE_FAKEGPU_INTERPOSE_SOURCES
  cc/fakegpu/interpose.cc
)
