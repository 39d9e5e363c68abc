// Tests of include/wlb/pack/argmin_tree.hpp: Min() after any sequence of updates is the index a
// left-to-right scan with a strict `<` finds (the smallest index among the smallest keys).
#include "wlb/pack/argmin_tree.hpp"

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace wlb {
namespace argmin_tree_test {

template <typename Key>
size_t BruteArgmin(const std::vector<Key>& keys) {
  size_t best = 0;
  for (size_t i = 1; i < keys.size(); ++i) {
    if (keys[i] < keys[best]) best = i;
  }
  return best;
}

// Sizes below, at and above the scan threshold and powers of two, with random point updates
// from a small key range (so ties are common) and occasional batches of SetLeaf + Rebuild.
template <typename Key>
void CheckAgainstBruteForce(uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t n : {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 64, 100, 257, 1000}) {
    const Key init = static_cast<Key>(std::uniform_int_distribution<int>(0, 5)(rng));
    detail::ArgminTree<Key> tree(n, init);
    std::vector<Key> keys(n, init);
    ASSERT_EQ(tree.size(), n);
    ASSERT_EQ(tree.Min(), 0u) << "all keys equal: ties go to index 0";
    for (int op = 0; op < 2000; ++op) {
      const size_t i = std::uniform_int_distribution<size_t>(0, n - 1)(rng);
      const Key k = static_cast<Key>(std::uniform_int_distribution<int>(0, 12)(rng));
      if (op % 97 == 96) {  // a batch of stale changes, then one rebuild
        for (int b = 0; b < 10; ++b) {
          const size_t j = std::uniform_int_distribution<size_t>(0, n - 1)(rng);
          const Key kj = static_cast<Key>(std::uniform_int_distribution<int>(0, 12)(rng));
          tree.SetLeaf(j, kj);
          keys[j] = kj;
        }
        tree.Rebuild();
      } else {
        tree.Set(i, k);
        keys[i] = k;
      }
      ASSERT_EQ(tree.key(i), keys[i]);
      ASSERT_EQ(tree.Min(), BruteArgmin(keys)) << "n = " << n << ", op " << op;
    }
  }
}

TEST(ArgminTree, MatchesAScanUnderRandomUpdatesInt64) {
  for (uint64_t seed : {1, 2, 3}) CheckAgainstBruteForce<int64_t>(seed);
}

TEST(ArgminTree, MatchesAScanUnderRandomUpdatesDouble) {
  for (uint64_t seed : {4, 5, 6}) CheckAgainstBruteForce<double>(seed);
}

TEST(ArgminTree, FractionalAndNegativeDoubleKeys) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> key(-1e6, 1e6);
  for (size_t n : {6, 40, 513}) {
    detail::ArgminTree<double> tree(n, 0.0);
    std::vector<double> keys(n, 0.0);
    for (int op = 0; op < 3000; ++op) {
      const size_t i = std::uniform_int_distribution<size_t>(0, n - 1)(rng);
      keys[i] = key(rng);
      tree.Set(i, keys[i]);
      ASSERT_EQ(tree.Min(), BruteArgmin(keys));
    }
  }
}

TEST(ArgminTree, KeysAtTheMaximumStillGiveARealIndex) {
  // n = 5 pads to 8 leaves, n = 20 to 32: padding leaves hold max(), and ties go left, so Min()
  // is a real index even when every real key is max().
  for (size_t n : {5, 20}) {
    constexpr double kNever = std::numeric_limits<double>::max();
    detail::ArgminTree<double> tree(n, kNever);
    EXPECT_EQ(tree.Min(), 0u);
    tree.Set(n - 1, 1.0);
    EXPECT_EQ(tree.Min(), n - 1);
    tree.Set(n - 1, kNever);
    EXPECT_EQ(tree.Min(), 0u);
    EXPECT_LT(tree.Min(), n);
  }
  detail::ArgminTree<int64_t> ints(20, std::numeric_limits<int64_t>::max());
  ints.Set(13, std::numeric_limits<int64_t>::max() - 1);
  EXPECT_EQ(ints.Min(), 13u);
}

TEST(ArgminTree, FillStartsOverAsANewTree) {
  std::mt19937_64 rng(8);
  for (size_t n : {1, 3, 8, 9, 100}) {
    detail::ArgminTree<double> tree(n, 0.0);
    for (int round = 0; round < 3; ++round) {
      const double init = round - 1.0;
      tree.Fill(init);
      std::vector<double> keys(n, init);
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(tree.key(i), init);
      EXPECT_EQ(tree.Min(), 0u);
      for (int op = 0; op < 200; ++op) {
        const size_t i = std::uniform_int_distribution<size_t>(0, n - 1)(rng);
        keys[i] = std::uniform_real_distribution<double>(-2.0, 2.0)(rng);
        tree.Set(i, keys[i]);
        ASSERT_EQ(tree.Min(), BruteArgmin(keys)) << "n " << n << ", round " << round;
      }
    }
  }
}

}  // namespace argmin_tree_test
}  // namespace wlb
