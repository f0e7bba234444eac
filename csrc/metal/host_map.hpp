// When host memory can back a Metal buffer without a copy (newBufferWithBytesNoCopy: unified
// memory, so mapped weights need not be copied). Pure C++ so that it is tested on any machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace luminal::metal {

// The length of the no-copy buffer over the `bytes` bytes at `host`: `bytes` rounded up to
// whole pages (Metal wants a page-aligned start and length; the rest of the last page is
// mapped, as memory is mapped by pages, and kernels never read it). 0, with `why` set, when
// the bytes cannot be wrapped and must be copied.
inline size_t nocopy_length(uintptr_t host, size_t bytes, size_t page, std::string *why) {
  if (page == 0 || (page & (page - 1)) != 0) {
    *why = "the page size " + std::to_string(page) + " is not a power of two";
    return 0;
  }
  if (bytes == 0) {
    *why = "it is empty";
    return 0;
  }
  if (host % page != 0) {
    *why = "its address is not page-aligned (" + std::to_string(host % page) + " bytes past a " +
           std::to_string(page) + "-byte page)";
    return 0;
  }
  if (bytes > SIZE_MAX - (page - 1) || host > UINTPTR_MAX - bytes) {
    *why = "its " + std::to_string(bytes) + " bytes run past the address space";
    return 0;
  }
  return (bytes + page - 1) & ~(page - 1);
}

} // namespace luminal::metal
