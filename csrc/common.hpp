// Shared basics of the luminal runtime: error types, dtype facts, CRC32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace luminal {

// Any runtime failure (bad input, compiler failure, backend error).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Inputs that do not fit the plan: a dim out of range, a wrong size, an overflow they cause.
struct InputError : Error {
  using Error::Error;
};

// A plan file (or plan bytes) that is malformed, corrupt or inconsistent.
struct PlanError : Error {
  using Error::Error;
};

// Dtype codes are fixed by the plan format (docs/plan-format.md, "Dtype codes").
enum class DType : uint8_t {
  f32 = 0,
  f16,
  bf16,
  f64,
  i32,
  i64,
  boolean,
  i8,
  u8,
  f8e4m3,
  f8e5m2,
  e8m0,
  fp4e2m1,
  i4,
  u4,
};
constexpr int kNumDTypes = 15;

// Bits per element; 4-bit types pack two per byte, low nibble first.
int dtype_bits(DType t);
const char *dtype_name(DType t);

// Bytes needed for `count` elements of `t` (4-bit types round up).
int64_t dtype_nbytes(DType t, int64_t count);

// Host memory aligned to `align` (a power of two >= 64). Blocks of 4 MiB or more are 2 MiB
// aligned and advised to use transparent huge pages: kernels that stream weights or large
// activations take a TLB miss (a page walk, costly under virtualization) every 4 KiB
// otherwise. Free with std::free; nullptr when out of memory.
void *host_alloc(size_t bytes, size_t align = 64);

// Memory for weights packed at run time (qdot's and pgemm's layouts), 64-byte aligned: carved
// from shared chunks that host_alloc gives huge pages, so that a model's many small packed
// weights (a decode step streams each once) share 2 MiB pages instead of taking a TLB miss and
// a restart of the hardware prefetcher every 4 KiB. A chunk is returned when the last block in
// it is freed. nullptr when out of memory; pack_free(nullptr) does nothing.
void *pack_alloc(size_t bytes);
void pack_free(void *p);

// A packed weight's bytes from pack_alloc (copyable: a copy gets a block of its own).
class PackedBytes {
public:
  PackedBytes() = default;
  PackedBytes(const PackedBytes &o) { copy_from(o); }
  PackedBytes &operator=(const PackedBytes &o) {
    if (this != &o) copy_from(o);
    return *this;
  }
  ~PackedBytes() { pack_free(p_); }
  // n zero bytes (the previous contents are dropped)
  void assign_zero(size_t n);
  uint8_t *data() const { return p_; }
  size_t size() const { return n_; }
  uint8_t &operator[](size_t i) const { return p_[i]; }

private:
  void copy_from(const PackedBytes &o);
  uint8_t *p_ = nullptr;
  size_t n_ = 0;
};

// CRC-32 (zlib polynomial) so Python's zlib.crc32 computes the same value.
uint32_t crc32(const void *data, size_t n, uint32_t crc = 0);

} // namespace luminal
