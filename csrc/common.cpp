#include "common.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <vector>

namespace luminal {

namespace {
constexpr int kBits[kNumDTypes] = {32, 16, 16, 64, 32, 64, 8, 8, 8, 8, 8, 8, 4, 4, 4};
constexpr const char *kNames[kNumDTypes] = {"f32",    "f16",  "bf16",    "f64", "i32",
                                            "i64",    "bool", "i8",      "u8",  "f8e4m3",
                                            "f8e5m2", "e8m0", "fp4e2m1", "i4",  "u4"};

// Slicing-by-8 tables: ~8x faster than bytewise, which matters for GiB weight blobs.
struct CrcTables {
  uint32_t t[8][256];
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};
const CrcTables kCrc;
} // namespace

void *host_alloc(size_t bytes, size_t align) {
  constexpr size_t kHuge = size_t(2) << 20;
  const bool huge = bytes >= 2 * kHuge;
  if (huge && align < kHuge) align = kHuge;
  const size_t n = (bytes + align - 1) / align * align + align;
  void *p = std::aligned_alloc(align, n);
#ifdef MADV_HUGEPAGE
  if (p && huge) ::madvise(p, n, MADV_HUGEPAGE); // advice only: ignored where unsupported
#endif
  return p;
}

namespace {
// Packed weights share chunks of this size (blocks above half of it get a chunk of their own):
// a few per model, each mostly filled, the last one's unused tail never touched.
constexpr size_t kPackChunk = size_t(32) << 20;

struct PackChunk {
  uint8_t *base;
  size_t size, used = 0;
  std::map<size_t, size_t> blocks;             // offset -> bytes of each live block
  std::vector<std::pair<size_t, size_t>> gaps; // freed (offset, bytes) below `used`, reused first
};

struct PackPool {
  std::mutex mu;
  std::vector<PackChunk> chunks;
};

PackPool &pack_pool() {
  static auto *pool = new PackPool; // never destroyed: blocks may be freed at exit
  return *pool;
}

// where `need` bytes fit in c (a freed gap first, else its unused tail), or npos
size_t place(PackChunk &c, size_t need) {
  for (auto &[off, n] : c.gaps)
    if (n >= need) {
      const size_t at = off;
      off += need, n -= need;
      return at;
    }
  if (c.size - c.used < need) return std::string::npos;
  c.used += need;
  return c.used - need;
}
} // namespace

void *pack_alloc(size_t bytes) {
  const size_t need = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  PackPool &pool = pack_pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  if (need <= kPackChunk / 2)
    for (auto &c : pool.chunks) {
      if (c.size != kPackChunk) continue;
      const size_t at = place(c, need);
      if (at == std::string::npos) continue;
      c.blocks[at] = need;
      return c.base + at;
    }
  const size_t size = need <= kPackChunk / 2 ? kPackChunk : need;
  void *base = host_alloc(size, 64);
  if (!base) return nullptr;
  PackChunk c{static_cast<uint8_t *>(base), size, need};
  c.blocks[0] = need;
  pool.chunks.push_back(std::move(c));
  return base;
}

void pack_free(void *p) {
  if (!p) return;
  PackPool &pool = pack_pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  auto *q = static_cast<uint8_t *>(p);
  for (size_t i = 0; i < pool.chunks.size(); ++i) {
    PackChunk &c = pool.chunks[i];
    if (q < c.base || q >= c.base + c.size) continue;
    auto it = c.blocks.find(size_t(q - c.base));
    if (it == c.blocks.end()) return;
    c.gaps.emplace_back(it->first, it->second);
    c.blocks.erase(it);
    if (c.blocks.empty()) { // nothing left in it: its memory goes back
      std::free(c.base);
      pool.chunks.erase(pool.chunks.begin() + std::ptrdiff_t(i));
      return;
    }
    // adjacent gaps merge, so that a freed run of blocks takes a larger one
    std::sort(c.gaps.begin(), c.gaps.end());
    std::vector<std::pair<size_t, size_t>> merged;
    for (const auto &g : c.gaps)
      if (!merged.empty() && merged.back().first + merged.back().second == g.first)
        merged.back().second += g.second;
      else if (g.second)
        merged.push_back(g);
    c.gaps = std::move(merged);
    return;
  }
}

void PackedBytes::assign_zero(size_t n) {
  pack_free(p_);
  p_ = nullptr;
  n_ = 0;
  if (n == 0) return;
  p_ = static_cast<uint8_t *>(pack_alloc(n));
  if (!p_) throw Error("out of memory packing a weight (" + std::to_string(n) + " B)");
  std::memset(p_, 0, n);
  n_ = n;
}

void PackedBytes::copy_from(const PackedBytes &o) {
  assign_zero(o.n_);
  if (n_) std::memcpy(p_, o.p_, n_);
}

int dtype_bits(DType t) {
  return kBits[static_cast<int>(t)];
}
const char *dtype_name(DType t) {
  return kNames[static_cast<int>(t)];
}

int64_t dtype_nbytes(DType t, int64_t count) {
  return dtype_bits(t) == 4 ? (count + 1) / 2 : count * (dtype_bits(t) / 8);
}

uint32_t crc32(const void *data, size_t n, uint32_t crc) {
  const auto *p = static_cast<const uint8_t *>(data);
  const auto &t = kCrc.t;
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo =
        (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24) ^ crc;
    uint32_t hi =
        uint32_t(p[4]) | uint32_t(p[5]) << 8 | uint32_t(p[6]) << 16 | uint32_t(p[7]) << 24;
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

} // namespace luminal
