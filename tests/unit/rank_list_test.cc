// The one rank-list parser (common/rank_list.h): the same input gets the same answer and error everywhere.
#include "common/rank_list.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace prism {
namespace {

TEST(RankList, ParsesRanksAndRangesInTheOrderGiven) {
  std::string err;
  EXPECT_EQ(*ParseRankList("0", 64, "--ranks", &err), (std::vector<int>{0}));
  EXPECT_EQ(*ParseRankList("0,517", 1024, "--ranks", &err), (std::vector<int>{0, 517}));
  EXPECT_EQ(*ParseRankList("0-3,8", 64, "--ranks", &err), (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(*ParseRankList(" 5 , 2 ", 64, "--ranks", &err), (std::vector<int>{5, 2}));
  EXPECT_EQ(*ParseRankList("7", 0, "--trace-ranks", &err), (std::vector<int>{7}));
}

TEST(RankList, RefusesWithTheFlagTheSpecAndThePart) {
  std::string err;
  EXPECT_FALSE(ParseRankList("0,517", 64, "--ranks", &err));
  EXPECT_EQ(err, "--ranks \"0,517\": rank 517 is outside the world (ranks 0-63)");
  EXPECT_FALSE(ParseRankList("1,0-2", 64, "--ranks", &err));
  EXPECT_EQ(err, "--ranks \"1,0-2\": rank 1 is given twice");
  EXPECT_FALSE(ParseRankList("1,,2", 8, "--ranks", &err));
  EXPECT_EQ(err, "--ranks \"1,,2\": empty entry");
  EXPECT_FALSE(ParseRankList("", 8, "--ranks", &err));
  EXPECT_EQ(err, "--ranks is empty (expected e.g. \"0\", \"0,517\", \"0-7\")");
  for (const char* bad : {"3-1", "a", "-1", "1x", "1-", "+3", "99999999999999999999"}) {
    EXPECT_FALSE(ParseRankList(bad, 8, "--ranks", &err)) << bad;
    EXPECT_EQ(err, std::string("--ranks \"") + bad + "\": \"" + bad + "\" is not a rank or a range LOW-HIGH") << bad;
  }
  // Ranges are expanded: without a world the bound is the largest world prism runs, checked before expanding.
  EXPECT_FALSE(ParseRankList("0-2000000", 0, "--trace-ranks", &err));
  EXPECT_EQ(err, "--trace-ranks \"0-2000000\": rank 2000000 is past the largest world prism runs (1048576 ranks)");
}

}  // namespace
}  // namespace prism
