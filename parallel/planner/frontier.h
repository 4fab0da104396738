// Frontier Tracking (TensorOpt): the Pareto frontier of (memory per device, time per iteration)
// over every choice of one strategy per node of a cost graph, with the choice behind each point.
//   CostGraph graph;  int a = graph.add_node({{1, 5}, {3, 2}});  int b = graph.add_node({{2, 2}});
//   graph.add_edge(a, b, {{0, 1}, {0, 0}});  auto points = track_frontier(graph);
#pragma once

#include <cstddef>
#include <vector>

namespace tessel::planner {

// Memory in bytes per device and time in seconds per iteration; both add up over a graph.
struct Cost {
  double memory = 0;
  double time = 0;
  bool operator==(const Cost& other) const { return memory == other.memory && time == other.time; }
};

// Nodes choose one of their strategies; a choice costs the sum of every node's cost for its
// strategy and every edge's cost for the strategies at its two ends.
class CostGraph {
 public:
  struct Node {
    std::vector<Cost> strategies;
  };
  struct Edge {
    int from = 0, to = 0;
    std::vector<Cost> costs;  // [from strategy * strategies(to) + to strategy]
  };

  int add_node(std::vector<Cost> strategies);
  // `costs` has strategies(from) * strategies(to) entries, row-major by `from`.
  void add_edge(int from, int to, std::vector<Cost> costs);
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  // The total cost of one strategy index per node.
  Cost evaluate(const std::vector<int>& choice) const;

 private:
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
};

struct FrontierPoint {
  Cost cost;
  std::vector<int> choice;  // strategy index per node
};

struct FrontierOptions {
  // Most points kept per partial frontier (per pair of boundary strategies); 0 keeps all (exact).
  // When a partial frontier grows past it, the extremes and points spread evenly along the curve
  // are kept, so the result may miss points between kept ones (never the two extremes of a
  // partial frontier).
  size_t max_points = 0;
};

struct FrontierStats {
  int leaf_eliminations = 0;    // degree-1 nodes folded into their neighbour
  int series_eliminations = 0;  // degree-2 nodes replaced by an edge between their neighbours
  int parallel_merges = 0;      // two edges between the same nodes summed into one
  int conditioned_nodes = 0;    // nodes fixed strategy by strategy where no reduction applied
  int thinned = 0;              // partial frontiers cut down to max_points
  size_t largest_frontier = 0;  // most points any partial frontier held (after pruning)
};

// Keeps the points no other point dominates (another with memory <= and time <=, one of them
// strictly); of equal points the first is kept. Sorted by memory, then time.
std::vector<FrontierPoint> pareto_front(std::vector<FrontierPoint> points);

// The frontier of the whole graph by series-parallel reductions: leaf and series node
// eliminations and parallel edge merges, each merging frontiers and dropping dominated points.
// Graphs that are not series-parallel (no node of degree <= 2 left) are solved by conditioning:
// the node of highest degree is fixed to each of its strategies in turn and the results united,
// which stays exact. Sorted by memory; exact when options.max_points is 0.
std::vector<FrontierPoint> track_frontier(const CostGraph& graph,
                                          const FrontierOptions& options = {},
                                          FrontierStats* stats = nullptr);

// Every combination of strategies, for checking track_frontier on small graphs. Throws when the
// graph has more than `max_combinations` choices.
std::vector<FrontierPoint> brute_force_frontier(const CostGraph& graph,
                                                size_t max_combinations = 10'000'000);

}  // namespace tessel::planner
