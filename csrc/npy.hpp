// Minimal .npy reading and writing for luminal-run (C-order arrays only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.hpp"

namespace luminal::npy {

struct Array {
  std::string descr; // e.g. "<f4"
  std::vector<int64_t> shape;
  std::vector<uint8_t> data; // plan layout: 4-bit types packed two per byte
};

// Reads `path` as an array of `dtype`. 4-bit types are read one element per byte (as
// ml_dtypes saves them) and packed. Throws Error on a malformed file or dtype mismatch.
Array load(const std::string &path, DType dtype);

// Writes plan-layout `data` of `dtype` and `shape` (4-bit types are unpacked).
void save(const std::string &path, DType dtype, const std::vector<int64_t> &shape,
          const uint8_t *data, size_t nbytes);

} // namespace luminal::npy
