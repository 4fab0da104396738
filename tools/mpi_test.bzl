"""mpi_test: a test binary run as NP MPI ranks, inside the normal `bazel test` suite.

    load("//tools:mpi_test.bzl", "mpi_test")
    mpi_test(name = "collectives_np2", binary = ":collectives_test_bin", np = 2)

`binary` is a cc_binary (testonly = True) with its own main that calls MPI_Init before
RUN_ALL_TESTS; it is run by tools/mpirun_test.sh under mpirun --oversubscribe.

Counting: only rank 0 writes the GoogleTest XML, so each TEST is counted once by
`./tessel test`. A failure seen only on another rank fails the target through mpirun's exit
status while rank 0's XML may say all passed; tools/count_tests.py counts one extra failure
for such a target.
"""

def mpi_test(name, binary, np = 2, args = [], size = "medium", tags = [], **kwargs):
    native.sh_test(
        name = name,
        srcs = ["//tools:mpirun_test.sh"],
        args = [str(np), "$(rootpath %s)" % binary] + args,
        data = [binary],
        size = size,
        # cpu:N reserves one core per rank, so Bazel does not pile other tests on top.
        tags = tags + ["mpi", "cpu:%d" % np],
        **kwargs
    )
