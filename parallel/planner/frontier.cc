#include "parallel/planner/frontier.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace tessel::planner {

int CostGraph::add_node(std::vector<Cost> strategies) {
  TESSEL_CHECK(!strategies.empty(), "CostGraph: node ", nodes_.size(), " has no strategy");
  nodes_.push_back(Node{std::move(strategies)});
  return static_cast<int>(nodes_.size()) - 1;
}

void CostGraph::add_edge(int from, int to, std::vector<Cost> costs) {
  const int count = static_cast<int>(nodes_.size());
  TESSEL_CHECK(from >= 0 && from < count && to >= 0 && to < count, "CostGraph: edge ", from, " -> ",
               to, " names a node that does not exist (", count, " nodes)");
  TESSEL_CHECK(from != to, "CostGraph: edge from node ", from, " to itself");
  const size_t expected = nodes_[from].strategies.size() * nodes_[to].strategies.size();
  TESSEL_CHECK(costs.size() == expected, "CostGraph: edge ", from, " -> ", to, " has ",
               costs.size(), " costs, expected ", expected);
  edges_.push_back(Edge{from, to, std::move(costs)});
}

Cost CostGraph::evaluate(const std::vector<int>& choice) const {
  TESSEL_CHECK(choice.size() == nodes_.size(), "CostGraph::evaluate: ", choice.size(),
               " choices for ", nodes_.size(), " nodes");
  Cost total;
  for (size_t v = 0; v < nodes_.size(); ++v) {
    const Cost& cost = nodes_[v].strategies.at(choice[v]);
    total.memory += cost.memory;
    total.time += cost.time;
  }
  for (const Edge& edge : edges_) {
    const Cost& cost =
        edge.costs[choice[edge.from] * nodes_[edge.to].strategies.size() + choice[edge.to]];
    total.memory += cost.memory;
    total.time += cost.time;
  }
  return total;
}

std::vector<FrontierPoint> pareto_front(std::vector<FrontierPoint> points) {
  std::stable_sort(points.begin(), points.end(),
                   [](const FrontierPoint& a, const FrontierPoint& b) {
                     if (a.cost.memory != b.cost.memory) return a.cost.memory < b.cost.memory;
                     return a.cost.time < b.cost.time;
                   });
  std::vector<FrontierPoint> kept;
  for (auto& point : points)
    if (kept.empty() || point.cost.time < kept.back().cost.time) kept.push_back(std::move(point));
  return kept;
}

namespace {

// Plans behind partial frontier points, shared between points: a leaf (node, strategy) or the
// union of two plans. Entries are only added for points that survive pruning.
class PlanArena {
 public:
  int leaf(int node, int strategy) {
    entries_.push_back({-2 - node, strategy});
    return static_cast<int>(entries_.size()) - 1;
  }
  int join(int a, int b) {
    if (a < 0) return b;
    if (b < 0) return a;
    entries_.push_back({a, b});
    return static_cast<int>(entries_.size()) - 1;
  }
  void extract(int plan, std::vector<int>& choice) const {
    std::vector<int> stack;
    if (plan >= 0) stack.push_back(plan);
    while (!stack.empty()) {
      const Entry& entry = entries_[stack.back()];
      stack.pop_back();
      if (entry.left <= -2) {
        choice[-2 - entry.left] = entry.right;
      } else {
        stack.push_back(entry.left);
        stack.push_back(entry.right);
      }
    }
  }

 private:
  struct Entry {
    int left, right;
  };
  std::vector<Entry> entries_;
};

struct Point {
  double memory, time;
  int plan;  // into the PlanArena; -1: nothing chosen
};
using Front = std::vector<Point>;

// A point before pruning: the sum of two points whose plans are joined if it survives.
struct Candidate {
  double memory, time;
  int left, right;
};

struct Context {
  FrontierOptions options;
  FrontierStats stats;
  PlanArena arena;
  std::vector<Candidate> buffer;  // reused between merges
};

// Keeps the extremes and points spread evenly along the front's normalised arc length.
void thin(std::vector<Candidate>& front, size_t cap, Context& context) {
  const size_t n = front.size();
  if (cap == 0 || n <= cap) return;
  cap = std::max<size_t>(cap, 2);
  ++context.stats.thinned;
  const double memory_range = std::max(front.back().memory - front.front().memory, 1e-300);
  const double time_range = std::max(front.front().time - front.back().time, 1e-300);
  std::vector<double> arc(n, 0.0);
  for (size_t i = 1; i < n; ++i)
    arc[i] = arc[i - 1] + (front[i].memory - front[i - 1].memory) / memory_range +
             (front[i - 1].time - front[i].time) / time_range;
  std::vector<Candidate> kept;
  size_t index = 0;
  for (size_t j = 0; j < cap; ++j) {
    const double target = arc.back() * static_cast<double>(j) / static_cast<double>(cap - 1);
    while (index + 1 < n && std::abs(arc[index + 1] - target) <= std::abs(arc[index] - target))
      ++index;
    if (kept.empty() || kept.back().memory != front[index].memory ||
        kept.back().time != front[index].time)
      kept.push_back(front[index]);
  }
  front.swap(kept);
}

// Sorts candidates and drops dominated ones (and duplicates), then thins to the cap.
void prune(std::vector<Candidate>& candidates, Context& context) {
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.memory != b.memory) return a.memory < b.memory;
    return a.time < b.time;
  });
  size_t kept = 0;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (kept == 0 || candidates[i].time < candidates[kept - 1].time)
      candidates[kept++] = candidates[i];
  candidates.resize(kept);
  thin(candidates, context.options.max_points, context);
  context.stats.largest_frontier = std::max(context.stats.largest_frontier, candidates.size());
}

Front materialize(const std::vector<Candidate>& candidates, Context& context) {
  Front front;
  front.reserve(candidates.size());
  for (const Candidate& c : candidates)
    front.push_back({c.memory, c.time, context.arena.join(c.left, c.right)});
  return front;
}

void append_sums(const Front& a, const Front& b, std::vector<Candidate>& out) {
  for (const Point& x : a)
    for (const Point& y : b) out.push_back({x.memory + y.memory, x.time + y.time, x.plan, y.plan});
}

Front minkowski(const Front& a, const Front& b, Context& context) {
  context.buffer.clear();
  append_sums(a, b, context.buffer);
  prune(context.buffer, context);
  return materialize(context.buffer, context);
}

// The remaining problem: node frontiers per strategy and edge frontiers per strategy pair.
struct State {
  struct EdgeTable {
    int a = 0, b = 0;
    std::vector<Front> table;  // [sa * size(b) + sb]
  };
  std::vector<int> sizes;
  std::vector<std::vector<Front>> node;
  std::vector<char> alive;
  int alive_count = 0;
  std::vector<EdgeTable> edges;               // dead ones have an empty table
  std::vector<std::map<int, int>> adjacency;  // node -> neighbour -> edge index

  // The edge frontier for strategy su of u and sv of v (u, v the ends of edge e in any order).
  const Front& at(int e, int u, int su, int sv) const {
    const EdgeTable& edge = edges[e];
    return u == edge.a ? edge.table[su * sizes[edge.b] + sv] : edge.table[sv * sizes[edge.b] + su];
  }
  void remove_edge(int e) {
    adjacency[edges[e].a].erase(edges[e].b);
    adjacency[edges[e].b].erase(edges[e].a);
    edges[e].table.clear();
    edges[e].table.shrink_to_fit();
  }
  void remove_node(int v) {
    alive[v] = 0;
    --alive_count;
    node[v].clear();
  }
};

// Adds a table for (u, v), indexed [su * size(v) + sv]; sums it into an existing (u, v) edge.
void add_edge_table(State& state, int u, int v, std::vector<Front> table, Context& context) {
  auto found = state.adjacency[u].find(v);
  if (found == state.adjacency[u].end()) {
    State::EdgeTable edge{u, v, std::move(table)};
    state.edges.push_back(std::move(edge));
    const int e = static_cast<int>(state.edges.size()) - 1;
    state.adjacency[u][v] = e;
    state.adjacency[v][u] = e;
    return;
  }
  ++context.stats.parallel_merges;
  const int e = found->second;
  State::EdgeTable& edge = state.edges[e];
  for (int su = 0; su < state.sizes[u]; ++su)
    for (int sv = 0; sv < state.sizes[v]; ++sv) {
      Front& existing =
          edge.a == u ? edge.table[su * state.sizes[v] + sv] : edge.table[sv * state.sizes[u] + su];
      existing = minkowski(existing, table[su * state.sizes[v] + sv], context);
    }
}

// Folds degree-1 node w into its neighbour u.
void eliminate_leaf(State& state, int w, Context& context) {
  ++context.stats.leaf_eliminations;
  const auto [u, e] = *state.adjacency[w].begin();
  for (int su = 0; su < state.sizes[u]; ++su) {
    context.buffer.clear();
    for (int sw = 0; sw < state.sizes[w]; ++sw)
      append_sums(state.at(e, u, su, sw), state.node[w][sw], context.buffer);
    prune(context.buffer, context);
    Front through = materialize(context.buffer, context);
    state.node[u][su] = minkowski(state.node[u][su], through, context);
  }
  state.remove_edge(e);
  state.remove_node(w);
}

// Replaces degree-2 node w (neighbours u, v) by an edge u-v holding the best ways through w.
void eliminate_series(State& state, int w, Context& context) {
  ++context.stats.series_eliminations;
  auto it = state.adjacency[w].begin();
  const auto [u, eu] = *it++;
  const auto [v, ev] = *it;
  const int size_u = state.sizes[u], size_v = state.sizes[v], size_w = state.sizes[w];
  std::vector<Front> into(size_u * size_w);  // u-edge plus w itself, per (su, sw)
  for (int su = 0; su < size_u; ++su)
    for (int sw = 0; sw < size_w; ++sw)
      into[su * size_w + sw] = minkowski(state.at(eu, u, su, sw), state.node[w][sw], context);
  std::vector<Front> table(size_u * size_v);
  for (int su = 0; su < size_u; ++su)
    for (int sv = 0; sv < size_v; ++sv) {
      context.buffer.clear();
      for (int sw = 0; sw < size_w; ++sw)
        append_sums(into[su * size_w + sw], state.at(ev, w, sw, sv), context.buffer);
      prune(context.buffer, context);
      table[su * size_v + sv] = materialize(context.buffer, context);
    }
  state.remove_edge(eu);
  state.remove_edge(ev);
  state.remove_node(w);
  add_edge_table(state, u, v, std::move(table), context);
}

Front solve(State state, Context& context);

// Fixes node c to each strategy in turn: its edges become costs of its neighbours.
Front condition(State& state, int c, Context& context) {
  ++context.stats.conditioned_nodes;
  std::vector<Candidate> united;
  std::vector<Front> pieces;
  for (int sc = 0; sc < state.sizes[c]; ++sc) {
    State fixed = state;
    std::vector<std::pair<int, int>> neighbours(fixed.adjacency[c].begin(),
                                                fixed.adjacency[c].end());
    for (const auto& [n, e] : neighbours) {
      for (int sn = 0; sn < fixed.sizes[n]; ++sn)
        fixed.node[n][sn] = minkowski(fixed.node[n][sn], fixed.at(e, c, sc, sn), context);
      fixed.remove_edge(e);
    }
    Front own = fixed.node[c][sc];
    fixed.remove_node(c);
    pieces.push_back(minkowski(own, solve(std::move(fixed), context), context));
  }
  for (const Front& piece : pieces)
    for (const Point& p : piece) united.push_back({p.memory, p.time, p.plan, -1});
  prune(united, context);
  return materialize(united, context);
}

Front solve(State state, Context& context) {
  Front result{{0.0, 0.0, -1}};
  std::vector<int> queue;
  for (int v = 0; v < static_cast<int>(state.sizes.size()); ++v)
    if (state.alive[v] && state.adjacency[v].size() <= 2) queue.push_back(v);
  while (state.alive_count > 0) {
    int w = -1;
    while (!queue.empty()) {
      const int candidate = queue.back();
      queue.pop_back();
      if (state.alive[candidate] && state.adjacency[candidate].size() <= 2) {
        w = candidate;
        break;
      }
    }
    if (w < 0) {
      int best = -1;
      for (int v = 0; v < static_cast<int>(state.sizes.size()); ++v)
        if (state.alive[v] &&
            (best < 0 || state.adjacency[v].size() > state.adjacency[best].size()))
          best = v;
      return minkowski(result, condition(state, best, context), context);
    }
    std::vector<int> neighbours;
    for (const auto& entry : state.adjacency[w]) neighbours.push_back(entry.first);
    const size_t degree = neighbours.size();
    if (degree == 0) {
      context.buffer.clear();
      for (const Front& front : state.node[w])
        for (const Point& p : front) context.buffer.push_back({p.memory, p.time, p.plan, -1});
      prune(context.buffer, context);
      Front component = materialize(context.buffer, context);
      result = minkowski(result, component, context);
      state.remove_node(w);
    } else if (degree == 1) {
      eliminate_leaf(state, w, context);
    } else {
      eliminate_series(state, w, context);
    }
    for (int n : neighbours)
      if (state.alive[n] && state.adjacency[n].size() <= 2) queue.push_back(n);
  }
  return result;
}

}  // namespace

std::vector<FrontierPoint> track_frontier(const CostGraph& graph, const FrontierOptions& options,
                                          FrontierStats* stats) {
  Context context;
  context.options = options;
  State state;
  const int count = static_cast<int>(graph.nodes().size());
  state.sizes.resize(count);
  state.node.resize(count);
  state.alive.assign(count, 1);
  state.alive_count = count;
  state.adjacency.resize(count);
  for (int v = 0; v < count; ++v) {
    const auto& strategies = graph.nodes()[v].strategies;
    state.sizes[v] = static_cast<int>(strategies.size());
    for (int s = 0; s < state.sizes[v]; ++s)
      state.node[v].push_back(
          Front{{strategies[s].memory, strategies[s].time, context.arena.leaf(v, s)}});
  }
  for (const auto& edge : graph.edges()) {
    std::vector<Front> table;
    table.reserve(edge.costs.size());
    for (const Cost& cost : edge.costs) table.push_back(Front{{cost.memory, cost.time, -1}});
    add_edge_table(state, edge.from, edge.to, std::move(table), context);
  }
  Front front = solve(std::move(state), context);
  std::vector<FrontierPoint> points;
  for (const Point& p : front) {
    FrontierPoint point;
    point.cost = {p.memory, p.time};
    point.choice.assign(count, -1);
    context.arena.extract(p.plan, point.choice);
    for (int v = 0; v < count; ++v)
      TESSEL_CHECK(point.choice[v] >= 0, "track_frontier: internal error, node ", v,
                   " has no strategy in a plan");
    points.push_back(std::move(point));
  }
  if (stats) *stats = context.stats;
  return points;
}

std::vector<FrontierPoint> brute_force_frontier(const CostGraph& graph, size_t max_combinations) {
  const size_t count = graph.nodes().size();
  double combinations = 1;
  for (const auto& node : graph.nodes()) combinations *= node.strategies.size();
  TESSEL_CHECK(combinations <= static_cast<double>(max_combinations),
               "brute_force_frontier: ", combinations, " combinations exceed the limit of ",
               max_combinations);
  std::vector<FrontierPoint> points;
  std::vector<int> choice(count, 0);
  while (true) {
    points.push_back({graph.evaluate(choice), choice});
    size_t v = 0;
    while (v < count && ++choice[v] == static_cast<int>(graph.nodes()[v].strategies.size()))
      choice[v++] = 0;
    if (v == count) break;
  }
  return pareto_front(std::move(points));
}

}  // namespace tessel::planner
