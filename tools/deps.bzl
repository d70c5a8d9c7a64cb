"""ferry_dependencies(): the repositories Ferry's targets need, for a workspace
that brings Ferry in as @ferry.

A consumer's WORKSPACE:

    local_repository(name = "ferry", path = "/path/to/ferry")
    load("@ferry//tools:deps.bzl", "ferry_dependencies")
    ferry_dependencies(ferry_path = "/path/to/ferry")

and its BUILD depends on @ferry//:ferry (or :c10d, :ddp, :store). It
declares what Ferry's own WORKSPACE does, under the same names (Ferry's BUILD
files refer to them): the offline stand-ins for what Bazel would download
(third_party/stubs), @system (Debian's libraries through pkg-config) and
@local_cuda (CUDA and NCCL where found). A repository the consumer already
declared under one of these names is left alone. Build with
--cxxopt=-std=c++20 (Ferry is C++20).
"""

load("@ferry//third_party/cuda:cuda.bzl", "local_cuda")
load("@ferry//third_party/system:system.bzl", "system_libs")

_STUBS = [
    "rules_cc",
    "rules_java",
    "rules_proto",
    "platforms",
    "bazel_skylib",
    "remote_java_tools_linux",
    "remote_coverage_tools",
]

def ferry_dependencies(ferry_path):
    """Declares @system, @local_cuda and the stub repositories.

    Args:
      ferry_path: the Ferry checkout, as given to local_repository(name = "ferry").
    """
    for repo in _STUBS:
        if not native.existing_rule(repo):
            native.local_repository(
                name = repo,
                path = ferry_path + "/third_party/stubs/" + repo,
            )
    if not native.existing_rule("system"):
        system_libs(name = "system")
    if not native.existing_rule("local_cuda"):
        local_cuda(name = "local_cuda")
