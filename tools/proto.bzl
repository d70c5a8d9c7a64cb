"""ferry_proto_library: C++ protobuf (+ gRPC) targets from .proto files.

Uses the system protoc and grpc_cpp_plugin found by @system; nothing is
downloaded. For `proto/foo.proto` it generates `proto/foo.pb.{h,cc}` (and
`proto/foo.grpc.pb.{h,cc}` when grpc = True); include them as "ferry/proto/foo.pb.h".
`deps` are other ferry_proto_library targets whose files these import.
"""

load("@system//:tools.bzl", "GRPC_CPP_PLUGIN", "PROTOC")

def ferry_proto_library(name, srcs, deps = [], grpc = False, visibility = None):
    srcs_group = name + "_proto_srcs"
    native.filegroup(
        name = srcs_group,
        srcs = srcs + [d + "_proto_srcs" for d in deps],
        visibility = visibility,
    )
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]

    pkg = native.package_name()
    # Where this repository's files are, relative to the execution root: "."
    # in Ferry's own workspace, external/ferry where a consumer's workspace
    # brings Ferry in (tools/deps.bzl); generated files go under $(GENDIR)/root.
    repo = native.repository_name().lstrip("@")
    root = "external/" + repo if repo else "."
    files = " ".join([(root + "/" if repo else "") + (pkg + "/" if pkg else "") + s for s in srcs])
    gendir = "$(GENDIR)/" + root if repo else "$(GENDIR)"
    cmd = "{protoc} -I{root} -I{gendir} -I/usr/include --cpp_out={gendir}".format(
        protoc = PROTOC,
        root = root,
        gendir = gendir,
    )
    if grpc:
        cmd += " --plugin=protoc-gen-grpc={plugin} --grpc_out={gendir}".format(
            plugin = GRPC_CPP_PLUGIN,
            gendir = gendir,
        )
    cmd += " " + files
    native.genrule(
        name = name + "_gen",
        srcs = [":" + srcs_group],
        outs = outs,
        cmd = cmd,
        message = "protoc " + files,
    )
    native.cc_library(
        name = name,
        include_prefix = "ferry/" + native.package_name(),
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        # Generated code is not ours to keep warning-free.
        copts = ["-Wno-unused-parameter", "-Wno-error"],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc"] if grpc else []),
        visibility = visibility,
    )
