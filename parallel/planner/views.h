// Where a split tensor's parts lie after views of it, and the gathers a view across a split
// makes: the rules parallel::ParallelModule runs a plan by, shared with the planner so that it
// prices what the runtime does.
//   SplitPlace place{/*batch=*/false, /*axis=*/1};
//   std::optional<SplitPlace> seen = place_through_view(step, place, 1, 2);  // nullopt: cut
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "parallel/planner/strategies.h"

namespace tessel::planner {

// How a tensor is cut: dim 0 (the batch) or not, and a model split along `axis` (-1: none), the
// whole dim cut in equal parts or, with a period, each run of `period` elements of it cut.
struct SplitPlace {
  bool batch = false;
  int64_t axis = -1;
  int64_t period = 0;  // 0: the whole dim
  bool model() const { return axis >= 0; }
};

// Where a model split of dim `axis` of a tensor of shape `from` (blocks of `period` elements cut
// in `parts`, 0: the whole dim) lies after a reshape to `to`: the dim of `to` that holds one block
// and its period there (0: the whole dim), or dim -1 when no dim holds it so.
std::pair<int64_t, int64_t> reshaped_split(const Shape& from, const Shape& to, int64_t axis,
                                           int64_t period, int parts);

// `place` seen through the view `step` of a tensor cut in `batch_parts` along dim 0 and
// `model_parts` along its model axis: where the parts lie in the view, or nullopt when the view
// cuts across them (a slice along a split dim, a reshape that mixes a split dim with others, a
// permutation that moves the batch, an expansion in front of it).
std::optional<SplitPlace> place_through_view(const ViewStep& step, const SplitPlace& place,
                                             int batch_parts, int model_parts);

// How the runtime reads a view that cuts across `place` (place_through_view gave nullopt): it
// gathers the viewed value along the model where the batch's split (in `batch_parts`) survives
// the view, else whole. Whether the batch stays split, and where the parts lie in the view.
struct GatheredView {
  bool batch = false;
  SplitPlace seen;
};
GatheredView gather_for_view(const ViewStep& step, const SplitPlace& place, int batch_parts);

// The dim an op of `kind` splits over the model whatever its inputs' splits (-1: that of an input
// already split, `inherited`, -1 when none), as the runtime splits it: channels for convolutions,
// normalisation, pooling, joins and classes, the features (last dim) for column splits, the input
// features for row splits, for attention's softmax any dim but the normalised one, for its
// products the batch of heads, and for an element-wise op starting a split the channels of images,
// else the features. `rank` and `out_rank` are those of its first input and output.
int64_t forced_model_axis(ParallelSplit split, SplitKind kind, const Attrs& attrs, int64_t rank,
                          int64_t out_rank, int64_t inherited);

// The gathers the runtime makes to read a tensor of layout `from` through the views `chain`
// (TracedOp::input_views): at each view that cuts across the tensor's parts, the viewed value is
// gathered along the model (or, where the view also cuts the batch, whole), once for every reader
// of that value (ViewGather, strategies.h).
struct ViewRead {
  std::vector<ViewGather> gathers;
  Layout layout;  // how the reader finds the view: `from`, or what the gathers left
};
ViewRead read_through_views(const TracedTensor& tensor, const std::vector<ViewStep>& chain,
                            const Layout& from);

}  // namespace tessel::planner
