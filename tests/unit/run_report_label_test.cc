// A communicator the shim reports without a description is named from its members (the launcher passes a
// labeler built from the Megatron layout).
#include <gtest/gtest.h>

#include "analysis/run_report.h"

namespace prism::analysis {
namespace {

TEST(RunReportLabel, UnnamedCommIsLabelledFromItsMembers) {
  RunReport report("/nonexistent", 64, {0});
  report.SetCommLabeler([](const std::vector<int>& m) {
    return m == std::vector<int>{0, 32} ? std::string("PIPELINE_MODEL_PARALLEL_GROUP") : std::string();
  });
  report.Feed(0, R"({"type":"comm","comm_id":1,"key":"5052","desc":"","name":"","nranks":2,"rank":0,"members":[0,32]})");
  report.Feed(0, R"({"type":"comm","comm_id":2,"key":"abcd","desc":"","name":"","nranks":2,"rank":0,"members":[0,1]})");
  report.Feed(0, R"({"type":"op","comm_id":1,"seq":0,"op":"send","bytes":8,"arrival_ns":100,"release_ns":300})");
  report.Feed(0, R"({"type":"op","comm_id":2,"seq":0,"op":"allreduce","bytes":8,"arrival_ns":100,"release_ns":200})");
  nlohmann::json r = report.Build(1.0, {}, nlohmann::json::object());
  const nlohmann::json& wait = r["ranks"][0]["wait_s"];
  EXPECT_TRUE(wait.contains("PIPELINE_MODEL_PARALLEL_GROUP")) << wait.dump();
  EXPECT_TRUE(wait.contains("abcd")) << wait.dump();  // no label: falls back to the key
}

}  // namespace
}  // namespace prism::analysis
