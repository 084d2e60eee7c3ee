"""The compile flags of the project's own C++ targets (docs/bazel.md).

As CMake's jaxlake_warnings(): C++17, warnings as errors unless
--define=jaxlake_werror=off, and the lake's expensive invariant checks
(JAXLAKE_DEBUG=1) in -c dbg builds.
"""

JAXLAKE_COPTS = [
    "-std=c++17",
    "-Wall",
    "-Wextra",
    "-Wpedantic",
] + select({
    "//:no_werror": [],
    "//conditions:default": ["-Werror"],
}) + select({
    "//:debug": ["-DJAXLAKE_DEBUG=1"],
    "//conditions:default": [],
})
