// Whole-file writes that readers never see half done: the content goes to PATH.tmp.<pid>, then a rename replaces
// PATH. Why: report.json, status.json and the graph cache's entry files are read while they change (prism-run
// status, CI jobs, a second prism-run of the same job).
#pragma once

#include <string>
#include <string_view>

namespace prism {

// False with *error naming the path when the temporary file cannot be written or renamed (it is then removed).
bool WriteFileAtomic(const std::string& path, std::string_view content, std::string* error);

}  // namespace prism
