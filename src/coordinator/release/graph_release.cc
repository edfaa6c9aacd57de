#include "coordinator/release/graph_release.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "common/log.h"
#include "replay/cost_model.h"
#include "replay/topology.h"
#include "replay/trace_io.h"

namespace prism::coord {
namespace {

// Nodes a virtual rank advances per step of Idle (~1 us each). Why 16: a message that arrives meanwhile waits for
// the step (the stop check runs between steps); ~16 us, against the ~40 us round trip of a release.
constexpr uint64_t kIdleSteps = 16;
// Virtual members Predict may advance (kIdleSteps nodes each) when they have not reached the operation yet. Why so
// few: Predict runs on the coordinator's event loop without the idle work's stop check; a world collective has every
// rank as a partner, and advancing them all there held the loop for milliseconds. Idle (interruptible) does the
// rest, and the coordinator asks again once it did (PredictEpoch).
constexpr int kPredictAdvances = 4;

int64_t UsToNs(double us) { return us > 0 ? static_cast<int64_t>(std::llround(us * 1000.0)) : 0; }

// The kOpArrive `op` a graph node stands for (ipc.h: CollOp, or 100 + NodeKind for p2p).
uint32_t IpcOpOf(const trace::Node& n) {
  if (n.kind == trace::NodeKind::kColl) return static_cast<uint32_t>(n.op);
  return 100 + static_cast<uint32_t>(n.kind);
}

}  // namespace

GraphRelease::GraphRelease(trace::Trace trace, std::vector<int> real_ranks) : trace_(std::move(trace)) {
  classes_.resize(trace_.classes.size());
  for (size_t c = 0; c < trace_.classes.size(); ++c) {
    const trace::RoleClass& rc = trace_.classes[c];
    ClassInfo& ci = classes_[c];
    ci.slot_nodes.resize(rc.comm_slots.size());
    ci.slot_colls.resize(rc.comm_slots.size());
    for (uint32_t s = 0; s < rc.streams.size(); ++s) {
      for (uint32_t k = 0; k < rc.streams[s].nodes.size(); ++k) {
        const trace::Node& n = rc.streams[s].nodes[k];
        ci.by_id[n.id] = NodeRef{s, k};
        if (n.kind == trace::NodeKind::kCompute || n.comm_slot >= rc.comm_slots.size()) continue;
        ci.slot_nodes[n.comm_slot].push_back(n.id);
        if (n.kind == trace::NodeKind::kColl) {
          ci.ordinal[n.id] = static_cast<uint32_t>(ci.slot_colls[n.comm_slot].size());
          ci.slot_colls[n.comm_slot].push_back(n.id);
        } else {
          auto& list = ci.p2p[{n.comm_slot, n.kind, n.peer}];
          ci.ordinal[n.id] = static_cast<uint32_t>(list.size());
          list.push_back(n.id);
        }
      }
    }
  }
  // A slot whose operations lie on several streams is sequenced by node id, as the replay engine does
  // (docs/trace-format.md): torch issues one communicator's forward all-reduces on one stream and its backward ones
  // on another, and libprism's sequence counts them in issue order. In stream order they would map a real rank's
  // n-th operation to another node, whose virtual partners then wait on the real rank's later operations.
  for (size_t c = 0; c < classes_.size(); ++c) {
    ClassInfo& ci = classes_[c];
    auto by_id = [](std::vector<uint32_t>* ids) {
      std::stable_sort(ids->begin(), ids->end());
    };
    auto multi_stream = [&](const std::vector<uint32_t>& ids) {
      for (uint32_t id : ids)
        if (ci.by_id.at(id).stream != ci.by_id.at(ids.front()).stream) return true;
      return false;
    };
    for (auto& ids : ci.slot_nodes)
      if (!ids.empty() && multi_stream(ids)) by_id(&ids);
    for (auto& ids : ci.slot_colls) {
      if (ids.empty() || !multi_stream(ids)) continue;
      by_id(&ids);
      for (uint32_t k = 0; k < ids.size(); ++k) ci.ordinal[ids[k]] = k;
    }
    for (auto& [key, ids] : ci.p2p) {
      if (ids.empty() || !multi_stream(ids)) continue;
      by_id(&ids);
      for (uint32_t k = 0; k < ids.size(); ++k) ci.ordinal[ids[k]] = k;
    }
  }
  {
    std::set<uint32_t> iters;
    for (const auto& rc : trace_.classes)
      for (const auto& st : rc.streams)
        for (const auto& n : st.nodes) iters.insert(n.iter);
    if (iters.size() >= 2 && *iters.begin() == 0) steady_iter_ = *std::next(iters.begin());
    else if (!iters.empty()) steady_iter_ = *iters.begin();
  }
  for (size_t c = 0; c < classes_.size(); ++c) {
    ClassInfo& ci = classes_[c];
    const trace::RoleClass& rc = trace_.classes[c];
    for (const auto& st : rc.streams) {
      uint32_t k = 0;
      while (k < st.nodes.size() && st.nodes[k].iter < steady_iter_) ++k;
      ci.stream_steady.push_back(k < st.nodes.size() ? k : 0);
    }
    for (const auto& ids : ci.slot_nodes) {
      uint32_t k = 0;
      while (k < ids.size() && rc.streams[ci.by_id.at(ids[k]).stream].nodes[ci.by_id.at(ids[k]).index].iter < steady_iter_)
        ++k;
      ci.slot_steady.push_back(k < ids.size() ? k : 0);
    }
  }
  for (size_t g = 0; g < trace_.comms.size(); ++g) {
    std::vector<int32_t> m = trace_.comms[g].ranks;
    std::sort(m.begin(), m.end());
    comm_by_members_[std::move(m)].push_back(static_cast<int>(g));
  }
  for (size_t g = 0; g < trace_.comms.size(); ++g) comm_index_.emplace(trace_.comms[g].id, static_cast<uint32_t>(g));
  is_real_.assign(trace_.ranks.size(), 0);
  for (int r : real_ranks)
    if (r >= 0 && static_cast<size_t>(r) < is_real_.size()) is_real_[static_cast<size_t>(r)] = 1;
  queued_.assign(trace_.ranks.size(), 0);
  clock_.assign(trace_.ranks.size(), 0);
  cursor_.resize(trace_.ranks.size());
  for (size_t r = 0; r < trace_.ranks.size(); ++r)
    cursor_[r].assign(trace_.classes[trace_.ranks[r].cls].streams.size(), {0u, 0u});
  ComputeAliases();
}

void GraphRelease::ComputeAliases() {
  alias_.resize(trace_.ranks.size());
  for (size_t r = 0; r < alias_.size(); ++r) alias_[r] = static_cast<int>(r);
  coll_parts_.clear();
  aliased_ = 0;
  if (!symmetry_) return;
  const trace::Layout& L = trace_.layout;
  if (L.ep != 1 || L.dp < 3 || static_cast<int64_t>(L.tp) * L.cp * L.dp * L.pp != static_cast<int64_t>(alias_.size()))
    return;
  // The stride of the data-parallel coordinate in the layout's order (leftmost fastest).
  int64_t stride = 1;
  bool found = false;
  for (size_t a = 0, b; a <= L.order.size(); a = b + 1) {
    b = L.order.find('-', a);
    if (b == std::string::npos) b = L.order.size();
    const std::string dim = L.order.substr(a, b - a);
    if (dim == "dp") {
      found = true;
      break;
    }
    stride *= dim == "tp" ? L.tp : dim == "cp" ? L.cp : dim == "pp" ? L.pp : 1;
  }
  if (!found) return;
  const int n = static_cast<int>(alias_.size());
  auto replica = [&](int r) { return static_cast<int>((r / stride) % L.dp); };
  auto in_replica = [&](int r, int d) { return static_cast<int>(r - replica(r) * stride + d * stride); };
  // Replicas that must stay whole: those holding a real rank or a straggler.
  std::vector<char> whole(static_cast<size_t>(L.dp), 0);
  for (int r = 0; r < n; ++r)
    if (IsReal(r) || (!compute_scale_.empty() && compute_scale_[static_cast<size_t>(r)] != 1.0))
      whole[static_cast<size_t>(replica(r))] = 1;
  int rep_replica = -1;
  for (int d = 0; d < L.dp && rep_replica < 0; ++d)
    if (!whole[static_cast<size_t>(d)]) rep_replica = d;
  if (rep_replica < 0) return;
  std::vector<int> alias(alias_);
  for (int r = 0; r < n; ++r)
    if (!whole[static_cast<size_t>(replica(r))]) alias[static_cast<size_t>(r)] = in_replica(r, rep_replica);
  // Only when the graph is parallel across replicas: a rank and its representative are of one class, and each of their
  // communicators is either the same one (spanning replicas) or the same members moved to the representative replica.
  std::map<uint32_t, const trace::Comm*> by_id;
  for (const trace::Comm& c : trace_.comms) by_id[c.id] = &c;
  for (int r = 0; r < n; ++r) {
    const int a = alias[static_cast<size_t>(r)];
    if (a == r) continue;
    const trace::RankBinding &br = trace_.ranks[static_cast<size_t>(r)], &ba = trace_.ranks[static_cast<size_t>(a)];
    if (br.cls != ba.cls || br.comms.size() != ba.comms.size()) return;
    for (size_t s = 0; s < br.comms.size(); ++s) {
      if (br.comms[s] == ba.comms[s]) continue;
      auto cr = by_id.find(br.comms[s]), ca = by_id.find(ba.comms[s]);
      if (cr == by_id.end() || ca == by_id.end() || cr->second->ranks.size() != ca->second->ranks.size()) return;
      for (size_t m = 0; m < cr->second->ranks.size(); ++m)
        if (alias[static_cast<size_t>(cr->second->ranks[m])] != ca->second->ranks[m]) return;
    }
  }
  alias_ = std::move(alias);
  for (int r = 0; r < n; ++r) aliased_ += alias_[static_cast<size_t>(r)] != r;
}

std::unique_ptr<GraphRelease> GraphRelease::Load(const std::string& path, int world_size,
                                                 std::vector<int> real_ranks, std::string* error) {
  trace::Trace t;
  if (!replay::ReadTrace(path, &t, error)) return nullptr;
  if (world_size > 0 && t.world_size != world_size) {
    *error = path + ": graph world size " + std::to_string(t.world_size) + " differs from --world-size " +
             std::to_string(world_size);
    return nullptr;
  }
  for (int r : real_ranks) {
    if (r < 0 || r >= t.world_size) {
      *error = path + ": real rank " + std::to_string(r) + " is outside the graph's world";
      return nullptr;
    }
  }
  return std::make_unique<GraphRelease>(std::move(t), std::move(real_ranks));
}

bool GraphRelease::Steady(int rank, uint32_t node) const { return NodeOf(rank, node).iter >= steady_iter_; }

bool GraphRelease::IsReal(int rank) const {
  return rank >= 0 && static_cast<size_t>(rank) < is_real_.size() && is_real_[static_cast<size_t>(rank)] != 0;
}

const trace::Node& GraphRelease::NodeOf(int rank, uint32_t id) const {
  uint32_t cls = trace_.ranks[rank].cls;
  NodeRef ref = classes_[cls].by_id.at(id);
  return trace_.classes[cls].streams[ref.stream].nodes[ref.index];
}

std::optional<uint32_t> GraphRelease::SlotOf(int rank, uint32_t comm) const {
  const auto& b = trace_.ranks[rank].comms;
  for (uint32_t s = 0; s < b.size(); ++s)
    if (b[s] == trace_.comms[comm].id) return s;
  return std::nullopt;
}

std::optional<int> GraphRelease::GraphComm(const CommView& comm) const {
  // Why by member set and twin ordinal: torch makes a pipeline pair's send/recv communicator beside the pipeline
  // group with the same members (and description); the n-th created is the n-th in the graph.
  std::vector<int32_t> m(comm.members.begin(), comm.members.end());
  std::sort(m.begin(), m.end());
  auto it = comm_by_members_.find(m);
  if (it == comm_by_members_.end()) return std::nullopt;
  const std::vector<int>& twins = it->second;
  // The description first when it tells the twins apart: the graph's twins are in first-use order, the live ones in
  // creation order (CommView::desc).
  if (!comm.desc.empty()) {
    std::optional<int> named;  // the desc_twin-th twin of that description, else the last of them
    uint32_t k = 0;
    for (int g : twins) {
      if (trace_.comms[static_cast<size_t>(g)].desc != comm.desc) continue;
      named = g;
      if (k++ == comm.desc_twin) break;
    }
    if (named) return named;
  }
  return twins[std::min<size_t>(comm.member_twin, twins.size() - 1)];
}

bool GraphRelease::MapOp(int rank, uint32_t gcomm, uint64_t seq, Inst* out) const {
  if (rank < 0 || rank >= static_cast<int>(trace_.ranks.size())) return false;
  std::optional<uint32_t> slot = SlotOf(rank, gcomm);
  if (!slot) return false;
  const ClassInfo& ci = classes_[trace_.ranks[rank].cls];
  const auto& nodes = ci.slot_nodes[*slot];
  if (nodes.empty()) return false;
  if (seq < nodes.size()) {
    *out = Inst{rank, 0, nodes[seq]};
    return true;
  }
  // Later repetitions hold the steady iterations only (the job does not repeat its set-up operations).
  const uint64_t start = ci.slot_steady[*slot], period = nodes.size() - start, j = seq - nodes.size();
  *out = Inst{rank, static_cast<uint32_t>(1 + j / period), nodes[start + j % period]};
  return true;
}

bool GraphRelease::Partners(const Inst& i, std::vector<Inst>* out) const {
  out->clear();
  const trace::Node& n = NodeOf(i.rank, i.node);
  if (n.kind == trace::NodeKind::kCompute) return false;
  const uint32_t cls = trace_.ranks[i.rank].cls;
  const uint32_t comm_id = trace_.ranks[i.rank].comms[n.comm_slot];
  auto gi = comm_index_.find(comm_id);
  if (gi == comm_index_.end()) return false;
  const uint32_t g = gi->second;
  const trace::Comm& comm = trace_.comms[g];
  const uint32_t k = classes_[cls].ordinal.at(i.node);
  if (n.kind == trace::NodeKind::kColl) {
    const auto& parts = CollParts(g, k);
    if (parts.empty()) return false;
    out->reserve(parts.size());
    for (const auto& [m, node] : parts) out->push_back(Inst{m, i.rep, node});
    return true;
  }
  int32_t me = static_cast<int32_t>(std::find(comm.ranks.begin(), comm.ranks.end(), i.rank) - comm.ranks.begin());
  if (n.peer < 0 || n.peer >= static_cast<int32_t>(comm.ranks.size())) return false;
  int32_t peer = comm.ranks[n.peer];
  std::optional<uint32_t> s = SlotOf(peer, g);
  if (!s) return false;
  trace::NodeKind other = n.kind == trace::NodeKind::kSend ? trace::NodeKind::kRecv : trace::NodeKind::kSend;
  const auto& p2p = classes_[trace_.ranks[peer].cls].p2p;
  auto it = p2p.find({*s, other, me});
  if (it == p2p.end() || k >= it->second.size()) return false;
  out->push_back(i);
  out->push_back(Inst{alias_[static_cast<size_t>(peer)], i.rep, it->second[k]});
  return true;
}

const std::vector<std::pair<int, uint32_t>>& GraphRelease::CollParts(uint32_t g, uint32_t k) const {
  auto [it, fresh] = coll_parts_.try_emplace({g, k});
  if (!fresh) return it->second;
  std::vector<std::pair<int, uint32_t>> parts;
  std::set<int> seen;
  for (int32_t m : trace_.comms[g].ranks) {
    std::optional<uint32_t> s = SlotOf(m, g);
    const auto* colls = s ? &classes_[trace_.ranks[m].cls].slot_colls[*s] : nullptr;
    if (!colls || k >= colls->size()) {
      parts.clear();
      break;
    }
    // A member of a replica another one stands for takes part through its representative (same class, same node).
    const int a = alias_[static_cast<size_t>(m)];
    if (seen.insert(a).second) parts.emplace_back(a, (*colls)[k]);
  }
  it->second = std::move(parts);
  return it->second;
}

std::optional<GraphRelease::CollKey> GraphRelease::CollKeyOf(const Inst& inst) const {
  const trace::Node& n = NodeOf(inst.rank, inst.node);
  if (n.kind != trace::NodeKind::kColl) return std::nullopt;
  const auto& binding = trace_.ranks[inst.rank].comms;
  if (n.comm_slot >= binding.size()) return std::nullopt;
  auto gi = comm_index_.find(binding[n.comm_slot]);
  if (gi == comm_index_.end()) return std::nullopt;
  return CollKey{gi->second, inst.rep, classes_[trace_.ranks[inst.rank].cls].ordinal.at(inst.node)};
}

void GraphRelease::NoteArrival(const Inst& inst, int64_t at, bool overwrite) {
  auto [it, fresh] = arrival_.try_emplace(inst, at);
  if (!fresh) {
    if (!overwrite || it->second == at) return;
    it->second = at;
  }
  ++arrivals_noted_;
  if (std::optional<CollKey> key = CollKeyOf(inst)) {
    CollState& st = coll_state_[*key];
    if (fresh) ++st.arrived;
    st.have = false;  // recomputed on the next Completion (a real rank's arrival may move it)
    const auto& parts = CollParts(key->g, key->k);
    if (!parts.empty() && st.arrived >= parts.size())
      for (const auto& [m, node] : parts) Queue(m);
    return;
  }
  QueuePartners(inst);
}

struct GraphRelease::Model {
  replay::CostModel cost;
  std::map<uint32_t, replay::CommTuning> tuning;  // per graph communicator, made on first use
};

bool GraphRelease::SetCostModel(const replay::Topology& topology, std::string* error) {
  auto m = std::make_shared<Model>();
  if (!m->cost.Init(topology, replay::CostModelOptions{}, error)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  model_ = std::move(m);
  return true;
}

bool GraphRelease::UseTopology(const std::string& option, std::string* error) {
  replay::Topology topo;
  const std::string spec = replay::TopologySpec(option, trace_.topology);
  if (!replay::LoadTopology(spec, &topo, error)) {
    *error = "topology " + spec + ": " + *error;
    return false;
  }
  return SetCostModel(topo, error);
}

int64_t GraphRelease::ModelNs(int rank, uint32_t node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (rank < 0 || static_cast<size_t>(rank) >= trace_.ranks.size()) return -1;
  const ClassInfo& ci = classes_[trace_.ranks[static_cast<size_t>(rank)].cls];
  if (!ci.by_id.contains(node_id)) return -1;
  return ModelNsLocked(rank, node_id);
}

int64_t GraphRelease::ModelNsLocked(int rank, uint32_t node_id) {
  if (!model_) return -1;
  const trace::Node& n = NodeOf(rank, node_id);
  if (n.kind == trace::NodeKind::kCompute || n.comm_slot == trace::kNoIndex) return -1;
  const uint32_t comm = trace_.ranks[static_cast<size_t>(rank)].comms[n.comm_slot];
  if (comm >= trace_.comms.size()) return -1;
  const std::vector<int32_t>& members = trace_.comms[comm].ranks;
  if (n.kind == trace::NodeKind::kColl) {
    auto it = model_->tuning.find(comm);
    if (it == model_->tuning.end())
      it = model_->tuning.emplace(comm, model_->cost.Tune(model_->cost.Shape(members.data(), members.size()))).first;
    return UsToNs(model_->cost.Collective(it->second, n.op, n.bytes, n.dtype).time_us);
  }
  // A send/receive pair: the sender's and the receiver's global ranks, as the engine prices a message.
  if (n.peer < 0 || static_cast<size_t>(n.peer) >= members.size()) return -1;
  const int32_t me = rank, other = members[static_cast<size_t>(n.peer)];
  const bool send = n.kind == trace::NodeKind::kSend;
  return UsToNs(model_->cost.SendRecv(n.bytes, send ? me : other, send ? other : me).time_us);
}

int64_t GraphRelease::DurationNs(const std::vector<Inst>& parts) {
  // The graph's recorded duration wins (the longest any participant recorded); else what the shims sent.
  int64_t dur = -1;
  for (const Inst& p : parts) {
    double us = NodeOf(p.rank, p.node).dur_us;
    if (us >= 0) dur = std::max(dur, UsToNs(us));
  }
  if (dur >= 0) return dur;
  for (const Inst& p : parts) {
    auto it = shim_dur_.find(p);
    if (it != shim_dur_.end()) dur = std::max(dur, it->second);
  }
  if (dur >= 0) return dur;
  if (dur = parts.empty() ? -1 : ModelNsLocked(parts.front().rank, parts.front().node); dur >= 0) {
    ++stats_.modelled;
    return dur;
  }
  ++stats_.no_duration;
  return 0;
}

std::optional<int64_t> GraphRelease::Completion(const Inst& i, int* last_rank) {
  // A collective: known once its members all arrived (counted as they do), computed once per instance.
  std::optional<CollKey> key = CollKeyOf(i);
  CollState* st = nullptr;
  if (key) {
    st = &coll_state_[*key];
    const auto& cparts = CollParts(key->g, key->k);
    if (cparts.empty() || st->arrived < cparts.size()) return std::nullopt;
    if (st->have) {
      if (last_rank) *last_rank = cparts.size() > 1 ? st->last_rank : -1;
      return st->completion;
    }
  }
  std::vector<Inst> parts;
  if (!Partners(i, &parts)) return std::nullopt;
  int64_t latest = 0;
  int last = -1;
  for (const Inst& p : parts) {
    auto it = arrival_.find(p);
    if (it == arrival_.end()) return std::nullopt;
    if (last < 0 || it->second > latest) {
      latest = it->second;
      last = p.rank;
    }
  }
  if (last_rank) *last_rank = parts.size() > 1 ? last : -1;
  const int64_t done = latest + DurationNs(parts);
  if (st) {
    st->have = true;
    st->completion = done;
    st->last_rank = last;
  }
  return done;
}

int64_t GraphRelease::ComputeNs(int rank, const trace::Node& n) const {
  const double f = compute_scale_.empty() ? 1.0 : compute_scale_[static_cast<size_t>(rank)];
  return UsToNs(n.dur_us * f);
}

bool GraphRelease::SetStragglers(const std::vector<std::pair<int32_t, double>>& stragglers, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> scale(trace_.ranks.size(), 1.0);
  for (auto [rank, f] : stragglers) {
    if (rank < 0 || static_cast<size_t>(rank) >= trace_.ranks.size()) {
      *error = "straggler rank " + std::to_string(rank) + " is outside the graph's world (size " +
               std::to_string(trace_.ranks.size()) + ")";
      return false;
    }
    if (!(f > 0)) {
      *error = "straggler factor for rank " + std::to_string(rank) + " must be > 0";
      return false;
    }
    if (IsReal(rank)) {
      *error = "straggler rank " + std::to_string(rank) +
               " runs for real: its compute is measured on the GPU, not replayed; name a virtual rank";
      return false;
    }
    scale[static_cast<size_t>(rank)] = f;
  }
  compute_scale_ = std::move(scale);
  ComputeAliases();  // a straggler's replica must stay whole
  return true;
}

int64_t GraphRelease::LocalOffsetNs(int rank, uint32_t target) {
  // The rank alone, communication taking no time: when it reaches `target` after its own compute.
  const trace::RoleClass& rc = trace_.classes[trace_.ranks[rank].cls];
  std::map<uint32_t, int64_t> fin;
  std::vector<uint32_t> cur(rc.streams.size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (uint32_t s = 0; s < rc.streams.size(); ++s) {
      while (cur[s] < rc.streams[s].nodes.size()) {
        const trace::Node& n = rc.streams[s].nodes[cur[s]];
        int64_t start = cur[s] > 0 ? fin[rc.streams[s].nodes[cur[s] - 1].id] : 0;
        bool ready = true;
        for (uint32_t a : n.after) {
          auto it = fin.find(a);
          if (it == fin.end()) {
            ready = false;
            break;
          }
          start = std::max(start, it->second);
        }
        if (!ready) break;
        if (n.id == target) return start;
        fin[n.id] = start + (n.kind == trace::NodeKind::kCompute ? ComputeNs(rank, n) : 0);
        ++cur[s];
        progress = true;
      }
    }
  }
  return 0;
}

int GraphRelease::PopWork() {
  // The rank furthest behind in graph time first: the virtual world advances in time order, so the ranks a decision
  // at time T needs are done before those far ahead of it (in stack order, a few ranks ran a repetition ahead while
  // the one a stage-1 receive needed waited: 2.4 ms p99 decisions in real-time closed loop).
  size_t best = 0;
  for (size_t i = 1; i < work_.size(); ++i)
    if (clock_[work_[i]] < clock_[work_[best]]) best = i;
  const int v = work_[best];
  work_[best] = work_.back();
  work_.pop_back();
  queued_[v] = 0;
  return v;
}

void GraphRelease::Queue(int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= queued_.size() || IsReal(rank) || queued_[rank] ||
      alias_[static_cast<size_t>(rank)] != rank)
    return;
  queued_[rank] = 1;
  work_.push_back(rank);
}

void GraphRelease::QueueAll() {
  for (int v = 0; v < static_cast<int>(trace_.ranks.size()); ++v) Queue(v);
}

void GraphRelease::QueuePartners(const Inst& inst) {
  if (NodeOf(inst.rank, inst.node).kind == trace::NodeKind::kCompute) return;
  std::vector<Inst> parts;
  if (!Partners(inst, &parts)) return;
  for (const Inst& p : parts)
    if (p.rank != inst.rank) Queue(p.rank);
}

bool GraphRelease::Advance(int v, uint64_t max_steps) {
  const trace::RoleClass& rc = trace_.classes[trace_.ranks[v].cls];
  uint64_t steps = 0;
  // Why until no stream moves: a stream's node may wait (`after`) on another stream of the same rank.
  for (bool progress = true; progress;) {
    progress = false;
    for (uint32_t s = 0; s < rc.streams.size(); ++s) {
      const auto& nodes = rc.streams[s].nodes;
      if (nodes.empty()) continue;
      auto& [rep, idx] = cursor_[v][s];
      // Why a bound: a virtual rank that waits on no real rank would otherwise run through endless repetitions;
      // one repetition ahead of the furthest real rank is all a decision can need.
      while (rep <= bound_) {
        if (steps >= max_steps) return true;
        const trace::Node& n = nodes[idx];
        Inst inst{v, rep, n.id};
        int64_t start = anchor_ns_;
        bool ready = true;
        const uint32_t first = rep > 0 ? classes_[trace_.ranks[v].cls].stream_steady[s] : 0;
        if (idx > first || rep > 0) {
          Inst prev = idx > first ? Inst{v, rep, nodes[idx - 1].id} : Inst{v, rep - 1, nodes.back().id};
          auto it = finish_.find(prev);
          ready = it != finish_.end();
          if (ready) start = it->second;
        }
        for (uint32_t a : n.after) {
          if (!ready) break;
          if (rep > 0 && !Steady(v, a)) continue;  // a set-up node: done in the first repetition
          auto it = finish_.find(Inst{v, rep, a});
          ready = it != finish_.end();
          if (ready) start = std::max(start, it->second);
        }
        if (!ready) break;
        NoteArrival(inst, start, /*overwrite=*/false);
        int64_t end = 0;
        if (n.kind == trace::NodeKind::kCompute) {
          end = start + ComputeNs(v, n);
        } else {
          std::optional<int64_t> c = Completion(inst, nullptr);
          if (!c) break;  // a participant has not arrived: conservative, wait for it (its arrival queues this rank)
          end = *c;
        }
        finish_[inst] = end;
        clock_[v] = std::max(clock_[v], end);
        progress = true;
        ++steps;
        if (++idx == nodes.size()) {
          idx = classes_[trace_.ranks[v].cls].stream_steady[s];
          ++rep;
        }
      }
    }
  }
  return false;
}

bool GraphRelease::Drain(uint64_t steps_per_rank, std::optional<std::chrono::steady_clock::time_point> until,
                         uint64_t* counter, const std::function<bool()>& stop) {
  while (!work_.empty()) {
    const int v = PopWork();
    if (Advance(v, steps_per_rank)) Queue(v);
    ++*counter;
    if (until && std::chrono::steady_clock::now() >= *until) break;
    if (stop && stop()) break;
  }
  return !work_.empty();
}

void GraphRelease::Pump() {
  if (!anchored_) return;
  // The same fixed point as advancing every virtual rank until none moves (what this did before the worklist):
  // a rank's next node needs its own earlier nodes (Advance runs them), its partners' arrivals (each new arrival
  // queues the partners) and the repetition bound (raising it queues every rank).
  Drain(UINT64_MAX, std::nullopt, &stats_.decide_steps, {});
}

ReleaseDecision GraphRelease::Decide(const CommView& comm, uint64_t seq, std::span<const Arrival> arrivals) {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<int> g = GraphComm(comm);
  // Per arrival, the graph nodes of its unit: a group's operations on one stream arrive as one unit (ipc.h
  // OpArrive::nops, `op` 0 when they differ, e.g. a pipeline send and receive), sequence numbers seq .. seq+nops-1.
  std::vector<std::vector<Inst>> units(arrivals.size());
  bool ok = g.has_value() && !arrivals.empty();
  for (size_t k = 0; ok && k < arrivals.size(); ++k) {
    const uint32_t op = arrivals[k].op.op;
    const uint32_t nops = std::max<uint32_t>(arrivals[k].op.nops, 1);
    for (uint32_t j = 0; ok && j < nops; ++j) {
      Inst inst{};
      ok = MapOp(arrivals[k].rank, static_cast<uint32_t>(*g), seq + j, &inst);
      if (ok) {
        const trace::Node& n = NodeOf(inst.rank, inst.node);
        ok = op == 0 ? n.kind != trace::NodeKind::kCompute : IpcOpOf(n) == op;
      }
      if (!ok) {
        Log("coord")->warn("graph: rank {} comm {} seq {} op {} does not match the graph's node; default release",
                           arrivals[k].rank, comm.comm_id, seq + j, op);
      }
      units[k].push_back(inst);
    }
  }
  if (!ok) {
    ++stats_.unmatched;
    return DefaultRelease(comm, seq, arrivals);
  }
  for (size_t k = 0; k < arrivals.size(); ++k) {
    const int64_t at = static_cast<int64_t>(uint64_t{arrivals[k].op.arrival_ns});
    if (!anchored_) {
      // Why: graph time 0 is when the real rank started its own graph; it reaches this node after its own compute.
      // Every rank of the graph starts then (all ranks begin together, as the replay engine assumes).
      anchor_ns_ = at - LocalOffsetNs(units[k][0].rank, units[k][0].node);
      anchored_ = true;
      QueueAll();
    }
    for (const Inst& inst : units[k]) {
      shim_dur_[inst] = static_cast<int64_t>(uint64_t{arrivals[k].op.model_dur_ns});
      NoteArrival(inst, at, /*overwrite=*/true);
      if (inst.rep > rep_limit_) {
        rep_limit_ = inst.rep;
        if (bound_ < rep_limit_ + 1) {
          bound_ = rep_limit_ + 1;
          QueueAll();  // the bound on how far virtual ranks run ahead was lifted (Idle had not done it yet)
        }
      }
    }
  }
  // The unit completes when its last operation does (each with its own partners).
  ReleaseDecision d;
  int64_t release = INT64_MIN;  // units[0] is never empty, so one of the loops below sets it
  bool blocked = false;
  auto decide = [&] {
    release = INT64_MIN;
    blocked = false;
    for (const Inst& inst : units[0]) {
      int last = -1;
      std::optional<int64_t> ci;
      if (Lockstep(inst)) {
        // The real members' arrivals decide (SetLockstepSlots: the rank's own, and another real member's when
        // there is one: all of them arrived before a decision); the virtual peers keep the graph's rule.
        std::vector<Inst> parts;
        Partners(inst, &parts);
        int64_t latest = arrival_.at(inst);
        last = inst.rank;
        for (const Inst& p : parts) {
          auto it = arrival_.find(p);
          if (IsReal(p.rank) && it != arrival_.end() && it->second > latest) {
            latest = it->second;
            last = p.rank;
          }
        }
        ci = latest + DurationNs(parts);
      } else {
        ci = Completion(inst, &last);
      }
      if (!ci) {
        blocked = true;
        break;
      }
      if (*ci > release) {
        release = *ci;
        d.last_rank = last;
      }
    }
  };
  // Why first without advancing the virtual ranks: once every participant has arrived the completion is fixed
  // (arrivals are set once), so the answer needs no more; the virtual ranks' next steps are left to Idle or to the
  // next decision that needs them.
  decide();
  if (blocked && anchored_) {
    // Only as far as this decision needs (the rest stays queued for Idle): the worklist one step of one rank at a
    // time, the answer looked at after each. Why not Pump: at a repetition's start the idle work may not have caught
    // up, and advancing every virtual rank to its bound there held the answer for milliseconds (2.5-2.8 ms p99 in
    // real-time closed loop on the filled w64 graph; 2.2 ms median on the H200 for stage 1's first receive).
    std::vector<Inst> parts;
    for (const Inst& inst : units[0]) {
      Partners(inst, &parts);
      for (const Inst& p : parts)
        if (!IsReal(p.rank) && !arrival_.count(p)) Queue(p.rank);
    }
    Drain(kIdleSteps, std::nullopt, &stats_.decide_steps, [&] {
      decide();
      return !blocked;
    });
  }
  for (const Inst& inst : units[0]) stats_.lockstep += Lockstep(inst) ? 1 : 0;  // once per decision, not per pass
  if (!blocked) {
    ++stats_.decided;
  } else {
    // A virtual participant cannot reach this operation before a real rank reports an operation it waits for. The
    // policy must answer now, so: the arrivals known (real ones, virtual ones already computed) decide.
    ++stats_.blocked;
    Log("coord")->warn("graph: comm {} seq {}: a virtual member is blocked on a real rank's later operation; "
                       "releasing on the arrivals known",
                       comm.comm_id, seq);
    release = INT64_MIN;
    for (const Inst& inst : units[0]) {
      std::vector<Inst> parts;
      Partners(inst, &parts);
      if (stats_.blocked <= 20) LogBlockedPartners(parts);
      int64_t latest = 0;
      for (const Inst& p : parts) {
        auto it = arrival_.find(p);
        if (it != arrival_.end() && it->second >= latest) {
          latest = it->second;
          d.last_rank = p.rank;
        }
      }
      release = std::max(release, latest + DurationNs(parts));
    }
  }
  if (release == INT64_MIN) release = 0;
  d.release_ns = static_cast<uint64_t>(release);
  for (const auto& unit : units)
    for (const Inst& i : unit) finish_[i] = release;
  return d;
}

bool GraphRelease::Idle(int64_t budget_ns, const std::function<bool()>& stop) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!anchored_) return false;
  if (work_.empty() && bound_ < rep_limit_ + 2) {
    bound_ = rep_limit_ + 2;
    QueueAll();
  }
  // Why a step limit: one rank's whole repetition can take milliseconds, and a message that arrives meanwhile
  // waits for it (the coordinator's loop is single-threaded).
  return Drain(kIdleSteps, std::chrono::steady_clock::now() + std::chrono::nanoseconds(budget_ns),
               &stats_.idle_steps, [&] {
                 if (!stop || !stop()) return false;
                 ++stats_.idle_stopped;
                 return true;
               });
}

std::optional<ReleasePolicy::Prerelease> GraphRelease::Predict(const CommView& comm, uint64_t seq, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!anchored_ || !IsReal(rank)) return std::nullopt;
  std::optional<int> g = GraphComm(comm);
  Inst inst{};
  if (!g || !MapOp(rank, static_cast<uint32_t>(*g), seq, &inst)) return std::nullopt;
  if (inst.rep > bound_) return std::nullopt;  // the virtual ranks are not let that far yet
  std::vector<Inst> parts;
  if (!Partners(inst, &parts)) return std::nullopt;
  Prerelease pr;
  int64_t latest = 0;
  int advances = 0;
  const bool lockstep = Lockstep(inst);
  for (const Inst& p : parts) {
    if (p == inst) continue;
    if (lockstep && !IsReal(p.rank)) continue;  // not waited for (SetLockstepSlots): floor 0, the rank's arrival
    if (IsReal(p.rank)) return std::nullopt;  // another real member: its arrival decides too
    auto it = arrival_.find(p);
    if (it == arrival_.end()) {
      // Why advance here: Idle may not have reached this rank yet (its worklist runs in stack order), and the rank
      // needs the answer before it arrives. The same fixed point as Pump: the rank moves as far as its inputs allow.
      if (++advances > kPredictAdvances) return std::nullopt;
      if (Advance(p.rank, kIdleSteps)) Queue(p.rank);
      it = arrival_.find(p);
      if (it == arrival_.end()) return std::nullopt;
    }
    // Ties as Completion breaks them: the first of the participants in Partners' order.
    if (pr.floor_rank < 0 || it->second > latest) {
      latest = it->second;
      pr.floor_rank = p.rank;
    }
  }
  pr.floor_ns = static_cast<uint64_t>(std::max<int64_t>(latest, 0));
  if (lockstep && pr.floor_rank < 0) pr.floor_rank = rank;  // as Decide names it: the rank's own arrival decides
  pr.op = IpcOpOf(NodeOf(inst.rank, inst.node));
  // DurationNs's rule without the shims' durations: the graph's recorded duration, else (-1) the real rank's own
  // model duration, the only shim duration Decide will have for this operation.
  for (const Inst& p : parts) {
    const double us = NodeOf(p.rank, p.node).dur_us;
    if (us >= 0) pr.dur_ns = std::max(pr.dur_ns, UsToNs(us));
  }
  ++stats_.predicted;
  return pr;
}

uint64_t GraphRelease::PredictEpoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return arrivals_noted_ + bound_;
}

void GraphRelease::LogBlockedPartners(const std::vector<Inst>& parts) const {
  // Where each blocked virtual partner stands (docs/fill.md: the early releases that lose the pipeline wait).
  for (const Inst& p : parts) {
    if (IsReal(p.rank) || arrival_.count(p)) continue;
    const trace::RoleClass& rc = trace_.classes[trace_.ranks[p.rank].cls];
    for (uint32_t st = 0; st < rc.streams.size(); ++st) {
      const auto& nodes = rc.streams[st].nodes;
      if (std::none_of(nodes.begin(), nodes.end(), [&](const trace::Node& n) { return n.id == p.node; })) continue;
      const auto& [rep, idx] = cursor_[p.rank][st];
      const trace::Node& at = nodes[idx < nodes.size() ? idx : 0];
      Log("coord")->info("graph: blocked partner: virtual rank {} needs node {} (rep {}) on stream '{}' but stands at "
                         "node {} (rep {}, {} '{}')",
                         p.rank, p.node, p.rep, rc.streams[st].name, at.id, rep, trace::ToString(at.kind),
                         at.comm_slot < rc.comm_slots.size() ? rc.comm_slots[at.comm_slot] : std::string("-"));
    }
  }
}

void GraphRelease::SetLockstepSlots(const std::vector<std::string>& slots) {
  std::lock_guard<std::mutex> lock(mu_);
  lockstep_.assign(trace_.classes.size(), {});
  for (size_t c = 0; c < trace_.classes.size(); ++c) {
    const auto& names = trace_.classes[c].comm_slots;
    lockstep_[c].assign(names.size(), false);
    for (size_t k = 0; k < names.size(); ++k)
      // A second communicator over the same group is the builder's "tp#2": the same slot for this purpose.
      lockstep_[c][k] = std::any_of(slots.begin(), slots.end(), [&](const std::string& s) {
        return names[k] == s || names[k].rfind(s + "#", 0) == 0;
      });
  }
}

bool GraphRelease::Lockstep(const Inst& i) const {
  if (lockstep_.empty() || !IsReal(i.rank)) return false;
  const uint32_t cls = trace_.ranks[i.rank].cls;
  const trace::Node& n = NodeOf(i.rank, i.node);
  return n.kind == trace::NodeKind::kColl && cls < lockstep_.size() && n.comm_slot < lockstep_[cls].size() &&
         lockstep_[cls][n.comm_slot];
}

void GraphRelease::SetReplicaSymmetry(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  symmetry_ = on;
  ComputeAliases();
}

int GraphRelease::aliased_ranks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aliased_;
}

GraphRelease::Stats GraphRelease::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t GraphRelease::anchor_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return anchor_ns_;
}

std::optional<int64_t> GraphRelease::VirtualArrival(int rank, uint32_t rep, uint32_t node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Pump();
  const int r = rank >= 0 && static_cast<size_t>(rank) < alias_.size() ? alias_[static_cast<size_t>(rank)] : rank;
  auto it = arrival_.find(Inst{r, rep, node_id});
  if (it == arrival_.end()) return std::nullopt;
  return it->second;
}

}  // namespace prism::coord
