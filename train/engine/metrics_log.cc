#include "train/engine/metrics_log.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tessel::train {

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  if (path_.empty()) return;
  out_.open(path_, append ? std::ios::app : std::ios::trunc);
  TESSEL_CHECK(out_.is_open(), "--metrics: cannot open '", path_,
               "' for writing: ", std::strerror(errno));
}

void MetricsLog::write(const nlohmann::ordered_json& record) {
  if (!enabled()) return;
  out_ << record.dump() << '\n';
  out_.flush();
  TESSEL_CHECK(out_.good(), "--metrics: writing '", path_, "' failed: ", std::strerror(errno));
}

}  // namespace tessel::train
