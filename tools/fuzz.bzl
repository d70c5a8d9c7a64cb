"""ferry_fuzz_test: a libFuzzer target plus a corpus replay test.

For a source defining
    extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
ferry_fuzz_test(name = "x_fuzz", srcs = [...], deps = [...], corpus = glob([...]))
creates
  :x_fuzz_corpus_test  cc_test (default suite): feeds every corpus file to the
                       target with a plain driver; any crash or sanitizer
                       report fails it.
  :x_fuzz              cc_binary, tagged manual: the libFuzzer binary. Build
                       and run it with `tools/fuzz/run //pkg:x_fuzz [seconds]`
                       (clang, -fsanitize=fuzzer,address); CI runs each one
                       briefly from its corpus (tools/test_sanitizers).
"""

def ferry_fuzz_test(name, srcs, deps = [], corpus = [], **kwargs):
    native.cc_test(
        name = name + "_corpus_test",
        srcs = srcs,
        deps = deps + ["//tools/fuzz:corpus_main"],
        data = corpus,
        args = ["$(location %s)" % c for c in corpus],
        **kwargs
    )
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        # The seed corpus, for tools/test_sanitizers to start from.
        data = corpus,
        # Targets may use test-only helpers (a raw socket client...).
        testonly = True,
    )
