// Small text forms prism's lines share.
#pragma once

#include <string>
#include <vector>

namespace prism {

// "0,1,32,33": ranks as --ranks takes them.
std::string JoinRanks(const std::vector<int>& ranks);
// "7:26": seconds as minutes and seconds, for elapsed and remaining times in progress lines.
std::string MinutesSeconds(double seconds);
// The current time as strftime writes it in `format`: local time, or UTC when `utc`.
std::string TimeNow(const char* format, bool utc = false);

}  // namespace prism
