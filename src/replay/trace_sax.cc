// The streaming PrismTrace reader: nlohmann's SAX events go straight into trace::Trace, without a JSON document
// of the whole file (the document's allocation and freeing were most of `simulate`'s load time).
//
// Nodes, the bulk of a graph, are collected field by field (NodeFields) and parsed by the same ParseNode as the
// document reader; everything else (header fields, comm_slots, comms[i], rank_class[r], a topology object) is
// collected as a small JSON value and handed to the document reader's own function for that element
// (trace_parse.h). So both readers give the same Trace and the same first error.
//
// Order: a class's nodes need its name (for messages) and comm_slots (slot indices) first, a stream's nodes its
// name. nlohmann writes keys sorted ("comm_slots" < "name" < "streams", "name" < "nodes"), so written graphs
// stream. A class or stream whose node list comes before those keys is collected as a document and parsed by the
// document reader's function when it ends; a key repeated after a streamed node list (the document keeps the
// last value, which the stream has passed) makes the whole file go to the document reader (kIrregular).
#include <iterator>
#include <string>
#include <vector>

#include "replay/trace_io.h"
#include "replay/trace_parse.h"

namespace prism::replay {
namespace {

using namespace trace_parse;

// An input iterator over the bytes that publishes how far the parser has read, so that the handler can check a
// declared element count against the bytes that remain.
class CountingIter {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  CountingIter(const char* p, const char** pos) : p_(p), pos_(pos) {}
  reference operator*() const { return *p_; }
  CountingIter& operator++() {
    *pos_ = ++p_;
    return *this;
  }
  CountingIter operator++(int) {
    CountingIter t = *this;
    ++*this;
    return t;
  }
  bool operator==(const CountingIter& o) const { return p_ == o.p_; }
  bool operator!=(const CountingIter& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  const char** pos_;
};

// Runs one parsing step; the first failure of a section is kept in *slot (later ones are not looked at, as the
// document reader stops at the first). Messages as TraceFromJson makes them.
template <typename F>
void Try(std::string* slot, F&& f) {
  if (!slot->empty()) return;
  try {
    f();
  } catch (const ParseError& e) {
    *slot = e.what;
  } catch (const json::exception& e) {
    *slot = std::string("malformed trace: ") + e.what();
  }
}

class Handler {
 public:
  using binary_t = json::binary_t;

  Handler(const char* end, const char** pos, bool is_json) : end_(end), pos_(pos), is_json_(is_json) {}

  // --- nlohmann SAX interface ---
  bool null() { return Scalar(json(nullptr)); }
  bool boolean(bool v) { return Scalar(json(v)); }
  bool number_integer(json::number_integer_t v) { return Scalar(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Scalar(json(v)); }
  bool number_float(json::number_float_t v, const std::string&) { return Scalar(json(v)); }
  bool string(std::string& v) { return Scalar(json(std::move(v))); }
  bool binary(binary_t& v) { return Scalar(json(std::move(v))); }
  bool start_object(std::size_t len) { return Start(false, len); }
  bool start_array(std::size_t len) { return Start(true, len); }
  bool end_object() { return End(); }
  bool end_array() { return End(); }
  bool key(std::string& k) {
    if (capturing_) {
      cap_key_ = std::move(k);
    } else if (frames_.back() == Frame::kNode) {
      node_dest_ = nf_.Slot(k);
    } else {
      key_ = std::move(k);
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    parse_failed_ = true;
    return false;
  }

  SaxResult Finish(bool parsed, trace::Trace* out, std::string* error) {
    if (irregular_) return SaxResult::kIrregular;
    if (!limit_error_.empty()) {
      *error = limit_error_;
      return SaxResult::kError;
    }
    if (!parsed || parse_failed_) {
      *error = is_json_ ? "not valid JSON (truncated or malformed)" : "not valid CBOR (truncated or not a PrismTrace)";
      return SaxResult::kError;
    }
    std::string e;
    if (!top_object_) {
      e = "trace: top level must be an object";
    } else {
      Try(&e, [&] { ParseHeader(header_, &t_); });
      if (e.empty() && comms_.present && comms_.not_array) e = "comms: must be an array";
      if (e.empty()) e = comms_.error;
      if (e.empty() && (!classes_.present || classes_.not_array)) e = "trace: missing \"classes\" array";
      if (e.empty()) e = classes_.error;
      if (e.empty() && (!ranks_.present || ranks_.not_array)) e = "trace: missing \"rank_class\" array";
      if (e.empty()) e = ranks_.error;
    }
    if (!e.empty()) {
      *error = e;
      return SaxResult::kError;
    }
    *out = std::move(t_);
    return SaxResult::kOk;
  }

 private:
  enum class Frame : uint8_t { kTop, kComms, kClasses, kClass, kStreams, kStream, kNodes, kNode, kRanks };
  // What to do with a value collected as JSON once it is complete.
  enum class Done : uint8_t { kNothing, kComm, kClass, kStream, kNode, kRank };

  // A top-level array section (comms, classes, rank_class): present, not an array, first error.
  struct Section {
    bool present = false, not_array = false;
    std::string error;
    void Reset() { *this = Section{}; }
  };
  struct ClassState {
    json fields = json::object();  // name, comm_slots, and everything in document mode
    bool fast = false;             // its streams are being / were streamed
    bool dom = false;              // streams came before name or comm_slots: parsed as a document at the end
    SlotIndex slots;
    std::string where;
    uint32_t next_id = 0;
  };
  struct StreamState {
    json fields = json::object();
    bool fast = false, dom = false;
    std::string where;
  };

  // --- values ---
  bool Scalar(json&& v) {
    if (capturing_) {
      *CapSlot() = std::move(v);
      if (cap_stack_.empty()) EndCapture();
      return true;
    }
    if (frames_.empty()) return true;  // a scalar document: top_object_ stays false
    return Route(/*container=*/false, /*array=*/false, 0, &v);
  }

  bool Start(bool array, std::size_t len) {
    if (++depth_ > kSaxMaxDepth) {
      limit_error_ = "nesting deeper than " + std::to_string(kSaxMaxDepth) + " levels";
      return false;
    }
    const size_t left = static_cast<size_t>(end_ - *pos_);
    if (len != static_cast<std::size_t>(-1) && len > left) {
      parse_failed_ = true;  // a truncated file: it declares more elements than bytes remain
      return false;
    }
    if (capturing_) {
      json* s = CapSlot();
      *s = array ? json::array() : json::object();
      cap_stack_.push_back(s);
      return true;
    }
    if (frames_.empty()) {
      if (array) return Capture(&scratch_, Done::kNothing, true, len);
      top_object_ = true;
      frames_.push_back(Frame::kTop);
      return true;
    }
    return Route(/*container=*/true, array, len, nullptr);
  }

  bool End() {
    --depth_;
    if (capturing_) {
      cap_stack_.pop_back();
      if (cap_stack_.empty()) EndCapture();
      return true;
    }
    const Frame f = frames_.back();
    frames_.pop_back();
    switch (f) {
      case Frame::kClass: EndClass(); break;
      case Frame::kStream: EndStream(); break;
      case Frame::kNode: AddNode(nf_); break;
      default: break;
    }
    return true;
  }

  // A value starts in a structured frame: enter a frame for it, or collect it as JSON.
  bool Route(bool container, bool array, std::size_t len, json* scalar) {
    auto take = [&](json* dest, Done done) {
      if (!container) {
        *dest = std::move(*scalar);
        OnDone(done);
        return true;
      }
      return Capture(dest, done, array, len);
    };
    auto enter = [&](Frame f) {
      frames_.push_back(f);
      return true;
    };
    switch (frames_.back()) {
      case Frame::kTop: {
        Section* sec = key_ == "comms" ? &comms_ : key_ == "classes" ? &classes_ : key_ == "rank_class" ? &ranks_ : nullptr;
        if (sec) {
          // Why reset: the document keeps the last of repeated keys.
          sec->Reset();
          if (sec == &comms_) t_.comms.clear();
          if (sec == &classes_) t_.classes.clear();
          if (sec == &ranks_) t_.ranks.clear();
          if (!container && scalar->is_null()) return true;
          sec->present = true;
          if (container && array) {
            return enter(sec == &comms_ ? Frame::kComms : sec == &classes_ ? Frame::kClasses : Frame::kRanks);
          }
          sec->not_array = true;
          return take(&scratch_, Done::kNothing);
        }
        if (key_ == "magic" || key_ == "schema_version" || key_ == "world_size" || key_ == "layout" ||
            key_ == "topology" || key_ == trace::kSendCompletionKey) {
          return take(&header_[key_], Done::kNothing);
        }
        return take(&scratch_, Done::kNothing);
      }
      case Frame::kComms: return take(&elem_, Done::kComm);
      case Frame::kRanks: return take(&elem_, Done::kRank);
      case Frame::kClasses:
        t_.classes.emplace_back();
        cs_ = ClassState{};
        if (container && !array) return enter(Frame::kClass);
        return take(&elem_, Done::kClass);
      case Frame::kClass: {
        const bool header_key = key_ == "name" || key_ == "comm_slots";
        if (cs_.fast && (header_key || key_ == "streams")) return Irregular();
        if (header_key || cs_.dom) return take(&cs_.fields[key_], Done::kNothing);
        if (key_ != "streams") return take(&scratch_, Done::kNothing);
        if (!cs_.fields.contains("name") || !cs_.fields.contains("comm_slots")) {
          cs_.dom = true;
          return take(&cs_.fields[key_], Done::kNothing);
        }
        cs_.fast = true;
        const size_t index = t_.classes.size() - 1;
        Try(&classes_.error, [&] { ParseClassHeader(cs_.fields, index, &Cur(), &cs_.slots, &cs_.where); });
        if (container && array && classes_.error.empty()) return enter(Frame::kStreams);
        Try(&classes_.error, [&] { Fail(cs_.where, "missing \"streams\" array"); });
        return take(&scratch_, Done::kNothing);
      }
      case Frame::kStreams:
        Cur().streams.emplace_back();
        ss_ = StreamState{};
        if (container && !array) return enter(Frame::kStream);
        return take(&elem_, Done::kStream);
      case Frame::kStream: {
        if (ss_.fast && (key_ == "name" || key_ == "nodes")) return Irregular();
        if (key_ == "name" || ss_.dom) return take(&ss_.fields[key_], Done::kNothing);
        if (key_ != "nodes") return take(&scratch_, Done::kNothing);
        if (!ss_.fields.contains("name")) {
          ss_.dom = true;
          return take(&ss_.fields[key_], Done::kNothing);
        }
        ss_.fast = true;
        trace::RoleClass& c = Cur();
        const size_t si = c.streams.size() - 1;
        Try(&classes_.error, [&] { ParseStreamHeader(ss_.fields, si, cs_.where, &c.streams[si], &ss_.where); });
        if (container && array && classes_.error.empty()) {
          // At most one node per 8 bytes left: a declared count cannot reserve more than the file could hold.
          if (len != static_cast<std::size_t>(-1)) {
            c.streams[si].nodes.reserve(std::min(len, static_cast<size_t>(end_ - *pos_) / 8));
          }
          return enter(Frame::kNodes);
        }
        Try(&classes_.error, [&] { Fail(ss_.where, "missing \"nodes\" array"); });
        return take(&scratch_, Done::kNothing);
      }
      case Frame::kNodes:
        if (container && !array) {
          nf_.Clear();
          return enter(Frame::kNode);
        }
        return take(&elem_, Done::kNode);
      case Frame::kNode: return take(node_dest_ ? node_dest_ : &scratch_, Done::kNothing);
    }
    return true;
  }

  void EndClass() {
    if (cs_.fast) return;  // streamed: every check already ran in order
    const size_t index = t_.classes.size() - 1;
    Try(&classes_.error, [&] { ParseClass(cs_.fields, index, &Cur()); });
  }

  void EndStream() {
    if (ss_.fast) return;
    trace::RoleClass& c = Cur();
    const size_t si = c.streams.size() - 1;
    Try(&classes_.error, [&] { ParseStream(ss_.fields, si, cs_.where, cs_.slots, &cs_.next_id, &c.streams[si]); });
  }

  // Appends a node to the current stream, read from `j` (the node's fields as read so far, or its whole element).
  template <typename Obj>
  void AddNode(const Obj& j) {
    trace::Stream& s = Cur().streams.back();
    s.nodes.emplace_back();
    const size_t ni = s.nodes.size() - 1;
    Try(&classes_.error, [&] { ParseNode(j, cs_.slots, cs_.next_id, NodeWhere{&ss_.where, ni}, &s.nodes[ni]); });
    cs_.next_id = s.nodes[ni].id + 1;
  }

  // A collected element is complete.
  void OnDone(Done d) {
    switch (d) {
      case Done::kNothing: break;
      case Done::kComm: {
        t_.comms.emplace_back();
        const size_t i = t_.comms.size() - 1;
        Try(&comms_.error, [&] { ParseComm(elem_, i, &t_.comms[i]); });
        break;
      }
      case Done::kRank: {
        t_.ranks.emplace_back();
        const size_t r = t_.ranks.size() - 1;
        Try(&ranks_.error, [&] { ParseRankBinding(elem_, r, &t_.ranks[r]); });
        break;
      }
      case Done::kClass: {
        const size_t index = t_.classes.size() - 1;
        Try(&classes_.error, [&] { ParseClass(elem_, index, &Cur()); });
        break;
      }
      case Done::kStream: {
        trace::RoleClass& c = Cur();
        const size_t si = c.streams.size() - 1;
        Try(&classes_.error, [&] { ParseStream(elem_, si, cs_.where, cs_.slots, &cs_.next_id, &c.streams[si]); });
        break;
      }
      case Done::kNode: AddNode(elem_); break;
    }
    if (d != Done::kNothing) elem_ = nullptr;
  }

  // --- collecting a value as JSON (the document reader's own representation of it) ---
  bool Capture(json* dest, Done done, bool array, std::size_t) {
    capturing_ = true;
    cap_done_ = done;
    *dest = array ? json::array() : json::object();
    cap_stack_.push_back(dest);
    return true;
  }
  json* CapSlot() {
    json* top = cap_stack_.back();
    if (top->is_array()) {
      top->push_back(nullptr);
      return &top->back();
    }
    return &(*top)[cap_key_];  // Why operator[]: a repeated key keeps the last value, as in the document
  }
  void EndCapture() {
    capturing_ = false;
    OnDone(cap_done_);
  }

  bool Irregular() {
    irregular_ = true;
    return false;
  }

  trace::RoleClass& Cur() { return t_.classes.back(); }

  const char* end_;
  const char** pos_;
  bool is_json_;
  int depth_ = 0;
  bool parse_failed_ = false, irregular_ = false, top_object_ = false;
  std::string limit_error_;

  std::vector<Frame> frames_;
  std::string key_;
  json* node_dest_ = nullptr;

  bool capturing_ = false;
  std::vector<json*> cap_stack_;
  std::string cap_key_;
  Done cap_done_ = Done::kNothing;

  trace::Trace t_;
  json header_ = json::object();
  json elem_, scratch_;
  Section comms_, classes_, ranks_;
  ClassState cs_;
  StreamState ss_;
  NodeFields nf_;
};

}  // namespace

SaxResult TraceFromBytesSax(const std::string& data, bool is_json, trace::Trace* out, std::string* error) {
  const char* begin = data.data();
  const char* end = begin + data.size();
  const char* pos = begin;
  Handler h(end, &pos, is_json);
  const bool parsed = json::sax_parse(CountingIter(begin, &pos), CountingIter(end, &pos), &h,
                                      is_json ? json::input_format_t::json : json::input_format_t::cbor,
                                      /*strict=*/true);
  return h.Finish(parsed, out, error);
}

}  // namespace prism::replay
