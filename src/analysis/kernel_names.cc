// Short names for kernels: a demangled C++ signature cut to its last name component and first named template
// argument (ShortKernelName, kernel_report.h).
#include "analysis/kernel_report.h"

#include <cctype>
#include <string>
#include <vector>

namespace prism::analysis {

namespace {

// Splits off the depth-0 parts: the text with every <...> and (...) group removed.
std::string StripGroups(const std::string& s) {
  std::string out;
  int depth = 0;
  for (char c : s) {
    if (c == '<' || c == '(') {
      ++depth;
    } else if (c == '>' || c == ')') {
      if (depth > 0) --depth;
    } else if (depth == 0) {
      out += c;
    }
  }
  return out;
}

// The last "::" component that is a name (not "{lambda#1}" and the like).
std::string LastComponent(const std::string& s) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (true) {
    size_t j = s.find("::", i);
    parts.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 2;
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    std::string p = *it;
    while (!p.empty() && p.front() == ' ') p.erase(p.begin());
    while (!p.empty() && p.back() == ' ') p.pop_back();
    if (!p.empty() && p.front() != '{') return p;
  }
  return parts.empty() ? s : parts.back();
}

}  // namespace

std::string ShortKernelName(const std::string& demangled) {
  std::string s = demangled;
  for (const char* anon : {"(anonymous namespace)::", "(anonymous namespace)"}) {
    const size_t len = std::char_traits<char>::length(anon);
    for (size_t p; (p = s.find(anon)) != std::string::npos;) s.erase(p, len);
  }
  // Cut the parameter list: the first '(' outside template arguments.
  int depth = 0;
  size_t cut = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    else if (c == '>' && depth > 0) --depth;
    else if (c == '(' && depth == 0) {
      cut = i;
      break;
    }
  }
  if (cut != std::string::npos && cut > 0) s = s.substr(0, cut);
  // The return type: everything before the last space outside template arguments.
  depth = 0;
  size_t name_at = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    else if (c == '>' && depth > 0) --depth;
    else if (c == ' ' && depth == 0) name_at = i + 1;
  }
  s = s.substr(name_at);
  // Base name and template arguments.
  const size_t lt = s.find('<');
  std::string base = LastComponent(lt == std::string::npos ? s : s.substr(0, lt));
  std::string arg;
  if (lt != std::string::npos) {
    std::vector<std::string> args;
    depth = 0;
    std::string cur;
    for (size_t i = lt + 1; i < s.size(); ++i) {
      const char c = s[i];
      if (c == '<' || c == '(') ++depth;
      if ((c == '>' || c == ')') && depth > 0) {
        --depth;
      } else if (c == '>' && depth == 0) {
        args.push_back(cur);
        break;
      }
      if (c == ',' && depth == 0) {
        args.push_back(cur);
        cur.clear();
        continue;
      }
      cur += c;
    }
    for (std::string a : args) {
      while (!a.empty() && a.front() == ' ') a.erase(a.begin());
      if (a.empty() || std::isdigit(static_cast<unsigned char>(a[0])) || a[0] == '-' || a[0] == '(' || a == "true" ||
          a == "false")
        continue;
      arg = LastComponent(StripGroups(a));
      // Why also "unsigned int"-like: plain types say little; keep looking for a named argument.
      if (arg.find(' ') != std::string::npos || arg == "float" || arg == "int" || arg == "half" || arg == "double" ||
          arg == "bool" || arg == "char") {
        arg.clear();
        continue;
      }
      break;
    }
  }
  std::string out = arg.empty() ? base : base + "<" + arg + ">";
  if (out.empty()) out = demangled.substr(0, 80);
  if (out.size() > 80) out = out.substr(0, 77) + "...";
  return out;
}

}  // namespace prism::analysis
