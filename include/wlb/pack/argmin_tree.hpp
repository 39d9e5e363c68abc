// The index of the smallest of N keys under point updates, in O(log N) per update and O(1) per
// query: what the packers' placement loops ask once per document ("the lightest micro-batch", "the
// emptiest micro-batch"). A scan per document made placement O(documents x N), the superlinear
// part of planning at N in the thousands (issue 26).
//
//   wlb::detail::ArgminTree<double> lightest(/*n=*/4, 0.0);
//   lightest.Set(0, 3.5);
//   size_t b = lightest.Min();   // 1: the smallest key, ties to the smallest index
//
// Ties go to the smallest index, as a left-to-right scan with a strict `<` and a min-heap of
// (key, index) pairs both break them, so replacing either keeps plans byte-identical.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace wlb::detail {

template <typename Key>
class ArgminTree {
 public:
  // N >= 1 keys, all `init`. Keys are at most std::numeric_limits<Key>::max(), the key of the
  // padding leaves after the N real ones; as ties go to the smaller index, Min() is always one of
  // the N (a caller can mark keys "never" with max() and still get a real index back).
  ArgminTree(size_t n, Key init) : size_(n), leaves_(std::bit_ceil(n)), tree_(2 * leaves_) {
    for (size_t i = 0; i < leaves_; ++i) {
      tree_[leaves_ + i] = i < n ? Node{init, i} : Node{std::numeric_limits<Key>::max(), i};
    }
    Rebuild();
  }

  size_t size() const { return size_; }
  const Key& key(size_t i) const { return tree_[leaves_ + i].key; }

  // The index of the smallest key (the smallest such index on ties).
  size_t Min() const {
    if (leaves_ > kScanLeaves) return tree_[1].index;
    size_t best = 0;
    for (size_t i = 1; i < size_; ++i) {
      if (tree_[leaves_ + i].key < tree_[leaves_ + best].key) best = i;
    }
    return best;
  }

  // Changes key i without updating the winners: Min() is stale until Rebuild(). For many changes
  // between queries, where N / log N or more Set() calls cost more than one Rebuild().
  void SetLeaf(size_t i, Key k) { tree_[leaves_ + i].key = k; }
  // Recomputes every winner from the keys, in O(N).
  void Rebuild() {
    if (leaves_ <= kScanLeaves) return;
    for (size_t v = leaves_ - 1; v >= 1; --v) tree_[v] = Winner(&tree_[2 * v]);
  }

  // Sets key i and updates the winners above it.
  void Set(size_t i, Key k) {
    size_t v = leaves_ + i;
    tree_[v].key = k;
    if (leaves_ <= kScanLeaves) return;
    // The winner climbing the path stays in registers: each level reads only the sibling (an
    // address known up front) and selects with masks, not branches (which the data would make
    // unpredictable): about 3 ns a level.
    Node up = tree_[v];
    for (; v > 1; v /= 2) {
      const Node sibling = tree_[v ^ 1];
      // The sibling wins when it is smaller, or equal and on the left (v is a right child).
      const bool wins = (sibling.key < up.key) | ((v & 1) & (sibling.key == up.key));
      const uint64_t take = -static_cast<uint64_t>(wins);
      up.index = (sibling.index & take) | (up.index & ~take);
      up.key = std::bit_cast<Key>((std::bit_cast<Bits>(sibling.key) & take) |
                                  (std::bit_cast<Bits>(up.key) & ~take));
      tree_[v / 2] = up;
    }
  }

 private:
  // Up to this many leaves, Min() scans the keys and Set() only stores one: faster than a tree
  // walk at N = 4 (measured: wlb at N = 4, 3.5 µs a step with the walk, as fast as the scan of
  // the min-heap version before it without).
  static constexpr size_t kScanLeaves = 8;
  // A node holds its subtree's winner with the winner's key, so an update reads two adjacent
  // nodes per level and nothing else.
  struct Node {
    Key key;
    uint64_t index;
  };
  static_assert(sizeof(Key) == 8, "keys are 64-bit (double or int64_t)");
  using Bits = uint64_t;
  // The winner of two siblings; the left one covers smaller indices, so ties keep it. Selected by
  // index rather than by a branch, which the data would make unpredictable.
  static Node Winner(const Node* pair) { return pair[pair[1].key < pair[0].key]; }

  size_t size_;
  size_t leaves_;
  std::vector<Node> tree_;  // tree_[1] is the root; tree_[leaves_ + i] is key i
};

}  // namespace wlb::detail
