// luminal-run: runs a plan on .npy inputs and writes each output to DIR/<name>.npy.
//   luminal-run plan.lmp --input x=x.npy --dim seq=7 --out DIR [--backend cpu] [--repeat N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <sys/stat.h>

#include "luminal.hpp"
#include "npy.hpp"

namespace {

const char *kUsage =
    "usage: luminal-run PLAN.lmp [--input NAME=FILE.npy]... [--dim NAME=VALUE]...\n"
    "                   [--out DIR] [--backend cpu] [--repeat N]\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::pair<std::string, std::string> split_eq(const std::string &s, const char *flag) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError(std::string(flag) + " expects NAME=VALUE, got '" + s + "'");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

int run(int argc, char **argv) {
  std::string plan_path, out = ".", backend = "cpu";
  std::map<std::string, std::string> inputs, dim_args;
  int repeat = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--input")
      inputs.insert(split_eq(value(), "--input"));
    else if (a == "--dim")
      dim_args.insert(split_eq(value(), "--dim"));
    else if (a == "--out")
      out = value();
    else if (a == "--backend")
      backend = value();
    else if (a == "--repeat")
      repeat = std::max(1, std::atoi(value().c_str()));
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a.rfind("--", 0) == 0 || !plan_path.empty())
      throw UsageError("unexpected '" + a + "'");
    else
      plan_path = a;
  }
  if (plan_path.empty()) throw UsageError("no plan given");

  auto plan = luminal::Plan::load(plan_path);
  const auto &pl = *plan;
  std::map<std::string, uint32_t> dim_index;
  for (size_t i = 0; i < pl.dims.size(); ++i) dim_index[pl.dims[i].name] = uint32_t(i);
  std::vector<int64_t> dims(pl.dims.size());
  std::vector<bool> known(pl.dims.size(), false);
  for (const auto &[name, v] : dim_args) {
    auto it = dim_index.find(name);
    if (it == dim_index.end()) throw luminal::Error("the plan has no dim '" + name + "'");
    dims[it->second] = std::stoll(v);
    known[it->second] = true;
  }

  // Load inputs; dims not given come from input shape entries that are a bare dim.
  std::map<uint32_t, luminal::npy::Array> arrays;
  std::map<std::string, bool> used;
  for (const auto &kv : inputs) used[kv.first] = false;
  for (uint32_t b = 0; b < pl.buffers.size(); ++b) {
    const auto &buf = pl.buffers[b];
    if (buf.role != luminal::Role::input) continue;
    auto it = inputs.find(buf.name);
    if (it == inputs.end())
      throw luminal::Error("missing input '" + buf.name + "' (--input " + buf.name + "=FILE.npy)");
    used[buf.name] = true;
    arrays[b] = luminal::npy::load(it->second, buf.dtype);
    const auto &shape = arrays[b].shape;
    if (shape.size() != buf.shape.size())
      throw luminal::Error("input '" + buf.name + "' has rank " + std::to_string(shape.size()) +
                           ", expected " + std::to_string(buf.shape.size()));
    for (size_t k = 0; k < shape.size(); ++k) {
      const auto &prog = pl.exprs[buf.shape[k]];
      if (prog.size() == 1 && prog[0].op == luminal::Op::Dim && !known[prog[0].arg]) {
        dims[prog[0].arg] = shape[k];
        known[prog[0].arg] = true;
      }
    }
  }
  for (const auto &[name, ok] : used)
    if (!ok) throw luminal::Error("the plan has no input '" + name + "'");
  for (size_t i = 0; i < dims.size(); ++i)
    if (!known[i])
      throw luminal::Error("dim '" + pl.dims[i].name + "' is not given (--dim " + pl.dims[i].name +
                           "=N)");

  luminal::Executor ex(plan, backend);
  std::vector<int64_t> vals = ex.evaluate(dims);
  std::vector<void *> io(pl.buffers.size(), nullptr);
  std::map<uint32_t, std::vector<uint8_t>> outputs;
  for (uint32_t b = 0; b < pl.buffers.size(); ++b) {
    const auto &buf = pl.buffers[b];
    if (buf.role == luminal::Role::input) {
      auto want = ex.shape(vals, b);
      if (arrays[b].shape != want) {
        std::string w, g;
        for (auto d : want) w += std::to_string(d) + ",";
        for (auto d : arrays[b].shape) g += std::to_string(d) + ",";
        throw luminal::Error("input '" + buf.name + "' has shape (" + g + "), expected (" + w +
                             ")");
      }
      io[b] = arrays[b].data.data();
    } else if (buf.role == luminal::Role::output && buf.alias == luminal::kNone) {
      outputs[b].resize(size_t(vals[buf.nbytes]));
      io[b] = outputs[b].data();
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < repeat; ++r) ex.run(dims, io.data());
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (repeat > 1) std::cerr << "luminal-run: " << us / repeat << " us per run\n";

  ::mkdir(out.c_str(), 0755);
  for (uint32_t b = 0; b < pl.buffers.size(); ++b) {
    const auto &buf = pl.buffers[b];
    if (buf.role != luminal::Role::output) continue;
    // an output that updates an input in place was written into that input's array
    const auto &data = buf.alias == luminal::kNone ? outputs[b] : arrays[buf.alias].data;
    luminal::npy::save(out + "/" + buf.name + ".npy", buf.dtype, ex.shape(vals, b), data.data(),
                       data.size());
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError &e) {
    std::cerr << "luminal-run: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception &e) {
    std::cerr << "luminal-run: error: " << e.what() << "\n";
    return 1;
  }
}
