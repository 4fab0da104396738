// gpu_smoke in the default (CPU-only) build: its checks need the CUDA toolkit, so it only says
// how to build them. Exit status 3, which tools/gpu_check.sh reports as "built without CUDA".
#include <cstdio>

int main() {
  std::fprintf(stderr,
               "gpu_smoke: built without CUDA; build with --config=cuda "
               "(tools/gpu_check.sh build)\n");
  return 3;
}
