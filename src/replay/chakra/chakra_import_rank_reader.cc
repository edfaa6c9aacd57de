// import-chakra, streaming (chakra_import.cc says how): reading one rank's file node by node, mapping each node
// as the reference's RankLoader::Load and Classify do, and putting the mapped nodes in the reference's
// topological order, dependencies through nodes not represented included.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <tuple>

#include "prism/limits.h"
#include "replay/chakra/chakra_attrs.h"
#include "replay/chakra/chakra_et_reader.h"
#include "replay/chakra/chakra_import_internal.h"
#include "replay/chakra/chakra_import_stream.h"

namespace prism::chakra::streaming {

using namespace internal;

// Reads and maps rank `rank`'s file. The mapped nodes are then mapped_ (file indices in topological order)
// with mapped_deps(i).
bool RankReader::Load(int32_t rank, const std::string& path, RankEffects* effects, std::string* error) {
  rank_ = rank;
  path_ = &path;
  effects_ = effects;
  nodes_.clear();
  text_.clear();
  dep_cids_.clear();
  index_.Clear();
  if (!reader_.Open(path, error)) return false;
  ReadMetadata(reader_.metadata());

  std::string dup_error, classify_error;
  size_t classify_error_at = std::numeric_limits<size_t>::max();
  for (;;) {
    const int rc = reader_.Next(&view_, error);
    if (rc < 0) return false;
    if (rc == 0) break;
    const uint32_t i = static_cast<uint32_t>(nodes_.size());
    FileNode& n = nodes_.emplace_back();
    n.cid = view_.id;
    n.start = view_.start_time_micros;
    n.name = Keep(view_.name);
    n.dep_begin = static_cast<uint32_t>(dep_cids_.size());
    dep_cids_.insert(dep_cids_.end(), view_.data_deps.begin(), view_.data_deps.end());
    n.data_deps = static_cast<uint32_t>(view_.data_deps.size());
    if (opts_.ctrl_deps) {
      dep_cids_.insert(dep_cids_.end(), view_.ctrl_deps.begin(), view_.ctrl_deps.end());
      n.ctrl_deps = static_cast<uint32_t>(view_.ctrl_deps.size());
    }
    auto [first, fresh] = index_.Insert(view_.id, i);
    if (!fresh && dup_error.empty()) {
      dup_error = NodeRef(path, view_.id, std::string(view_.name)) + ": id used twice (nodes #" +
                  std::to_string(first) + " and #" + std::to_string(i) + " of the file)";
    }
    // Why keep reading after an error: the reference reads the whole file first (a broken message later in
    // the file is the error it reports), then checks ids, then classifies node by node.
    if (dup_error.empty() && classify_error.empty()) {
      std::string dropped_as;
      if (!Classify(view_, &n, &dropped_as, &classify_error)) {
        classify_error_at = i;
      } else {
        n.kept = dropped_as.empty();
        if (!n.kept) {
          effects_->not_represented[dropped_as]++;
          if (view_.duration_micros != 0) effects_->dropped_us.push_back(static_cast<double>(view_.duration_micros));
        }
      }
    }
  }
  if (!dup_error.empty()) {
    *error = dup_error;
    return false;
  }
  return Order(classify_error_at, classify_error, error);
}

void RankReader::ReadMetadata(const et::GlobalMetadata& m) {
  auto get = [&](const char* name, std::optional<std::string>* v) {
    *v = std::nullopt;
    for (const auto& a : m.attr()) {
      if (a.name() == name) {
        *v = AttrString(a);
        return true;
      }
    }
    return false;
  };
  from_prism = get(kAttrClass, &prism_class);
  get(kAttrLayout, &prism_layout);
  get(kAttrTopology, &prism_topology);
  get(kAttrSendCompletion, &prism_send_completion);
  get(kAttrComms, &prism_comms);
}

// Why by length and one letter: every attribute of every node is looked up; one comparison decides.
int RankReader::AttrIndex(std::string_view n) {
  auto is = [&n](std::string_view lit) { return std::memcmp(n.data(), lit.data(), lit.size()) == 0; };
  switch (n.size()) {
    case 7: return is(kAttrPgName) ? kPg : -1;
    case 8:
      switch (n[5]) {
        case 's': return is(kAttrCommSrc) ? kSrc : -1;
        case 'd': return is(kAttrCommDst) ? kDst : -1;
        case 't': return is(kAttrCommTag) ? kTag : -1;
        default: return -1;
      }
    case 9:
      switch (n[5]) {
        case 't': return is(kAttrCommType) ? kType : -1;
        case 's': return is(kAttrCommSize) ? kSize : -1;
        case 'u': return is(kAttrIsCpuOp) ? kCpu : -1;
        default: return -1;
      }
    case 10:
      switch (n[6]) {
        case 's': return is(kAttrSlot) ? kSlot : -1;
        case 'i': return is(kAttrIter) ? kIter : -1;
        case 'r': return is(kAttrRoot) ? kRoot : -1;
        default: return -1;
      }
    case 11:
      switch (n[6]) {
        case 'd': return is(kAttrDtype) ? kDtype : -1;
        case 'b': return is(kAttrBytes) ? kBytes : -1;
        default: return -1;
      }
    case 12:
      switch (n[6]) {
        case 's': return is(kAttrStream) ? kStream : -1;
        case 'd': return is(kAttrDurUs) ? kDurUs : -1;
        default: return -1;
      }
    default: return -1;
  }
}

// The reference's Classify, on a view: fills *r for a node Prism represents, or sets *dropped_as.
bool RankReader::Classify(const EtNodeView& c, FileNode* r, std::string* dropped_as, std::string* error) {
  const EtAttrView* at[kAttrs] = {};
  for (const EtAttrView& a : c.attrs) {
    const int k = AttrIndex(a.name);
    if (k >= 0 && !at[k]) at[k] = &a;
  }
  auto fail = [&](const std::string& what) {
    *error = NodeRef(*path_, c.id, std::string(c.name)) + " (" + NodeTypeName(c.type) + "): " + what;
    return false;
  };
  auto int_attr = [&](Attr k, const char* name, std::optional<int64_t>* v) {
    *v = std::nullopt;
    const EtAttrView* a = at[k];
    if (!a) return true;
    *v = AttrInt(*a);
    if (!*v) return fail(std::string("attribute ") + name + " holds " + std::string(AttrValueKind(*a)) +
                         ", not an integer");
    return true;
  };
  auto rank_attr = [&](Attr k, const char* name, std::optional<int64_t>* v) {
    if (!int_attr(k, name, v)) return false;
    if (*v && (**v < 0 || **v >= world_)) {
      return fail(std::string(name) + " = " + std::to_string(**v) + " is not a rank of this " +
                  std::to_string(world_) + "-rank trace");
    }
    return true;
  };
  auto string_attr = [&](Attr k, Span* s, bool* has) {
    *has = false;
    if (!at[k]) return;
    const int vc = at[k]->value_case;
    if (vc == et::AttributeProto::kStringVal || vc == et::AttributeProto::kBytesVal) {
      *s = Keep(at[k]->s);
      *has = true;
    }
  };

  string_attr(kStream, &r->stream, &r->has_stream);
  string_attr(kSlot, &r->slot, &r->has_slot);
  if (const EtAttrView* a = at[kIter]) {
    auto v = AttrInt(*a);
    if (!v || *v < 0 || *v > std::numeric_limits<uint32_t>::max()) return fail("bad prism_iter");
    r->iter = static_cast<uint32_t>(*v);
  }
  if (const EtAttrView* a = at[kCpu]) r->cpu = AttrInt(*a).value_or(0) != 0;
  std::optional<double> exact_dur;
  if (const EtAttrView* a = at[kDurUs]) exact_dur = AttrDouble(*a);
  auto bad_duration = [&](double d) { return !(d >= 0 && d <= limits::kMaxDurationUs); };
  auto duration_error = [&](double d) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "duration %.6g us is outside 0..%.0e", d, limits::kMaxDurationUs);
    return fail(buf);
  };

  switch (c.type) {
    case et::COMP_NODE:
      r->kind = NodeKind::kCompute;
      r->dur_us = exact_dur ? *exact_dur : static_cast<double>(c.duration_micros);
      if (bad_duration(r->dur_us)) return duration_error(r->dur_us);
      return true;
    case et::COMM_COLL_NODE:
    case et::COMM_SEND_NODE:
    case et::COMM_RECV_NODE:
      break;
    default: {
      *dropped_as = NodeTypeName(c.type);
      std::map<std::string, Group> found;
      if (c.type == et::METADATA_NODE &&
          ParsePgTable(std::string(c.inputs_values), world_, &found, NodeRef(*path_, c.id, std::string(c.name)))) {
        *dropped_as = "METADATA_NODE (process-group table, used for communicators)";
        for (auto& [k, g] : found) effects_->pg_tables.emplace(k, std::move(g));
      }
      return true;
    }
  }

  // Communication.
  if (const EtAttrView* a = at[kPg]) {
    const int vc = a->value_case;
    if (vc == et::AttributeProto::kStringVal || vc == et::AttributeProto::kBytesVal) {
      r->pg = Keep(a->s);
    } else if (auto i = AttrInt(*a)) {
      r->pg = Keep(std::to_string(*i));
    } else {
      return fail("attribute pg_name holds " + std::string(AttrValueKind(*a)) + ", not a string");
    }
    r->has_pg = r->pg.len > 0;
  }
  if (const EtAttrView* a = at[kDtype]) {
    const int vc = a->value_case;
    const bool text = vc == et::AttributeProto::kStringVal || vc == et::AttributeProto::kBytesVal;
    r->dtype = text ? trace::ParseDType(a->s) : trace::DType::kInvalid;
    if (r->dtype == trace::DType::kInvalid) return fail("unknown prism_dtype");
  }
  r->dur_us = exact_dur ? *exact_dur : c.duration_micros > 0 ? static_cast<double>(c.duration_micros) : -1.0;
  if (r->dur_us != -1.0 && bad_duration(r->dur_us)) return duration_error(r->dur_us);
  std::optional<int64_t> size, type, src, dst, tag, root, exact_bytes;
  if (!int_attr(kSize, kAttrCommSize, &size) || !int_attr(kType, kAttrCommType, &type) ||
      !rank_attr(kSrc, kAttrCommSrc, &src) || !rank_attr(kDst, kAttrCommDst, &dst) ||
      !int_attr(kTag, kAttrCommTag, &tag) || !int_attr(kRoot, kAttrRoot, &root) ||
      !int_attr(kBytes, kAttrBytes, &exact_bytes)) {
    return false;
  }
  if (size && (*size < 0 || static_cast<uint64_t>(*size) > limits::kMaxBytes))
    return fail("comm_size " + std::to_string(*size) + " is outside 0.." + std::to_string(limits::kMaxBytes));
  if (exact_bytes && (*exact_bytes < 0 || static_cast<uint64_t>(*exact_bytes) > limits::kMaxBytes))
    return fail("prism_bytes " + std::to_string(*exact_bytes) + " is outside 0.." + std::to_string(limits::kMaxBytes));
  if (exact_bytes) {
    r->has_exact = true;
    r->exact = static_cast<uint64_t>(*exact_bytes);
  }
  r->bytes = size ? static_cast<uint64_t>(*size) : 0;
  r->tag = tag.value_or(0);

  if (c.type == et::COMM_COLL_NODE) {
    if (!type) return fail("no comm_type attribute (which collective is it?)");
    bool representable = true;
    r->op = MapCommType(*type, &representable);
    if (!representable) {
      *dropped_as = "COMM_COLL_NODE " + CommTypeName(*type);
      return true;
    }
    if (r->op == CollOp::kInvalid) return fail("comm_type " + std::to_string(*type) + " is not a CollectiveCommType");
    if (!size && r->op != CollOp::kBarrier) return fail("no comm_size attribute");
    r->kind = NodeKind::kColl;
    if (r->op == CollOp::kBroadcast || r->op == CollOp::kReduce) {
      r->root = static_cast<int32_t>(root.value_or(0));  // Chakra has no root: 0 unless we wrote one
    }
    return true;
  }
  const bool send = c.type == et::COMM_SEND_NODE;
  if (send ? !dst : !src) {
    *dropped_as = NodeTypeName(c.type) + (send ? " without comm_dst" : " without comm_src");
    return true;
  }
  if (!size) return fail("no comm_size attribute");
  if (send && src && *src != rank_) {
    return fail("comm_src " + std::to_string(*src) + " is not this file's rank " + std::to_string(rank_));
  }
  if (!send && dst && *dst != rank_) {
    return fail("comm_dst " + std::to_string(*dst) + " is not this file's rank " + std::to_string(rank_));
  }
  r->peer = static_cast<int32_t>(send ? *dst : *src);
  if (r->peer == rank_) return fail("sends to itself");
  r->kind = send ? NodeKind::kSend : NodeKind::kRecv;
  return true;
}

// Dependencies, the topological order and dependencies through dropped nodes: the reference's, in the same
// order (its errors included).
bool RankReader::Order(size_t classify_error_at, const std::string& classify_error, std::string* error) {
  const size_t n = nodes_.size();
  deps_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (i == classify_error_at) {
      *error = classify_error;
      return false;
    }
    FileNode& c = nodes_[i];
    c.eff_begin = static_cast<uint32_t>(deps_.size());
    for (uint32_t k = 0; k < c.data_deps + c.ctrl_deps; ++k) {
      const uint64_t d = dep_cids_[c.dep_begin + k];
      const char* what = k < c.data_deps ? "data_dep" : "ctrl_dep";
      const uint32_t at = index_.Find(d);
      if (at == kNone) {
        *error = NodeRef(*path_, c.cid, std::string(text(c.name))) + ": " + what + " " + std::to_string(d) +
                 " names no node in the file";
        return false;
      }
      if (at == i) {
        *error = NodeRef(*path_, c.cid, std::string(text(c.name))) + ": depends on itself (" + what + ")";
        return false;
      }
      const uint32_t* b = deps_.data() + c.eff_begin;
      const uint32_t* e = deps_.data() + deps_.size();
      if (std::find(b, e, at) == e) deps_.push_back(at);
    }
    c.eff_count = static_cast<uint32_t>(deps_.size() - c.eff_begin);
  }

  // Topological order; among nodes free to go the earlier (start time, id) first, as the reference.
  pending_.assign(n, 0);
  child_begin_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    pending_[i] = nodes_[i].eff_count;
    for (uint32_t k = 0; k < nodes_[i].eff_count; ++k) child_begin_[deps_[nodes_[i].eff_begin + k] + 1]++;
  }
  for (size_t i = 0; i < n; ++i) child_begin_[i + 1] += child_begin_[i];
  children_.resize(deps_.size());
  fill_.assign(child_begin_.begin(), child_begin_.end() - 1);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t k = 0; k < nodes_[i].eff_count; ++k) {
      children_[fill_[deps_[nodes_[i].eff_begin + k]]++] = static_cast<uint32_t>(i);
    }
  }
  heap_.clear();
  auto later = [](const Key& a, const Key& b) { return a > b; };
  auto push = [&](uint32_t i) {
    heap_.push_back(Key{nodes_[i].start, nodes_[i].cid, i});
    std::push_heap(heap_.begin(), heap_.end(), later);
  };
  for (size_t i = 0; i < n; ++i) {
    if (pending_[i] == 0) push(static_cast<uint32_t>(i));
  }
  order_.clear();
  while (!heap_.empty()) {
    std::pop_heap(heap_.begin(), heap_.end(), later);
    const uint32_t i = std::get<2>(heap_.back());
    heap_.pop_back();
    order_.push_back(i);
    for (uint32_t k = child_begin_[i]; k < child_begin_[i + 1]; ++k) {
      if (--pending_[children_[k]] == 0) push(children_[k]);
    }
  }
  if (order_.size() != n) {
    for (size_t i = 0; i < n; ++i) {
      if (pending_[i] != 0) {
        *error = NodeRef(*path_, nodes_[i].cid, std::string(text(nodes_[i].name))) + ": dependency cycle (" +
                 std::to_string(n - order_.size()) + " nodes never become ready)";
        return false;
      }
    }
  }

  // A kept node waits for the nearest kept ancestors along every path, in the file's order of its
  // dependencies, each once.
  through_begin_.assign(n, 0);
  through_count_.assign(n, 0);
  through_.clear();
  new_index_.assign(n, kNone);
  seen_.assign(n, kNone);
  mapped_.clear();
  mapped_deps_.clear();
  mapped_dep_begin_.clear();
  mapped_dep_count_.clear();
  eff_.clear();
  for (uint32_t i : order_) {
    eff_.clear();
    auto add = [&](uint32_t d) {
      if (seen_[d] != i) {
        seen_[d] = i;
        eff_.push_back(d);
      }
    };
    const FileNode& c = nodes_[i];
    for (uint32_t k = 0; k < c.eff_count; ++k) {
      const uint32_t d = deps_[c.eff_begin + k];
      if (nodes_[d].kept) {
        add(d);
      } else {
        for (uint32_t x = 0; x < through_count_[d]; ++x) add(through_[through_begin_[d] + x]);
      }
    }
    if (!c.kept) {
      through_begin_[i] = static_cast<uint32_t>(through_.size());
      through_count_[i] = static_cast<uint32_t>(eff_.size());
      through_.insert(through_.end(), eff_.begin(), eff_.end());
      continue;
    }
    mapped_dep_begin_.push_back(static_cast<uint32_t>(mapped_deps_.size()));
    mapped_dep_count_.push_back(static_cast<uint32_t>(eff_.size()));
    for (uint32_t d : eff_) mapped_deps_.push_back(new_index_[d]);
    new_index_[i] = static_cast<uint32_t>(mapped_.size());
    mapped_.push_back(i);
  }
  return true;
}

}  // namespace prism::chakra::streaming
