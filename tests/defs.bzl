"""cc_test_per_file: one cc_test per *_test.cc file of a folder, the way every tests/ folder
builds its suites."""

load("@rules_cc//cc:defs.bzl", "cc_test")

def cc_test_per_file(
        deps,
        exclude = [],
        size = "small",
        sizes = {},
        shard_counts = {},
        extra_deps = {},
        data = []):
    """A cc_test named after each *_test.cc in this folder, except `exclude`.

    Every test gets `deps` plus the test helpers (//tests:testing) and gtest's main; `sizes`,
    `shard_counts` and `extra_deps` map a test's name to its own size, shard count and the deps
    only it needs.
    """
    for f in native.glob(["*_test.cc"], exclude = exclude):
        name = f[:-3]
        test_deps = []
        for dep in deps + extra_deps.get(name, []) + ["//tests:testing", "@gtest//:gtest_main"]:
            if dep not in test_deps:  # Bazel refuses a label listed twice
                test_deps.append(dep)
        cc_test(
            name = name,
            size = sizes.get(name, size),
            srcs = [f],
            shard_count = shard_counts.get(name),  # None: not sharded
            data = data,
            deps = test_deps,
        )
