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

// Reads without validating (for tools that want to report every validation error themselves).
bool ReadTraceUnchecked(const std::string& path, trace::Trace* out, std::string* error);

// Writes CBOR when `path` ends in ".prism", JSON (indented) otherwise. Returns false with *error on I/O failure.
bool WriteTrace(const trace::Trace& t, const std::string& path, std::string* error);

}  // namespace prism::replay
