#include "npy.hpp"

#include <cstring>
#include <fstream>

namespace luminal::npy {

namespace {

// The descr numpy writes for each dtype; types numpy lacks are saved by ml_dtypes as raw "V".
const char *kDescr[kNumDTypes] = {"<f4", "<f2", "<V2", "<f8", "<i4", "<i8", "|b1", "|i1",
                                  "|u1", "<V1", "<V1", "<V1", "<V1", "<V1", "<V1"};

// Extracts the value of 'key' from the header dict, e.g. "'<f4'" or "(2, 3)".
std::string field(const std::string &h, const std::string &key, const std::string &path) {
  size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) throw Error(path + ": .npy header lacks '" + key + "'");
  size_t c = h.find(':', k);
  size_t b = h.find_first_not_of(' ', c + 1);
  if (c == std::string::npos || b == std::string::npos) throw Error(path + ": bad .npy header");
  size_t e = h[b] == '(' ? h.find(')', b) + 1 : h.find_first_of(",}", b + 1);
  if (h[b] == '\'') e = h.find('\'', b + 1) + 1;
  if (e == std::string::npos || e == 0) throw Error(path + ": bad .npy header");
  return h.substr(b, e - b);
}

bool descr_ok(const std::string &got, DType t) {
  if (got == kDescr[int(t)]) return true;
  std::string want = kDescr[int(t)];
  // Byte order marks of 1-byte types vary between writers ('|' or '<').
  auto body = [](const std::string &s) { return s.size() > 1 ? s.substr(1) : s; };
  if (body(got) == body(want) && (got[0] == '|' || got[0] == '<')) return true;
  return want[1] == 'V' && (body(got) == "u" + want.substr(2)); // raw bytes as unsigned ints
}

} // namespace

Array load(const std::string &path, DType dtype) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open '" + path + "'");
  std::string all((std::istreambuf_iterator<char>(f)), {});
  if (all.size() < 10 || all.compare(0, 6, "\x93NUMPY") != 0)
    throw Error(path + ": not a .npy file");
  int major = uint8_t(all[6]);
  size_t hlen = 0, start = 0;
  if (major == 1) {
    hlen = uint8_t(all[8]) | size_t(uint8_t(all[9])) << 8;
    start = 10;
  } else {
    if (all.size() < 12) throw Error(path + ": truncated .npy header");
    hlen = uint32_t(uint8_t(all[8])) | uint32_t(uint8_t(all[9])) << 8 |
           uint32_t(uint8_t(all[10])) << 16 | uint32_t(uint8_t(all[11])) << 24;
    start = 12;
  }
  if (hlen > all.size() - start) throw Error(path + ": truncated .npy header");
  std::string h = all.substr(start, hlen);
  Array a;
  a.descr = field(h, "descr", path);
  a.descr = a.descr.substr(1, a.descr.size() - 2);
  if (field(h, "fortran_order", path) != "False")
    throw Error(path + ": Fortran-order arrays are not supported; save a C-order array");
  if (!descr_ok(a.descr, dtype))
    throw Error(path + ": dtype '" + a.descr + "' does not match the plan's " + dtype_name(dtype) +
                " (expected '" + kDescr[int(dtype)] + "')");
  std::string shape = field(h, "shape", path);
  int64_t count = 1;
  for (size_t i = 1; i < shape.size();) {
    size_t j = shape.find_first_of(",)", i);
    std::string tok = shape.substr(i, j - i);
    if (tok.find_first_not_of(' ') != std::string::npos) {
      a.shape.push_back(std::stoll(tok));
      if (a.shape.back() < 0 || __builtin_mul_overflow(count, a.shape.back(), &count))
        throw Error(path + ": bad shape " + shape);
    }
    i = j + 1;
  }
  size_t body = start + hlen;
  bool packed = dtype_bits(dtype) == 4;
  int64_t stored = packed ? count : dtype_nbytes(dtype, count);
  if (int64_t(all.size() - body) < stored)
    throw Error(path + ": data is truncated (" + std::to_string(all.size() - body) + " of " +
                std::to_string(stored) + " bytes)");
  const auto *src = reinterpret_cast<const uint8_t *>(all.data() + body);
  if (!packed) {
    a.data.assign(src, src + stored);
  } else {
    a.data.assign(size_t(dtype_nbytes(dtype, count)), 0);
    for (int64_t i = 0; i < count; ++i) a.data[i / 2] |= uint8_t((src[i] & 0xF) << (4 * (i % 2)));
  }
  return a;
}

void save(const std::string &path, DType dtype, const std::vector<int64_t> &shape,
          const uint8_t *data, size_t nbytes) {
  std::string s = "(";
  int64_t count = 1;
  for (int64_t d : shape) {
    s += std::to_string(d) + ", ";
    count *= d;
  }
  if (shape.size() > 1)
    s.resize(s.size() - 2);
  else if (shape.size() == 1)
    s.resize(s.size() - 1);
  s += ")";
  std::string h = "{'descr': '" + std::string(kDescr[int(dtype)]) +
                  "', 'fortran_order': False, 'shape': " + s + ", }";
  h.append(63 - (10 + h.size()) % 64, ' ');
  h += '\n'; // header padded so the data starts 64-byte aligned
  std::string head = "\x93NUMPY\x01";
  head += '\0';
  head += char(h.size() & 0xFF);
  head += char(h.size() >> 8);
  std::ofstream f(path, std::ios::binary);
  f << head << h;
  if (dtype_bits(dtype) != 4) {
    f.write(reinterpret_cast<const char *>(data), std::streamsize(nbytes));
  } else {
    std::vector<uint8_t> out(static_cast<size_t>(count));
    bool sign = dtype == DType::i4; // ml_dtypes keeps int4 sign-extended in its byte
    for (int64_t i = 0; i < count; ++i) {
      uint8_t v = (data[i / 2] >> (4 * (i % 2))) & 0xF;
      out[i] = sign && (v & 8) ? uint8_t(v | 0xF0) : v;
    }
    f.write(reinterpret_cast<const char *>(out.data()), std::streamsize(out.size()));
  }
  if (!f) throw Error("cannot write '" + path + "'");
}

} // namespace luminal::npy
