// Fuzzes the PrismTrace readers (src/replay/trace_io.cc, trace_sax.cc) with arbitrary bytes, JSON or CBOR: they
// must never crash, the streaming reader must agree with the document reader (trace_io.h: the same Trace and the
// same first error), the validator must take whatever they accept, and what they accept must read back the same
// once written as CBOR (the CBOR path also gets the JSON seeds' traces that way).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "replay/trace_io.h"
#include "replay/trace_validate.h"

namespace {

using nlohmann::json;

[[noreturn]] void Fail(const char* what, const std::string& a, const std::string& b) {
  std::fprintf(stderr, "trace_reader_fuzz: %s\n  streaming: %s\n  document:  %s\n", what, a.c_str(), b.c_str());
  std::abort();
}

std::string Cbor(const prism::trace::Trace& t) {
  std::vector<uint8_t> b = json::to_cbor(prism::replay::TraceToJson(t));
  return std::string(b.begin(), b.end());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prism;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  trace::Trace stream, dom;
  std::string stream_error, dom_error;
  const bool stream_ok = replay::TraceFromBytes(bytes, &stream, &stream_error);
  const bool dom_ok = replay::TraceFromBytesDom(bytes, &dom, &dom_error);
  if (stream_ok != dom_ok) Fail("one reader accepts what the other refuses", stream_error, dom_error);
  if (!stream_ok) {
    if (stream_error != dom_error) Fail("the readers refuse with different messages", stream_error, dom_error);
    return 0;
  }
  const std::string written = Cbor(stream);
  if (written != Cbor(dom)) Fail("the readers give different traces", "", "");
  (void)replay::ValidateTrace(stream);
  trace::Trace back;
  std::string back_error;
  if (!replay::TraceFromBytes(written, &back, &back_error)) Fail("a trace read does not read back", back_error, "");
  if (Cbor(back) != written) Fail("a trace read reads back different", "", "");
  return 0;
}
