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
#include <type_traits>
#include <vector>

namespace wlb::detail {

template <typename Key>  // double (not NaN) or int64_t
class ArgminTree {
 public:
  // N >= 1 keys, all `init`. Keys are at most std::numeric_limits<Key>::max(), the key of the
  // padding leaves after the N real ones; as ties go to the smaller index, Min() is always one of
  // the N (a caller can mark keys "never" with max() and still get a real index back).
  ArgminTree(size_t n, Key init) : size_(n), leaves_(std::bit_ceil(n)), tree_(2 * leaves_) {
    for (size_t i = 0; i < leaves_; ++i) {
      tree_[leaves_ + i] = MakeNode(i < n ? init : std::numeric_limits<Key>::max(), i);
    }
    Rebuild();
  }

  // Sets all N keys to `init`, as a new tree of the same size (keeps its memory).
  void Fill(Key init) {
    for (size_t i = 0; i < size_; ++i) tree_[leaves_ + i] = MakeNode(init, i);
    Rebuild();
  }

  size_t size() const { return size_; }
  // Key i (a double -0.0 reads back as +0.0, which compares the same).
  Key key(size_t i) const {
    const uint64_t ordered = static_cast<uint64_t>(tree_[leaves_ + i] >> 64);
    if constexpr (std::is_same_v<Key, double>) {
      const uint64_t bits = ordered >> 63 ? ordered ^ kSign : ~ordered;
      return std::bit_cast<double>(bits);
    } else {
      return static_cast<int64_t>(ordered ^ kSign);
    }
  }

  // The index of the smallest key (the smallest such index on ties).
  size_t Min() const {
    if (leaves_ > kScanLeaves) return Index(tree_[1]);
    size_t best = 0;
    for (size_t i = 1; i < size_; ++i) {
      if (tree_[leaves_ + i] < tree_[leaves_ + best]) best = i;
    }
    return best;
  }

  // Changes key i without updating the winners: Min() is stale until Rebuild(). For many changes
  // between queries, where N / log N or more Set() calls cost more than one Rebuild().
  void SetLeaf(size_t i, Key k) { tree_[leaves_ + i] = MakeNode(k, i); }
  // Recomputes every winner from the keys, in O(N).
  void Rebuild() {
    if (leaves_ <= kScanLeaves) return;
    for (size_t v = leaves_ - 1; v >= 1; --v) tree_[v] = std::min(tree_[2 * v], tree_[2 * v + 1]);
  }

  // Sets key i and updates the winners above it. Always inlined: placement loops call it once per
  // document, and a call made it a tenth of wlb's time at N = 64.
  [[gnu::always_inline]] void Set(size_t i, Key k) {
    size_t v = leaves_ + i;
    Node up = MakeNode(k, i);
    tree_[v] = up;
    if (leaves_ <= kScanLeaves) return;
    // The winner climbing the path stays in registers, and each level reads only the sibling (an
    // address known up front) and keeps the smaller node: one 128-bit compare and two
    // conditional moves, not branches (which the data would make unpredictable). Keys compared
    // as doubles with the tie broken apart took twice as long: half of wlb's planning time at
    // N = 4,096.
    for (; v > 1; v /= 2) {
      const Node sibling = tree_[v ^ 1];
      up = sibling < up ? sibling : up;
      tree_[v / 2] = up;
    }
  }

 private:
  // Up to this many leaves, Min() scans the keys and Set() only stores one: faster than a tree
  // walk at N = 4 (measured: wlb at N = 4, 3.5 µs a step with the walk, as fast as the scan of
  // the min-heap version before it without).
  static constexpr size_t kScanLeaves = 8;
  static_assert(std::is_same_v<Key, double> || std::is_same_v<Key, int64_t>,
                "keys are double or int64_t");
  // A node is its subtree's winner as one unsigned 128-bit number, the key's order above the
  // index: (key, index) pairs compare as the numbers do, so the smaller number is the smaller key
  // and, on equal keys, the smaller index.
  __extension__ using Node = unsigned __int128;
  static constexpr uint64_t kSign = uint64_t{1} << 63;
  // The key as an unsigned number in the same order: a double's bits with the sign bit set when
  // it is positive and all bits flipped when it is negative (-0.0 becomes +0.0 first: they
  // compare equal); an int64_t with its sign bit flipped.
  static Node MakeNode(Key k, size_t i) {
    uint64_t ordered;
    if constexpr (std::is_same_v<Key, double>) {
      const uint64_t bits = std::bit_cast<uint64_t>(k + 0.0);
      ordered = bits >> 63 ? ~bits : bits | kSign;
    } else {
      ordered = static_cast<uint64_t>(k) ^ kSign;
    }
    return (Node{ordered} << 64) | i;
  }
  static size_t Index(Node n) { return static_cast<size_t>(static_cast<uint64_t>(n)); }

  size_t size_;
  size_t leaves_;
  std::vector<Node> tree_;  // tree_[1] is the root; tree_[leaves_ + i] is key i
};

}  // namespace wlb::detail
