// Helpers for tests of the train CLI: run it in-process, capturing what it prints, and write tiny
// gzipped Fashion-MNIST-style IDX files for it to train on, e.g.
//   write_synthetic_fashion_mnist_split(dir, "train", 64); run_train_cli({"--data=" + dir}).code
#pragma once

#include <string>
#include <vector>

namespace tessel::train {

// What one run of the CLI returned and printed.
struct CliRun {
  int code;
  std::string out;
  std::string err;
};

// Runs the train CLI on `args` (without the program name).
CliRun run_train_cli(std::vector<std::string> args);

// Writes {prefix}-images-idx3-ubyte.gz and {prefix}-labels-idx1-ubyte.gz into `directory`: one
// label byte per example in `labels`, and `images` holding as many row-major image_size x
// image_size byte images.
void write_idx_split(const std::string& directory, const std::string& prefix, int image_size,
                     const std::string& images, const std::string& labels);

// A tiny Fashion-MNIST look-alike of `count` examples: example i has class i % 10, and class k
// lights up row block k of the 28x28 image, so the classes are trivially separable.
void write_synthetic_fashion_mnist_split(const std::string& directory, const std::string& prefix,
                                         int count);

}  // namespace tessel::train
