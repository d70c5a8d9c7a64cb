"""cc_headers: every header a C++ target's compilation sees, as runfiles.

For checks that run a compiler on the public headers the way a consumer
would: the sources land in the runfiles at ferry/<folder>/<file>.h, so
`-I$TEST_SRCDIR` resolves "ferry/..." includes.
"""

def _cc_headers_impl(ctx):
    files = depset(transitive = [
        d[CcInfo].compilation_context.headers
        for d in ctx.attr.deps
    ])
    return [DefaultInfo(
        files = files,
        runfiles = ctx.runfiles(transitive_files = files),
    )]

cc_headers = rule(
    implementation = _cc_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
