"""cc_headers: the headers of C++ libraries and of all they depend on, as
files (and runfiles), for tests that read headers: //docs:doxygen_test."""

def _cc_headers_impl(ctx):
    headers = depset(transitive = [
        dep[CcInfo].compilation_context.headers
        for dep in ctx.attr.deps
    ])
    return [DefaultInfo(
        files = headers,
        runfiles = ctx.runfiles(transitive_files = headers),
    )]

cc_headers = rule(
    implementation = _cc_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
