"""Compiler options shared by several packages."""

def vectorize_copts():
    """GCC's dynamic vectorizer cost model (-O2's default "very cheap" model
    skips loops whose output may alias an input); clang has no such flag
    (--config=tsa and --config=fuzz build with clang)."""
    return select({
        "//tools:clang": [],
        "//conditions:default": ["-fvect-cost-model=dynamic"],
    })
