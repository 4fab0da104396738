// Metrics as JSON lines: one object per line, flushed as written, so a run that stops early
// still leaves every line it reached. An empty path writes nothing; `append` keeps the lines
// already in the file (a resumed run).
//   MetricsLog metrics("run.jsonl");  metrics.write({{"event", "train"}, {"step", 100}});
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace tessel::train {

class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path, bool append = false);
  bool enabled() const { return !path_.empty(); }
  void write(const nlohmann::ordered_json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace tessel::train
