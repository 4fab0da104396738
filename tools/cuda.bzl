"""CUDA build rules: nvcc for .cu files, empty libraries in the default (CPU) build.

    load("//tools:cuda.bzl", "cuda_library", "gpu_test")
    cuda_library(name = "elementwise", srcs = ["elementwise.cu", "elementwise.cc"],
                 deps = ["//core", "//ops", ":runtime"])
    gpu_test(name = "transfer_test", srcs = ["transfer_test.cc"], deps = [...])

Under --config=cuda (--define=tessel_cuda=1) every .cu file is compiled by nvcc
(-std=c++17 -O3 -Xcompiler -fPIC, sm_90 machine code plus compute_90 PTX; other
architectures with --define=tessel_cuda_arch=80,90) and its object goes with the .cc files
into one alwayslink cc_library linked against cudart, cuBLAS, cuDNN and NCCL (@cuda).
Under the default config a cuda_library is an empty cc_library, so `bazel build //...`
needs no toolkit. A .cu file sees the headers of `deps` and `hdrs` with the same include
paths and defines as the C++ compiler.
"""

_NVCC = "/usr/local/cuda/bin/nvcc"

def _nvcc_compile_impl(ctx):
    contexts = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in contexts])
    include_flags = ["-I."]
    for c in contexts:
        include_flags += ["-I" + p for p in c.quote_includes.to_list()]
        include_flags += ["-I" + p for p in c.includes.to_list()]
        include_flags += ["--system-include=" + p for p in c.system_includes.to_list()]
        include_flags += ["-D" + d for d in c.defines.to_list()]
    include_flags = depset(include_flags).to_list()  # ordered, without repeats

    archs = ctx.var.get("tessel_cuda_arch", "90").split(",")
    arch_flags = []
    for arch in archs:
        arch_flags += ["-gencode", "arch=compute_%s,code=sm_%s" % (arch, arch)]

    # PTX of the newest architecture too, so newer GPUs can JIT it.
    arch_flags += ["-gencode", "arch=compute_%s,code=compute_%s" % (archs[-1], archs[-1])]

    objects = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file("_nvcc/%s/%s.o" % (ctx.label.name, src.path))
        args = ctx.actions.args()
        args.add_all([
            "-std=c++17",
            "-O3",
            "-DNDEBUG",
            "--expt-relaxed-constexpr",
            "--extended-lambda",
            "-Xcompiler",
            "-fPIC",
            # Intermediate files beside the object: in /tmp their names come from the process id,
            # which repeats across sandboxed actions (each in its own pid namespace), so two
            # actions at once would overwrite each other's files.
            "--objdir-as-tempdir",
        ])
        args.add_all(arch_flags)
        args.add_all(include_flags)
        args.add_all(ctx.attr.copts)
        args.add_all(["-c", src.path, "-o", obj.path])
        ctx.actions.run(
            executable = _NVCC,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_nvcc_compile = rule(
    implementation = _nvcc_compile_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def _if_cuda(value, default):
    return select({
        "//cuda:enabled": value,
        "//conditions:default": default,
    })

def cuda_library(name, srcs = [], hdrs = [], deps = [], nvcc_copts = [], copts = [], alwayslink = True, **kwargs):
    """An alwayslink cc_library of .cu (nvcc) and .cc sources; empty in the CPU build.

    alwayslink is on by default: kernel files register themselves statically.
    """
    cu_srcs = [s for s in srcs if s.endswith(".cu")]
    cc_srcs = [s for s in srcs if not s.endswith(".cu")]
    all_deps = deps + ["@cuda"]
    objects = []
    if cu_srcs:
        _nvcc_compile(
            name = name + "_nvcc",
            srcs = _if_cuda(cu_srcs, []),
            hdrs = _if_cuda(hdrs, []),
            deps = _if_cuda(all_deps, []),
            copts = nvcc_copts,
            visibility = ["//visibility:private"],
        )
        objects = [":" + name + "_nvcc"]
    native.cc_library(
        name = name,
        srcs = _if_cuda(cc_srcs + objects, []),
        hdrs = _if_cuda(hdrs, []),
        deps = _if_cuda(all_deps, []),
        copts = copts,
        alwayslink = alwayslink,
        **kwargs
    )

def gpu_test(name, srcs, deps = [], tags = [], **kwargs):
    """A cc_test tagged `gpu` (./tessel test skips it), linked statically with //cuda:backend.

    Static linking keeps the binary self-contained, so tools/gpu_check.sh can copy it to a GPU
    machine. In the CPU build the sources are replaced by a placeholder test that skips (fails
    under TESSEL_REQUIRE_GPU). Tests use TESSEL_SKIP_IF_NO_GPU() from tests/gpu_skip.h.
    """
    native.cc_test(
        name = name,
        srcs = _if_cuda(srcs, ["//tools:gpu_test_placeholder.cc"]),
        deps = deps + ["//cuda:backend", "//tests:gpu_skip", "//tests:testing", "@gtest//:gtest_main"],
        tags = tags + ["gpu"],
        linkstatic = True,
        **kwargs
    )
