"""tessel_fuzz_target: one parser's fuzz target, as a libFuzzer binary and as a replay test."""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library", "cc_test")

def tessel_fuzz_target(name, deps, mutations = 1000, max_seconds = 4, dictionary = True):
    """The targets of fuzz target `name` (source `<name>_fuzzer.cc`, corpus `corpus/<name>/`,
    dictionary `dicts/<name>.dict` unless `dictionary` is False):

      <name>_fuzzer         with --config=fuzz a libFuzzer binary (./tessel fuzz runs it); in
                            other builds the replay runner, for running a corpus by hand. Manual.
      <name>_replay_test    the corpus, then `mutations` random mutations of it (at most
                            `max_seconds` of them), with the replay runner: part of ./tessel test.
    """
    dict_files = ["dicts/%s.dict" % name] if dictionary else []
    dict_args = ["--dict=$(rootpath dicts/%s.dict)" % name] if dictionary else []
    cc_library(
        name = name + "_target",
        srcs = [name + "_fuzzer.cc"],
        deps = [":harness"] + deps,
        alwayslink = True,  # the only reference to LLVMFuzzerTestOneInput is in the runner
        testonly = True,
    )
    cc_binary(
        name = name + "_fuzzer",
        deps = [":" + name + "_target"] + select({
            ":libfuzzer": [],
            "//conditions:default": [":replay_main"],
        }),
        linkopts = select({
            ":libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = ["manual"],
        testonly = True,
    )
    cc_test(
        name = name + "_replay_test",
        size = "small",
        deps = [":" + name + "_target", ":replay_main"],
        data = native.glob(["corpus/%s/**" % name]) + dict_files,
        args = [
            "fuzz/corpus/" + name,
            "--mutations=%d" % mutations,
            "--max_seconds=%d" % max_seconds,
        ] + dict_args,
    )
