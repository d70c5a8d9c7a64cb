"""Repository rule exposing Debian's system libraries as Bazel targets.

Link and compile flags come from pkg-config when the workspace is loaded, so no
BUILD file in Ferry hard-codes them. Every target here is a plain cc_library
with headers from /usr/include (a system include directory of the compiler).
"""

# name -> (pkg-config modules, extra link options, extra deps in this repo)
_LIBS = {
    "absl": ([
        "absl_status",
        "absl_statusor",
        "absl_strings",
        "absl_str_format_internal",
        "absl_synchronization",
        "absl_time",
        "absl_hash",
        "absl_raw_hash_set",
        "absl_random_random",
        "absl_flags",
        "absl_flags_parse",
        "absl_flags_usage",
    ], [], []),
    "protobuf": (["protobuf"], [], ["absl"]),
    "grpc": (["grpc++"], ["-lgrpc++_reflection"], ["protobuf", "absl"]),
    "uv": (["libuv"], [], []),
    # OpenSSL's libcrypto: HMAC and random nonces for store authentication.
    "crypto": (["libcrypto"], [], []),
    "gtest": (["gmock", "gtest"], [], []),
    "gtest_main": (["gmock_main"], [], ["gtest"]),
    "benchmark": (["benchmark"], ["-lpthread"], []),
}

# Libraries without a pkg-config file: name -> (probe header, link options).
_PLAIN = {
    "gloo": ("gloo/context.h", ["-lgloo"]),
    # BLAS behind @system//:blas is chosen at build time: OpenBLAS by default,
    # Debian's reference BLAS with --define=ferry_blas=reference. The rpath
    # pins the reference library, since libblas.so.3 is an alternatives link
    # that OpenBLAS's package takes over.
    "openblas": ("cblas.h", ["-lopenblas"]),
    "blas_reference": ("cblas.h", [
        "-L/usr/lib/x86_64-linux-gnu/blas",
        "-Wl,-rpath,/usr/lib/x86_64-linux-gnu/blas",
        "-lblas",
    ]),
    "dlpack": ("dlpack/dlpack.h", []),
}

def _pkg_config(ctx, modules, flag):
    result = ctx.execute(["pkg-config", flag] + modules)
    if result.return_code != 0:
        fail("pkg-config %s %s failed (run tools/setup): %s" %
             (flag, " ".join(modules), result.stderr))
    return [f for f in result.stdout.strip().split(" ") if f]

def _header_exists(ctx, header):
    for root in ["/usr/include", "/usr/include/x86_64-linux-gnu", "/usr/local/include"]:
        if ctx.path(root + "/" + header).exists:
            return True
    return False

def _system_libs_impl(ctx):
    if not ctx.which("pkg-config"):
        fail("pkg-config not found: run tools/setup")
    out = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, (modules, extra, deps) in _LIBS.items():
        cflags = _pkg_config(ctx, modules, "--cflags")
        libs = _pkg_config(ctx, modules, "--libs")
        defines = [f[2:] for f in cflags if f.startswith("-D")]
        out.append("cc_library(")
        out.append("    name = %r," % name)
        out.append("    defines = %r," % defines)
        out.append("    linkopts = %r," % (libs + extra))
        out.append("    deps = %r," % [":" + d for d in deps])
        out.append(")")
        out.append("")
    for name, (header, linkopts) in _PLAIN.items():
        if not _header_exists(ctx, header):
            fail("%s not found (header %s): run tools/setup" % (name, header))
        out.append("cc_library(name = %r, linkopts = %r)" % (name, linkopts))
        out.append("")

    out.append('config_setting(name = "reference_blas", define_values = {"ferry_blas": "reference"})')
    out.append('cc_library(name = "blas", deps = select({":reference_blas": [":blas_reference"], "//conditions:default": [":openblas"]}))')
    out.append("")

    protoc = ctx.which("protoc")
    plugin = ctx.which("grpc_cpp_plugin")
    if not protoc or not plugin:
        fail("protoc / grpc_cpp_plugin not found: run tools/setup")
    ctx.file("BUILD", "\n".join(out))
    ctx.file("tools.bzl", "PROTOC = %r\nGRPC_CPP_PLUGIN = %r\n" % (str(protoc), str(plugin)))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["PATH", "PKG_CONFIG_PATH"],
)
