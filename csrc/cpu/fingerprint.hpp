// Fingerprints of weight bytes, for library calls that keep a copy of a weight made on their
// first run (qdot.cpp, pgemm.cpp): a copy made from one buffer is reused for another buffer
// holding the same bytes (the search's rings of identical inputs) without packing it again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace luminal::cpu {

// A 64-bit hash of n bytes (multiply-xor chains over 8-byte words).
inline uint64_t hash_bytes(const void *data, size_t n, uint64_t seed) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  const auto *b = static_cast<const uint8_t *>(data);
  uint64_t h[4] = {seed, seed ^ 0x632BE59BD9B4E019ull, seed + kMul, seed ^ 0xD6E8FEB86659FD93ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) {
      uint64_t v;
      std::memcpy(&v, b + i + 8 * j, 8);
      h[j] = (h[j] ^ v) * kMul;
      h[j] ^= h[j] >> 31;
    }
  uint64_t t = n;
  for (; i < n; ++i) t = (t ^ b[i]) * kMul;
  uint64_t out = t;
  for (uint64_t x : h) out = (out ^ x) * kMul, out ^= out >> 29;
  return out;
}

// A fingerprint of n bytes: their size and kSampleChunks chunks spread evenly (reading all
// of a weight, as a full hash does, costs what a product by it costs at one activation row).
constexpr int64_t kSampleChunks = 64, kChunk = 64;

inline uint64_t sample_hash(const void *data, size_t n, uint64_t h) {
  const auto *b = static_cast<const uint8_t *>(data);
  h = hash_bytes(&n, sizeof n, h);
  if (n <= size_t(kSampleChunks * kChunk)) return hash_bytes(b, n, h);
  const size_t step = (n - kChunk) / (kSampleChunks - 1);
  for (int64_t i = 0; i < kSampleChunks; ++i) h = hash_bytes(b + size_t(i) * step, kChunk, h);
  return h;
}

} // namespace luminal::cpu
