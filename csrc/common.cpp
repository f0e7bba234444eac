#include "common.hpp"

#include <array>
#include <cstdlib>
#include <sys/mman.h>

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
