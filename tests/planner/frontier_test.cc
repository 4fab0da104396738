// Frontier tracking must return exactly the Pareto frontier brute-force enumeration finds, on
// series-parallel graphs and on graphs that need conditioning, with the plan behind each point.
#include "parallel/planner/frontier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "tests/testing.h"

namespace tessel::planner {
namespace {

std::vector<Cost> random_costs(std::mt19937& rng, size_t count, int max_memory, int max_time) {
  std::uniform_int_distribution<int> memory(0, max_memory), time(0, max_time);
  std::vector<Cost> costs(count);
  for (Cost& cost : costs)
    cost = {static_cast<double>(memory(rng)), static_cast<double>(time(rng))};
  return costs;
}

int add_random_node(CostGraph& graph, std::mt19937& rng) {
  std::uniform_int_distribution<int> strategies(1, 3);
  return graph.add_node(random_costs(rng, strategies(rng), 9, 9));
}

void add_random_edge(CostGraph& graph, std::mt19937& rng, int from, int to) {
  const size_t entries =
      graph.nodes()[from].strategies.size() * graph.nodes()[to].strategies.size();
  graph.add_edge(from, to, random_costs(rng, entries, 2, 5));
}

// A random two-terminal series-parallel graph: start from one edge and repeatedly subdivide an
// edge (series) or add a path beside it (parallel), sometimes a direct second edge.
CostGraph random_series_parallel(std::mt19937& rng, int nodes) {
  CostGraph graph;
  std::vector<std::pair<int, int>> edges;
  const int source = add_random_node(graph, rng), sink = add_random_node(graph, rng);
  edges.emplace_back(source, sink);
  while (static_cast<int>(graph.nodes().size()) < nodes) {
    std::uniform_int_distribution<size_t> pick(0, edges.size() - 1);
    const size_t e = pick(rng);
    const auto [from, to] = edges[e];
    const int middle = add_random_node(graph, rng);
    if (std::bernoulli_distribution(0.5)(rng)) {
      edges[e] = {from, middle};
      edges.emplace_back(middle, to);
    } else {
      edges.emplace_back(from, middle);
      edges.emplace_back(middle, to);
    }
    if (std::bernoulli_distribution(0.1)(rng)) edges.emplace_back(from, to);  // a parallel edge
  }
  for (const auto& [from, to] : edges) add_random_edge(graph, rng, from, to);
  return graph;
}

std::set<std::pair<double, double>> point_set(const std::vector<FrontierPoint>& points) {
  std::set<std::pair<double, double>> set;
  for (const auto& point : points) set.insert({point.cost.memory, point.cost.time});
  return set;
}

::testing::AssertionResult matches_brute_force(const CostGraph& graph) {
  const auto tracked = track_frontier(graph);
  const auto expected = brute_force_frontier(graph);
  if (tracked.size() != expected.size() || point_set(tracked) != point_set(expected)) {
    auto result = ::testing::AssertionFailure() << "tracked:";
    for (const auto& p : tracked) result << " (" << p.cost.memory << ", " << p.cost.time << ")";
    result << "\nbrute force:";
    for (const auto& p : expected) result << " (" << p.cost.memory << ", " << p.cost.time << ")";
    return result;
  }
  for (const auto& point : tracked)
    if (!(graph.evaluate(point.choice) == point.cost))
      return ::testing::AssertionFailure()
             << "the plan behind (" << point.cost.memory << ", " << point.cost.time << ") costs ("
             << graph.evaluate(point.choice).memory << ", " << graph.evaluate(point.choice).time
             << ")";
  return ::testing::AssertionSuccess();
}

TEST(FrontierTracking, EqualsBruteForceOnRandomSeriesParallelGraphs) {
  for (unsigned seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const int nodes = 2 + static_cast<int>(seed % 8);  // 2..9 nodes, at most 3^9 choices
    CostGraph graph = random_series_parallel(rng, nodes);
    EXPECT_TRUE(matches_brute_force(graph)) << "seed " << seed << ", " << nodes << " nodes";
  }
}

TEST(FrontierTracking, EqualsBruteForceWhenConditioningIsNeeded) {
  // K4 (every node degree 3) and random graphs with extra cross edges are not series-parallel.
  for (unsigned seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(100 + seed);
    CostGraph graph;
    const int nodes = seed == 1 ? 4 : 5 + static_cast<int>(seed % 4);
    for (int v = 0; v < nodes; ++v) add_random_node(graph, rng);
    if (seed == 1) {
      for (int a = 0; a < 4; ++a)
        for (int b = a + 1; b < 4; ++b) add_random_edge(graph, rng, a, b);
    } else {
      std::uniform_int_distribution<int> pick(0, nodes - 1);
      for (int v = 1; v < nodes; ++v) add_random_edge(graph, rng, v - 1, v);
      for (int extra = 0; extra < nodes; ++extra) {
        const int a = pick(rng), b = pick(rng);
        if (a != b) add_random_edge(graph, rng, a, b);
      }
    }
    FrontierStats stats;
    track_frontier(graph, {}, &stats);
    if (seed == 1) {
      EXPECT_GE(stats.conditioned_nodes, 1);
    }
    EXPECT_TRUE(matches_brute_force(graph)) << "seed " << seed;
  }
}

TEST(FrontierTracking, HandlesDisconnectedGraphsAndSingleNodes) {
  CostGraph graph;
  graph.add_node({{1, 5}, {3, 2}, {3, 3}});
  graph.add_node({{2, 2}, {1, 4}});
  const auto points = track_frontier(graph);
  EXPECT_EQ(point_set(points), point_set(brute_force_frontier(graph)));
  // (1,5)+(1,4)=(2,9) (1,5)+(2,2)=(3,7) (3,2)+(1,4)=(4,6) (3,2)+(2,2)=(5,4)
  EXPECT_EQ(point_set(points),
            (std::set<std::pair<double, double>>{{2, 9}, {3, 7}, {4, 6}, {5, 4}}));
}

TEST(FrontierTracking, SeriesChainChoosesConsistentLayouts) {
  // Two strategies per node; switching between neighbours costs 10: the frontier keeps the
  // all-0 plan (memory 3, time 6) and the all-1 plan (memory 6, time 3), nothing mixed.
  CostGraph graph;
  for (int v = 0; v < 3; ++v) graph.add_node({{1, 2}, {2, 1}});
  for (int v = 0; v < 2; ++v) graph.add_edge(v, v + 1, {{0, 0}, {0, 10}, {0, 10}, {0, 0}});
  const auto points = track_frontier(graph);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].choice, (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(points[1].choice, (std::vector<int>{1, 1, 1}));
  EXPECT_TRUE(matches_brute_force(graph));
}

TEST(ParetoFront, DropsDominatedAndDuplicatePoints) {
  std::vector<FrontierPoint> points = {{{5, 5}, {0}}, {{1, 9}, {1}}, {{3, 3}, {2}},
                                       {{3, 4}, {3}}, {{9, 1}, {4}}, {{3, 3}, {5}},
                                       {{4, 3}, {6}}, {{2, 9}, {7}}, {{10, 1}, {8}}};
  const auto front = pareto_front(points);
  ASSERT_EQ(front.size(), 3u);
  EXPECT_EQ(front[0].cost, (Cost{1, 9}));
  EXPECT_EQ(front[1].cost, (Cost{3, 3}));
  EXPECT_EQ(front[1].choice, (std::vector<int>{2}));  // the first of two equal points
  EXPECT_EQ(front[2].cost, (Cost{9, 1}));
}

TEST(FrontierTracking, CapKeepsTheExtremes) {
  std::mt19937 rng(7);
  CostGraph graph;
  // A chain of nodes with many trade-offs: the exact frontier is large.
  for (int v = 0; v < 10; ++v) {
    std::vector<Cost> costs;
    for (int s = 0; s < 4; ++s) costs.push_back({static_cast<double>(s * (v + 1)), 4.0 - s});
    graph.add_node(costs);
    if (v > 0) add_random_edge(graph, rng, v - 1, v);
  }
  const auto exact = track_frontier(graph);
  FrontierOptions options;
  options.max_points = 4;
  FrontierStats stats;
  const auto capped = track_frontier(graph, options, &stats);
  EXPECT_GT(stats.thinned, 0);
  EXPECT_LE(capped.size(), 4u);
  EXPECT_EQ(capped.front().cost, exact.front().cost);  // least memory
  EXPECT_EQ(capped.back().cost, exact.back().cost);    // least time
  // Every capped point is achievable, and none beats the exact frontier.
  for (const auto& point : capped) {
    EXPECT_EQ(graph.evaluate(point.choice), point.cost);
    bool dominated_or_on = false;
    for (const auto& best : exact)
      dominated_or_on = dominated_or_on || (best.cost.memory <= point.cost.memory &&
                                            best.cost.time <= point.cost.time);
    EXPECT_TRUE(dominated_or_on);
  }
}

TEST(CostGraph, RejectsBadEdgesAndNodes) {
  CostGraph graph;
  EXPECT_TRUE(testing::throws_error([&] { graph.add_node({}); }, "has no strategy"));
  graph.add_node({{1, 1}, {2, 2}});
  graph.add_node({{1, 1}});
  EXPECT_TRUE(testing::throws_error([&] { graph.add_edge(0, 1, {{0, 0}}); }, "expected 2"));
  EXPECT_TRUE(testing::throws_error([&] { graph.add_edge(0, 5, {}); }, "does not exist"));
  EXPECT_TRUE(testing::throws_error([&] { graph.add_edge(1, 1, {{0, 0}}); }, "to itself"));
}

}  // namespace
}  // namespace tessel::planner
