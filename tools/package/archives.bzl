"""ferry_archives: the static archives of Ferry's own libraries, for tools/install.

Walks the CcInfo linking context of `deps` and collects, from every linker
input whose owner is in this repository (never @system or @local_cuda), the
PIC static archive (or the plain one where no PIC archive exists), plus every
link flag any linker input carries (the system libraries: -lgrpc++, -lgloo,
...). Outputs, next to the archives it makes Bazel build:

  <name>.archives   one archive path a line, relative to the execution root
  <name>.linkopts   one link flag a line, in link order, duplicates dropped
"""

def _ferry_archives_impl(ctx):
    archives = []
    seen = {}
    flags = []
    seen_flags = {}
    for dep in ctx.attr.deps:
        for li in dep[CcInfo].linking_context.linker_inputs.to_list():
            for f in li.user_link_flags:
                if f not in seen_flags:
                    seen_flags[f] = True
                    flags.append(f)
            if li.owner.workspace_name != "":
                continue
            for lib in li.libraries:
                a = lib.pic_static_library or lib.static_library
                if a == None or a.path in seen:
                    continue
                seen[a.path] = True
                archives.append(a)
    listing = ctx.actions.declare_file(ctx.label.name + ".archives")
    ctx.actions.write(listing, "".join([a.path + "\n" for a in archives]))
    linkopts = ctx.actions.declare_file(ctx.label.name + ".linkopts")
    ctx.actions.write(linkopts, "".join([f + "\n" for f in flags]))
    return [DefaultInfo(files = depset([listing, linkopts] + archives))]

ferry_archives = rule(
    implementation = _ferry_archives_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
    doc = "Ferry's own static archives and the link flags of its dependencies.",
)
