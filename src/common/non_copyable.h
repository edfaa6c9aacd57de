// A base for classes that own a resource (a descriptor, a thread, a buffer) and so are neither copied nor moved.
#pragma once

namespace prism {

// Deletes the copy operations, and with them the implicit moves, of every class that derives from it (privately:
// `class X : NonCopyable`).
class NonCopyable {
 public:
  NonCopyable(const NonCopyable&) = delete;
  NonCopyable& operator=(const NonCopyable&) = delete;

 protected:
  NonCopyable() = default;
  ~NonCopyable() = default;
};

}  // namespace prism
