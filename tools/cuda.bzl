"""cuda_library: .cu files compiled by nvcc into a cc_library.

Bazel 4 has no CUDA rules, so each .cu file becomes one genrule that runs
@local_cuda's nvcc (CUDA_ROOT/bin/nvcc, absolute: the action environment is
strict) and writes a position-independent object; a cc_library links those
objects with cudart. Code is generated for sm_90
(H100/H200) plus compute_90 PTX, which the driver JIT-compiles for newer
GPUs. nvcc's host compiler is the g++ on the action's PATH.

Contract for the .cu files: they include only CUDA's and the C++ standard
headers and the (source, not generated) headers listed in `cu_hdrs`, as
"ferry/<workspace path>" like every Ferry header: the action copies them into
a private include tree, since nvcc sees neither Bazel's include_prefix trees
nor Abseil. The
library's public `hdrs` (plain C++, no CUDA headers) are what cc code uses.
Where CUDA is absent the library is incompatible (skipped by //...), like
everything else built on @local_cuda. Design: docs/design/cuda_kernels.md.
"""

load("@local_cuda//:defs.bzl", "CUDA_ROOT", "cuda_compatible")

# sm_90 SASS for H100/H200, and compute_90 PTX as the fallback.
CUDA_ARCH_FLAGS = "-gencode=arch=compute_90,code=[sm_90,compute_90]"

def cuda_library(name, srcs, hdrs = [], cu_hdrs = [], deps = [],
                 nvcc_flags = [], **kwargs):
    """A cc_library of `srcs` (.cu) compiled by nvcc; see the file comment.

    Args:
      name: the cc_library.
      srcs: .cu files, one nvcc action each.
      hdrs: public C++ headers of the library (compiled by the C++ toolchain).
      cu_hdrs: headers the .cu files include (inputs of the nvcc actions).
      deps: cc deps of the library.
      nvcc_flags: extra nvcc flags.
      **kwargs: passed to cc_library (include_prefix, visibility, ...).
    """
    objs = []
    for src in srcs:
        if not src.endswith(".cu"):
            fail("cuda_library %s: %s is not a .cu file" % (name, src))
        stem = src[:-len(".cu")].replace("/", "_")
        obj = "_nvcc_%s/%s/%s.pic.o" % (name, stem, stem)
        native.genrule(
            name = "_nvcc_%s_%s" % (name, stem),
            srcs = [src] + cu_hdrs,
            outs = [obj],
            cmd = " ".join([
                "for h in : %s; do" % " ".join(["$(location %s)" % h for h in cu_hdrs]),
                "[ $$h = : ] || { mkdir -p $(@D)/_inc/ferry/$$(dirname $$h) &&",
                "cp $$h $(@D)/_inc/ferry/$$h; } || exit 1; done;",
                CUDA_ROOT + "/bin/nvcc",
                "-c -std=c++20 -O2 -Xcompiler=-fPIC -Xcompiler=-Wall",
                "--expt-relaxed-constexpr",
                CUDA_ARCH_FLAGS,
                "-I$(@D)/_inc",
            ] + nvcc_flags + ["-o $@ $(location %s)" % src]),
            target_compatible_with = cuda_compatible(),
            tags = ["cuda"],
            visibility = ["//visibility:private"],
        )
        objs.append(obj)
    cuda_deps = ["@local_cuda//:cuda"]
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + cuda_deps,
        target_compatible_with = cuda_compatible(),
        **kwargs
    )
