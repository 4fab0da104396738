#include "parallel/planner/views.h"

#include <algorithm>

namespace tessel::planner {

namespace {

int64_t suffix_numel(const Shape& sizes, size_t begin) {
  int64_t numel = 1;
  for (size_t d = begin; d < sizes.size(); ++d) numel *= sizes[d];
  return numel;
}

int64_t normalized_dim(int64_t dim, size_t rank) {
  return dim < 0 ? dim + static_cast<int64_t>(rank) : dim;
}

}  // namespace

// A reshape keeps the order of the elements, so the split is a run of blocks of the flat
// elements, each cut in `parts`: the dim of `to` that holds one block and cuts it between elements
// of the dims after it.
std::pair<int64_t, int64_t> reshaped_split(const Shape& from, const Shape& to, int64_t axis,
                                           int64_t period, int parts) {
  const size_t a = static_cast<size_t>(axis);
  const int64_t block = (period > 0 ? period : from[a]) * suffix_numel(from, a + 1);
  for (size_t d = 0; d < to.size(); ++d) {
    const int64_t inner = suffix_numel(to, d + 1);
    const int64_t span = inner * to[d];
    if (!(inner < block && block <= span)) continue;
    if (block % inner != 0 || (block / parts) % inner != 0 || span % block != 0) return {-1, 0};
    const int64_t new_period = block / inner;
    return {static_cast<int64_t>(d), new_period == to[d] ? 0 : new_period};
  }
  return {-1, 0};
}

std::optional<SplitPlace> place_through_view(const ViewStep& step, const SplitPlace& place,
                                             int batch_parts, int model_parts) {
  const std::string& op = step.op;
  const Shape& from = step.from;
  const Shape& to = step.to;
  SplitPlace seen = place;
  if (op == "transpose" || op == "permute") {
    std::vector<int64_t> order(to.size());
    for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<int64_t>(d);
    if (op == "transpose") {
      std::swap(order[normalized_dim(step.attrs.get<int64_t>("dim0"), from.size())],
                order[normalized_dim(step.attrs.get<int64_t>("dim1"), from.size())]);
    } else {
      order = step.attrs.get<std::vector<int64_t>>("dims");
      for (int64_t& d : order) d = normalized_dim(d, from.size());
    }
    auto position = [&](int64_t dim) {
      return static_cast<int64_t>(std::find(order.begin(), order.end(), dim) - order.begin());
    };
    if (place.batch && position(0) != 0) return std::nullopt;
    if (place.model()) seen.axis = position(place.axis);
    return seen;
  }
  if (op == "view" || op == "reshape" || op == "squeeze" || op == "unsqueeze") {
    // Dim 0 keeps the batch's rows whole (a block of the flat elements, cut in its parts).
    if (place.batch &&
        reshaped_split(from, to, 0, 0, batch_parts) != std::pair<int64_t, int64_t>{0, 0})
      return std::nullopt;
    if (place.model()) {
      const auto [axis, period] = reshaped_split(from, to, place.axis, place.period, model_parts);
      if (axis < 0) return std::nullopt;
      seen.axis = axis;
      seen.period = period;
    }
    return seen;
  }
  if (op == "slice" || op == "select") {
    // Along a dim no split cuts: the same view of each part.
    const int64_t dim = normalized_dim(step.attrs.get<int64_t>("dim"), from.size());
    if ((place.batch && dim == 0) || (place.model() && dim == place.axis)) return std::nullopt;
    if (op == "select" && place.model() && place.axis > dim) --seen.axis;
    return seen;
  }
  if (op == "expand") {
    const int64_t lead = static_cast<int64_t>(to.size() - from.size());  // dims put in front
    if (place.batch && lead > 0) return std::nullopt;
    if (place.model()) seen.axis += lead;
    return seen;
  }
  if (place.batch || place.model()) return std::nullopt;
  return seen;
}

GatheredView gather_for_view(const ViewStep& step, const SplitPlace& place, int batch_parts) {
  if (place.model() && place.batch)
    if (auto seen = place_through_view(step, SplitPlace{true}, batch_parts, 1))
      return {true, *seen};
  return {false, *place_through_view(step, SplitPlace{}, 1, 1)};
}

int64_t forced_model_axis(ParallelSplit split, SplitKind kind, const Attrs& attrs, int64_t rank,
                          int64_t out_rank, int64_t inherited) {
  const bool channels =
      split == ParallelSplit::kConvChannels || split == ParallelSplit::kChannels ||
      split == ParallelSplit::kSpatialReduction || split == ParallelSplit::kConcat;
  if (channels || kind == SplitKind::kVocab) return 1;
  if (kind == SplitKind::kColumn) return out_rank - 1;
  if (kind == SplitKind::kRow) return rank - 1;
  if (split == ParallelSplit::kSoftmaxHeads) {
    const int64_t normalised =
        normalized_dim(attrs.get_or<int64_t>("dim", -1), static_cast<size_t>(rank));
    return inherited < 0 || inherited == normalised ? (normalised == 1 ? rank - 1 : 1) : -1;
  }
  if (kind == SplitKind::kHeads) return inherited < 0 ? 0 : -1;
  return inherited < 0 ? (rank >= 4 ? 1 : rank - 1) : -1;
}

ViewRead read_through_views(const TracedTensor& tensor, const std::vector<ViewStep>& chain,
                            const Layout& from) {
  ViewRead read;
  read.layout = from;
  SplitPlace place{from.batch > 1, from.model > 1 ? tensor.model_axis : -1,
                   from.model > 1 ? tensor.model_period : 0};
  for (const ViewStep& step : chain) {
    std::optional<SplitPlace> seen =
        place_through_view(step, place, read.layout.batch, read.layout.model);
    if (!seen) {
      const GatheredView gathered = gather_for_view(step, place, read.layout.batch);
      const Layout to{gathered.batch ? read.layout.batch : 1, 1};
      seen = gathered.seen;
      const double bytes = static_cast<double>(shape_numel(step.from)) *
                           static_cast<double>(element_size(tensor.dtype));
      read.gathers.push_back({read.layout, to, bytes, step.first});
      read.layout = to;
    }
    place = *seen;
  }
  return read;
}

}  // namespace tessel::planner
