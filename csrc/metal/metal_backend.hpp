// The Metal backend (macOS only; built when CMake sees APPLE): MSL kernels compiled by the
// Metal framework when a plan loads, one command buffer per run, buffers in shared memory.
#pragma once

#include <memory>
#include <string>

namespace luminal {

class Backend;
// Throws Error("Metal unavailable: ...") when there is no Metal device.
std::unique_ptr<Backend> make_metal_backend();

namespace metal {
// Empty when a Metal device can run plans, else why not.
std::string unavailable_reason();
} // namespace metal

} // namespace luminal
