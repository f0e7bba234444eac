// Facts about CUDA devices, for the backend and for luminal.cuda_status().
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace luminal {

class Backend;
std::unique_ptr<Backend> make_cuda_backend(); // throws Error("CUDA unavailable: ...")

namespace cuda {

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0, sms = 0, driver_version = 0;
  size_t memory = 0;
  std::string arch() const { return "sm_" + std::to_string(major) + std::to_string(minor); }
};

// Device `ordinal` (throws Error when CUDA is unavailable or the device does not exist).
DeviceInfo device_info(int ordinal);
// $LUMINAL_CUDA_DEVICE, default 0.
int device_ordinal();

} // namespace cuda
} // namespace luminal
