// Device profiles for the planner: compute throughput per op kind, memory bandwidth, alpha-beta
// costs per collective and link level (inside a node, between nodes), devices per node and
// memory per device. Read from JSON (parallel/profiles/*.json) or measured by calibrate.
//   DeviceProfile profile = load_profile("parallel/profiles/h200_cluster.json");
//   double t = profile.collective_time(Collective::kAllReduce, 8, 64 << 20);  // ring, 8 ranks
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/op.h"
#include "memory/sim/simulator.h"

namespace tessel::planner {

enum class Collective { kAllReduce, kAllGather, kReduceScatter };
enum class LinkLevel { kIntraNode, kInterNode };
const char* collective_name(Collective collective);  // "all_reduce", ...
const char* link_level_name(LinkLevel level);        // "intra_node", "inter_node"

// Time of a collective on p ranks: alpha per ring step plus the bytes a rank moves over the bus
// bandwidth (the number nccl-tests reports as busbw).
struct AlphaBeta {
  double alpha_s = 0;        // latency per ring step, seconds
  double bus_bandwidth = 0;  // bytes per second
};

// Measured throughput of one kind of op (calibrate), in units of the work the planner counts for
// it: "flops" (OpDef::cost), "bytes" (read plus written) or "parameters" (optimizer updates).
struct OpKindRate {
  std::string per = "flops";
  double forward = 0;         // units of forward work per second of forward time
  double backward = 0;        // units of backward work (backward factor x forward work) per second
  double forward_call_s = 0;  // fixed cost of one call, whatever its work
  double backward_call_s = 0;
};

// Measured seconds of one op call at one set of local shapes (calibrate --shapes_of).
struct ShapeTime {
  double forward_s = 0;
  double backward_s = 0;  // every input that needs a gradient gets one
};

// The op_shapes key of a call: its op, each input's shape (with "'" where it needs a gradient,
// "-" for an absent optional input) and its attributes:
//   "conv2d [8, 32, 16, 16]' [64, 32, 3, 3]' - {dilation=[1, 1], groups=1, ...}"
std::string op_shape_key(const std::string& op,
                         const std::vector<std::optional<Shape>>& input_shapes,
                         const std::vector<bool>& needs_gradient, const Attrs& attrs);

struct DeviceProfile {
  std::string name;
  std::string description;
  int devices_per_node = 1;
  double memory_per_device = 0;  // bytes
  // FLOP/s by op kind: "gemm" (linear, matmul, bmm), "conv" (conv2d), "elementwise" (the rest).
  double gemm_flops = 0;
  double conv_flops = 0;
  double elementwise_flops = 0;
  // The same for 16-bit floating inputs (bf16 / f16 tensor cores); 0: not given (f32 rates).
  double gemm_flops_16bit = 0;
  double conv_flops_16bit = 0;
  double memory_bandwidth = 0;  // bytes per second, for memory-bound ops (roofline)
  // Between the device and host memory, one direction (PCIe), bytes per second; 0: not given.
  // The memory simulator's swaps take their time from it.
  double host_link_bandwidth = 0;
  double op_overhead_s = 0;  // fixed cost per op per pass (kernel launch)
  // Rematerialisation: running under a memory budget that keeps a fraction f of the activations
  // costs (1 - f) * forward time * remat_overhead_k extra (1: one extra forward pass when
  // nothing is kept, as in sublinear checkpointing).
  double remat_overhead_k = 1.0;
  // Per op kind (see op_rate_kind: "gemm", "conv", "conv_grouped", "elementwise",
  // "activation", "batch_norm", "layer_norm", "softmax", "pool", "concat", "dropout", "loss",
  // "sgd_update", "adam_update"; "vocab_loss" for cross_entropy over a vocabulary split); a kind
  // not listed falls back to the roofline numbers above.
  std::map<std::string, OpKindRate> op_kinds;
  // Calls measured at their exact local shapes (op_shape_key), which price them instead of their
  // kind's rate: a convolution cut by channels into thin shards runs below the rate fitted on
  // whole layers. Forward and backward seconds, without op_overhead_s.
  std::map<std::string, ShapeTime> op_shapes;
  // The thread layout the compute numbers were measured under: this many ranks running at once
  // on one node, each with this many threads (0: not recorded). A profile describes per-rank
  // throughput only under the layout it was measured with.
  int calibrated_ranks = 0;
  int calibrated_threads = 0;
  // Plans on more than one device: each step waits for the slowest rank, so compute takes
  // (1 + rank_skew) times the per-rank time (measured with ranks sharing cores; 0: no skew).
  double rank_skew = 0;
  // Ranks that work T seconds apart from one collective to the next reach it about
  // sync_jitter * T^sync_exponent seconds apart, and the earlier ones wait: sync_wait(T). An
  // exponent of 0.5: their times vary like a random walk; towards 1 where ranks share cores and
  // take turns. sync_jitter 0: no wait (devices that do not share cores with anything).
  double sync_jitter = 0;
  double sync_exponent = 0.5;
  double sync_wait(double interval_s) const {
    return sync_jitter * std::pow(std::max(0.0, interval_s), sync_exponent);
  }
  // Inside a step, each ring step of a collective also waits this long for the ranks' turns on
  // cores they share (work just before it leaves them out of step), beyond the back-to-back alpha
  // and bandwidth of `collectives`; 0: devices that do not share cores.
  double collective_turn_s = 0;
  // [level][collective]
  std::array<std::array<AlphaBeta, 3>, 2> collectives{};
  std::string sources_json = "{}";  // where the numbers come from (JSON object, kept verbatim)

  const AlphaBeta& link(Collective collective, LinkLevel level) const {
    return collectives[static_cast<int>(level)][static_cast<int>(collective)];
  }
  // A group of `ranks` consecutive ranks stays inside one node when it has at most
  // devices_per_node ranks.
  LinkLevel level_for(int64_t ranks) const {
    return ranks <= devices_per_node ? LinkLevel::kIntraNode : LinkLevel::kInterNode;
  }
  // Ring algorithms; `bytes` is the full buffer per rank (for all_gather: the gathered result):
  //   all_reduce:      2(p-1) (alpha + turn) + 2(p-1)/p * bytes / bandwidth
  //   all_gather, reduce_scatter: (p-1) (alpha + turn) + (p-1)/p * bytes / bandwidth
  double collective_time(Collective collective, int64_t ranks, double bytes, LinkLevel level) const;
  // Same, on the level level_for(ranks) picks.
  double collective_time(Collective collective, int64_t ranks, double bytes) const {
    return collective_time(collective, ranks, bytes, level_for(ranks));
  }
  // Roofline time of an op's work on one device; `kind` is "gemm", "conv" or anything else
  // (element-wise). `low_precision`: 16-bit float operands, at the 16-bit rates where given.
  double compute_time(double flops, double bytes, const std::string& kind,
                      bool low_precision = false) const;
  // Forward (or backward, for `work_factor` times the forward's work) time of an op of `kind`:
  // the measured rate of op_kinds when the profile has it, else the roofline of the closest of
  // gemm / conv / element-wise. Optimizer kinds count `parameters` instead of FLOPs and bytes.
  double op_time(const std::string& kind, double flops, double bytes, bool backward,
                 double work_factor = 1.0) const;
  // Seconds to update `parameters` elements with an optimizer keeping `states` tensors per
  // parameter (0 plain SGD, 1 SGD momentum, 2 Adam): the measured rate, else the memory traffic
  // (3 + 2 states) x 4 bytes per parameter over memory_bandwidth.
  double optimizer_time(double parameters, int states) const;
  // "2 ranks x 1 thread at once" or "layout not recorded".
  std::string layout_description() const;
  // Seconds of one call of `op` on this device: op_overhead_s plus the measured rate of its kind
  // (op_rate_kind) where op_kinds has it, else the roofline of its FLOPs and bytes (OpDef::cost;
  // the bytes of its inputs and outputs without one), 16-bit float operands at the 16-bit rates.
  double op_seconds(const OpDef& op, const std::vector<Tensor>& inputs,
                    const std::vector<Tensor>& outputs, const Attrs& attrs) const;
};

// The kind whose rate prices a call of `op` (op_kinds keys; the roofline's "gemm", "conv" or
// else element-wise): the op's declared planner rate, else from its OpKind ("conv_grouped" for
// convolutions with groups > 1).
std::string op_rate_kind(const OpDef& op, const Attrs& attrs);

// The memory simulator's device for `profile`: op_seconds, memory_bandwidth and
// host_link_bandwidth (an error naming the profile when it has none).
memory::sim::SimulatedDevice simulated_device(const DeviceProfile& profile);

// Parses and checks a profile; every missing or invalid field is an error naming it and `where`.
DeviceProfile parse_profile(const std::string& json_text, const std::string& where);
DeviceProfile load_profile(const std::string& path);
std::string profile_to_json(const DeviceProfile& profile);
void save_profile(const DeviceProfile& profile, const std::string& path);

// Mean of the middle half of `values` (robust to outliers either way); 0 when empty.
double trimmed_mean(std::vector<double> values);

// What calibrate prices each case at on cores shared with other processes. `cpu_samples[i]`
// holds case i's CPU time in each round; `wall_s` and `cpu_s` are the wall and CPU time of all
// cases over all rounds. A process that gets a share s of a core runs 1/s times longer than its
// CPU time, and loses that share in proportion to how long it runs, however short its ops: a
// trimmed mean of wall times would drop the preemptions of short ops (a 50 us op is rarely hit,
// but then by milliseconds) and keep those of long ones. So each case is its trimmed CPU time
// times wall_s / cpu_s (with several threads that ratio also spreads their idle time over the
// cases in proportion to their CPU time). Without CPU time (cpu_s <= 0) the ratio is 1.
std::vector<double> shared_core_times(const std::vector<std::vector<double>>& cpu_samples,
                                      double wall_s, double cpu_s);

// "16GiB", "1.5GB", "512MiB", "4096" (bytes): units B, KB/MB/GB/TB (powers of 1000) and
// KiB/MiB/GiB/TiB (powers of 1024), any case. Throws naming `what` and the text otherwise.
double parse_bytes(const std::string& text, const std::string& what);
std::string format_bytes(double bytes);      // "15.3 GiB"
std::string format_seconds(double seconds);  // "12.4 ms"

}  // namespace tessel::planner
