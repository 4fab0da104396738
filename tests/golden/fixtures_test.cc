// Every committed fixture says which script in this folder made it (its "generator" metadata),
// so each one can be made again with Debian's python3-torch.
#include <filesystem>
#include <string>

#include "core/safetensors.h"
#include "gtest/gtest.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

TEST(GoldenFixtures, EachRecordsTheScriptThatMadeIt) {
  int fixtures = 0;
  for (const auto& entry : fs::directory_iterator("tests/golden")) {
    if (entry.path().extension() != ".safetensors") continue;
    ++fixtures;
    SafetensorsMetadata metadata;
    load_safetensors(entry.path().string(), &metadata);
    const auto generator = metadata.find("generator");
    ASSERT_NE(generator, metadata.end()) << entry.path() << " has no 'generator' metadata";
    EXPECT_EQ(generator->second.rfind("tests/golden/make_", 0), 0u) << entry.path();
    EXPECT_TRUE(fs::exists(generator->second))
        << entry.path() << " names '" << generator->second << "', which is not in the repository";
  }
  EXPECT_GE(fixtures, 4);
}

}  // namespace
}  // namespace tessel
