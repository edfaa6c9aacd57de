// Reading and writing PrismTrace files: `.prism` is CBOR, `.prism.json` (or any `.json`) is JSON; the reader
// accepts both whatever the name says (it sniffs the first byte). See docs/trace-format.md.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "prism/trace.h"

namespace prism::replay {

// Parses a trace from its JSON form. On failure returns false and sets *error to a message naming the place
// (e.g. "classes[1] 'stage1' stream 'compute' node 7: unknown kind \"comptue\""). Does not run the validator.
bool TraceFromJson(const nlohmann::json& j, trace::Trace* out, std::string* error);

// The JSON form of a trace (what `.prism.json` files hold; CBOR files hold the same object).
nlohmann::json TraceToJson(const trace::Trace& t);

// Reads `path` (CBOR or JSON), then validates it (ValidateTrace). Returns false with *error naming the file and
// the problem for a missing/truncated file, wrong magic or version, unknown enum, or a validation error.
bool ReadTrace(const std::string& path, trace::Trace* out, std::string* error);

// Reads without validating (for tools that want to report every validation error themselves). Uses the
// streaming reader (TraceFromBytesSax): no JSON document of the whole file is built.
bool ReadTraceUnchecked(const std::string& path, trace::Trace* out, std::string* error);

// The same through one nlohmann::json document of the whole file, then TraceFromJson: the reference that the
// streaming reader must equal (tests/unit/trace_sax_test.cc) and the baseline of bench/replay_load_bench.cc.
bool ReadTraceUncheckedDom(const std::string& path, trace::Trace* out, std::string* error);

// What ReadTraceUnchecked and ReadTraceUncheckedDom do once the file is read, on bytes in memory (tests, the fuzz
// targets of tests/fuzz): the shape checks, then the streaming reader (falling back to the document reader for key
// orders it does not stream), or the document reader alone. *error has no path.
bool TraceFromBytes(const std::string& data, trace::Trace* out, std::string* error);
bool TraceFromBytesDom(const std::string& data, trace::Trace* out, std::string* error);

// Limits of the streaming reader. Why: a hostile file must not make it recurse or allocate without bound; the
// trace itself nests 8 levels deep (top, classes, class, streams, stream, nodes, node, after), a topology object
// a few more. A CBOR array or map that declares more elements than bytes remain is refused before anything is
// reserved for it (every element takes at least one byte).
inline constexpr int kSaxMaxDepth = 64;

enum class SaxResult {
  kOk,
  kError,      // *error says why (the same message as the document reader, without the path)
  kIrregular,  // keys in an order this reader does not stream (see trace_sax.cc): read it with the document reader
};

// Parses PrismTrace bytes (`is_json`: JSON text, else CBOR) with nlohmann's SAX interface straight into *out.
// Does not run the validator.
SaxResult TraceFromBytesSax(const std::string& data, bool is_json, trace::Trace* out, std::string* error);

// Writes CBOR when `path` ends in ".prism", JSON (indented) otherwise. Returns false with *error on I/O failure.
bool WriteTrace(const trace::Trace& t, const std::string& path, std::string* error);

}  // namespace prism::replay
