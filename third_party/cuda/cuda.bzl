"""Repository rule that finds CUDA and NCCL (default /usr/local/cuda).

Generates @local_cuda with:
  //:cuda       cudart + NCCL headers and libraries; incompatible (so skipped by
                `bazel build/test //...`) when CUDA or NCCL is absent.
  //:defs.bzl   HAS_CUDA, CUDA_ROOT, and if_cuda(yes, no) for selecting
                sources/defines (tools/cuda.bzl's cuda_library runs
                CUDA_ROOT/bin/nvcc). CUDA counts as found with cudart, NCCL,
                nvcc and cuBLAS's header (cuBLAS itself is loaded at run time,
                tensor/cuda/context.h).
Override the location with FERRY_CUDA_PATH; set it to an empty directory to
build without CUDA.
"""

def _local_cuda_impl(ctx):
    root = ctx.os.environ.get("FERRY_CUDA_PATH", "/usr/local/cuda")
    libdir = None
    for d in ["lib64", "lib", "targets/x86_64-linux/lib"]:
        if ctx.path(root + "/" + d + "/libcudart.so").exists:
            libdir = root + "/" + d
            break
    found = (libdir != None and
             ctx.path(root + "/include/cuda_runtime_api.h").exists and
             ctx.path(root + "/include/nccl.h").exists and
             ctx.path(libdir + "/libnccl.so").exists and
             ctx.path(root + "/include/cublas_v2.h").exists and
             ctx.path(root + "/bin/nvcc").exists)
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if found:
        ctx.symlink(root + "/include", "include")
        build.append("""cc_library(
    name = "cuda",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/**", "include/nv/**",
                 "include/nccl_device/**"]),
    includes = ["include"],
    linkopts = ["-L{libdir}", "-Wl,-rpath,{libdir}", "-lnccl", "-lcudart"],
    defines = ["FERRY_WITH_CUDA=1"],
)
""".format(libdir = libdir))
    else:
        build.append("""cc_library(
    name = "cuda",
    target_compatible_with = ["@platforms//:incompatible"],
)
""")
    ctx.file("BUILD", "\n".join(build))
    ctx.file("defs.bzl", """HAS_CUDA = %s
CUDA_ROOT = %r

def if_cuda(if_true, if_false = []):
    return if_true if HAS_CUDA else if_false

def cuda_compatible():
    return [] if HAS_CUDA else ["@platforms//:incompatible"]
""" % (found, root))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    local = True,
    environ = ["FERRY_CUDA_PATH"],
)
