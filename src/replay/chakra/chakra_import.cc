// import-chakra, streaming: each rank's file is read one node at a time (EtReader), mapped, put in topological
// order, and reduced to two parts before the next file is opened:
//   - its structure, everything of its mapped nodes that the graph keeps (kind, op, sizes, durations, names,
//     dependencies, Prism's stream and slot names) with each communication node naming a "ref" (a communicator
//     reference numbered in order of first use) instead of a process group or a peer; ranks with the same
//     structure share one RawClass, stored once;
//   - its binding, what differs between such ranks: per ref the process group, the peer's global rank and the
//     message tag, and the rank's GlobalMetadata.
// After the last file the cross-rank passes of the reference importer (chakra_import_document.cc) run on these:
// communicators per ref, the all-gather size check, p2p pairing, collective agreement, and the role classes,
// built once per distinct (structure, communicator pattern) and folded exactly as the reference folds them.
// Memory is the distinct structures plus a few hundred bytes per rank; the reference keeps every node of every
// rank. Files are read by a few threads and committed in rank order, so nothing depends on the threads. A late
// error names its node by reading that rank's file again (errors end the import).
//
// Files: chakra_import_stream.h declares the records, RankReader and StreamImporter; RankReader (one rank's file)
// is chakra_import_rank_reader.cc; the per-rank pass (structure and binding) is here; the cross-rank passes and
// the role classes are chakra_import_cross_rank.cc.
#include "replay/chakra/chakra_import.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "replay/chakra/chakra_import_internal.h"
#include "replay/chakra/chakra_import_stream.h"

namespace prism::chakra {

namespace fs = std::filesystem;

namespace streaming {

using namespace internal;

namespace {

// A mapped node's fixed-size part of its structure's key; its name, stream and slot names and dependencies follow.
struct NodeKeyHead {
  uint64_t cid, bytes, exact;
  double dur_us;
  int32_t root;
  uint32_t iter, ref, name_len, stream_len, slot_len, deps;
  uint8_t kind, op, dtype, flags;
};

}  // namespace

bool StreamImporter::Run(trace::Trace* out, std::string* error) {
  if (!StartImport(opts_, summary_, &files_, &groups_, error)) return false;
  world_ = static_cast<int32_t>(files_.paths.size());
  std::map<std::string, Group> metadata_groups;
  ranks_.resize(world_);
  if (!LoadRanks(&metadata_groups, error)) return false;
  MergeMetadataGroups(std::move(metadata_groups), &groups_, summary_);

  if (!ResolveComms(error)) return false;
  if (!CheckCommSizes(error)) return false;
  if (!CheckP2p(error)) return false;
  ComputeShapes();
  if (!CheckCollectives(error)) return false;
  DropUnusedComms();
  Build(out);
  return FinishImport(*out, summary_, error);
}

// ---- Per rank: structure and binding.

// Files are read by up to opts.threads threads (0: one per core, at most 4), rank r by thread r mod T; each
// rank is then committed in rank order, so the result and the first error (in rank order) do not depend on
// the threads.
bool StreamImporter::LoadRanks(std::map<std::string, Group>* metadata_groups, std::string* error) {
  int threads = opts_.threads > 0 ? opts_.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, opts_.threads > 0 ? 64 : 4);
  threads = std::min<int>(threads, world_);
  std::mutex mu;
  std::condition_variable cv;
  int32_t turn = 0;
  bool stop = false;
  auto work = [&](int t) {
    RankReader reader(world_, opts_);
    RankEffects effects;
    std::string err;
    for (int32_t r = t; r < world_; r += threads) {
      effects.Clear();
      const bool ok = reader.Load(r, files_.paths[r], &effects, &err);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return turn == r || stop; });
      if (stop) return;
      if (!ok) {
        *error = err;
        stop = true;
        cv.notify_all();
        return;
      }
      for (const auto& [k, v] : effects.not_represented) summary_->not_represented[k] += v;
      for (double us : effects.dropped_us) summary_->not_represented_us += us;
      for (auto& [k, g] : effects.pg_tables) metadata_groups->emplace(k, std::move(g));
      Commit(r, reader);
      ++turn;
      cv.notify_all();
    }
  };
  if (threads == 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(work, t);
    for (std::thread& th : pool) th.join();
  }
  return !stop;
}

void StreamImporter::Commit(int32_t r, const RankReader& rd) {
  RankRec& rec = ranks_[r];
  rec.from_prism = rd.from_prism;
  if (rd.prism_class) rec.prism_class = strings_.Id(*rd.prism_class);
  if (rd.prism_comms) rec.prism_comms = strings_.Id(*rd.prism_comms);
  if (r == 0) {
    rank0_.from_prism = rd.from_prism;
    rank0_.layout = rd.prism_layout;
    rank0_.topology = rd.prism_topology;
    rank0_.send_completion = rd.prism_send_completion;
  }

  // Refs in order of first use: (p2p, has_pg, pg, peer).
  const auto& mapped = rd.mapped();
  const uint32_t n = static_cast<uint32_t>(mapped.size());
  ref_of_.assign(n, kNone);
  ref_index_.clear();
  rec.ref_begin = static_cast<uint32_t>(refs_.size());
  uint32_t refs = 0;
  bool varies = false;
  for (uint32_t k = 0; k < n; ++k) {
    const RankReader::FileNode& fn = rd.node(mapped[k]);
    if (fn.kind == NodeKind::kCompute) continue;
    const bool p2p = fn.kind != NodeKind::kColl;
    RefKey key{p2p, fn.has_pg, rd.text(fn.pg), p2p ? fn.peer : -1};
    auto [it, fresh] = ref_index_.emplace(key, refs);
    if (fresh) {
      RankRef ref;
      ref.p2p = p2p;
      ref.has_pg = fn.has_pg;
      ref.pg = strings_.Id(key.pg);
      ref.peer = key.peer;
      ref.tag = fn.tag;
      refs_.push_back(ref);
      ++refs;
    } else if (p2p && refs_[rec.ref_begin + it->second].tag != fn.tag) {
      refs_[rec.ref_begin + it->second].tag_varies = true;
      varies = true;
    }
    ref_of_[k] = it->second;
  }
  rec.refs = refs;
  if (varies) {
    std::vector<int64_t>& tags = varied_tags_[r];
    tags.assign(n, 0);
    for (uint32_t k = 0; k < n; ++k) tags[k] = rd.node(mapped[k]).tag;
  }

  // The structure's key.
  key_.clear();
  KeyWriter w(&key_);
  w.Put(rd.from_prism);
  w.Put(n);
  for (uint32_t k = 0; k < n; ++k) {
    const RankReader::FileNode& fn = rd.node(mapped[k]);
    uint32_t nd = 0;
    const uint32_t* d = rd.mapped_deps(k, &nd);
    NodeKeyHead h;
    std::memset(&h, 0, sizeof h);  // Why: the padding is part of the key's bytes
    h.cid = rd.from_prism ? fn.cid : 0;
    h.bytes = fn.bytes;
    h.exact = fn.exact;
    h.dur_us = fn.dur_us;
    h.root = fn.root;
    h.iter = fn.iter;
    h.ref = ref_of_[k];
    h.name_len = fn.name.len;
    h.stream_len = fn.has_stream ? fn.stream.len : 0;
    h.slot_len = fn.has_slot ? fn.slot.len : 0;
    h.deps = nd;
    h.kind = static_cast<uint8_t>(fn.kind);
    h.op = static_cast<uint8_t>(fn.op);
    h.dtype = static_cast<uint8_t>(fn.dtype);
    h.flags = static_cast<uint8_t>(fn.cpu | fn.has_exact << 1 | fn.has_stream << 2 | fn.has_slot << 3);
    w.Put(h);
    key_.append(rd.text(fn.name));
    if (fn.has_stream) key_.append(rd.text(fn.stream));
    if (fn.has_slot) key_.append(rd.text(fn.slot));
    key_.append(reinterpret_cast<const char*>(d), nd * sizeof(uint32_t));
  }
  auto it = raw_index_.find(key_);
  if (it != raw_index_.end()) {
    rec.raw = it->second;
    return;
  }
  auto raw = std::make_unique<RawClass>();
  raw->key = key_;
  raw->from_prism = rd.from_prism;
  raw->nodes.resize(n);
  raw->ref_p2p.assign(refs, 0);
  raw->ref_first.assign(refs, kNone);
  raw->ref_nodes.assign(refs, {});
  raw->ref_sends.assign(refs, 0);
  raw->ref_recvs.assign(refs, 0);
  raw->ref_max_allgather.assign(refs, 0);
  // An optional attribute's text, when the node has it.
  auto text_if = [&](bool has, const auto& span) -> std::optional<std::string> {
    if (!has) return std::nullopt;
    return std::string(rd.text(span));
  };
  for (uint32_t k = 0; k < n; ++k) {
    const RankReader::FileNode& fn = rd.node(mapped[k]);
    uint32_t nd = 0;
    const uint32_t* d = rd.mapped_deps(k, &nd);
    RawNode& x = raw->nodes[k];
    x = RawNode{.cid = fn.cid, .kind = fn.kind, .op = fn.op, .cpu = fn.cpu, .dtype = fn.dtype, .root = fn.root,
                .iter = fn.iter, .ref = ref_of_[k], .bytes = fn.bytes,
                .exact_bytes = fn.has_exact ? std::optional<uint64_t>(fn.exact) : std::nullopt, .dur_us = fn.dur_us,
                .name = std::string(rd.text(fn.name)), .stream_attr = text_if(fn.has_stream, fn.stream),
                .slot_attr = text_if(fn.has_slot, fn.slot), .deps = std::vector<uint32_t>(d, d + nd)};
    if (x.ref == kNone) continue;
    const uint32_t j = x.ref;
    raw->ref_p2p[j] = x.kind != NodeKind::kColl;
    if (raw->ref_first[j] == kNone) raw->ref_first[j] = k;
    raw->ref_nodes[j].push_back(k);
    if (x.kind == NodeKind::kSend) raw->ref_sends[j] = 1;
    if (x.kind == NodeKind::kRecv) raw->ref_recvs[j] = 1;
    if (x.kind == NodeKind::kColl && x.op == CollOp::kAllGather && !x.exact_bytes) {
      // Why +1: 0 means "none", and a comm_size of 0 is never over the bound.
      raw->ref_max_allgather[j] = std::max(raw->ref_max_allgather[j], x.bytes + 1);
    }
  }
  rec.raw = static_cast<uint32_t>(raws_.size());
  raws_.push_back(std::move(raw));
  raw_index_.emplace(raws_.back()->key, rec.raw);
}

}  // namespace streaming

std::string ImportSummary::Format() const {
  std::ostringstream os;
  os << "ranks: " << world_size << " (" << (files.empty() ? "" : fs::path(files[0]).filename().string())
     << (files.size() > 1 ? " .. " + fs::path(files.back()).filename().string() : "") << ")\n";
  if (!comm_group_file.empty()) os << "comm groups: " << comm_group_file << "\n";
  os << "role classes: " << classes << "\n";
  os << "communicators: " << comms << "\n";
  uint64_t total = 0;
  for (const auto& [k, v] : imported) total += v;
  os << "nodes imported: " << total;
  for (const auto& [k, v] : imported) os << ", " << k << " " << v;
  os << "\nafter edges: " << after_edges << "\n";
  if (send_completion != trace::SendCompletion::kInvalid) {
    os << "send completion: " << trace::ToString(send_completion) << "\n";
  }
  uint64_t dropped = 0;
  for (const auto& [k, v] : not_represented) dropped += v;
  os << "not represented: " << dropped;
  for (const auto& [k, v] : not_represented) os << ", " << k << " " << v;
  if (not_represented_us > 0) os << " (" << not_represented_us << " us of duration_micros)";
  os << "\n";
  return os.str();
}

bool ImportChakra(const ImportOptions& opts, trace::Trace* out, ImportSummary* summary, std::string* error) {
  ImportSummary local;
  if (!summary) summary = &local;
  *summary = ImportSummary{};
  streaming::StreamImporter imp(opts, summary);
  return imp.Run(out, error);
}

}  // namespace prism::chakra
