# The C++ library sources, listed once. CMakeLists.txt includes this file;
# any other build of the libraries must list the same files.
set(JAXLAKE_VMM_SOURCES
  cc/vmm/driver.cc
  cc/vmm/sim_driver.cc
  cc/vmm/host_driver.cc
  cc/vmm/faulty_driver.cc
  cc/vmm/make_driver.cc
)
set(JAXLAKE_LAKE_SOURCES
  cc/lake/lake.cc
)
