// Greedy decoding with a compiled Llama-family decode plan, through luminal.hpp alone (no
// Python): the plan that `luminal generate` keeps in its plan cache (`luminal cache list`).
//
//   greedy_decode PLAN.lmp N_NEW TOKEN_ID...   ->  the N_NEW greedy token ids, one line
//
// The plan's interface (luminal.models.llama): input `tokens` (i32, seq), dims `seq` and
// `pos`, output `logits` (1, vocab) for the last position, and KV caches `k_cache_<l>` /
// `v_cache_<l>` that outputs `*_new` update in place (their buffer alias is the input).
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "luminal.hpp"

namespace {

uint32_t find(const luminal::Plan &pl, const std::string &name, luminal::Role role) {
  for (uint32_t b = 0; b < pl.buffers.size(); ++b)
    if (pl.buffers[b].name == name && pl.buffers[b].role == role) return b;
  throw luminal::Error("the plan has no " + std::string(luminal::role_name(role)) + " '" + name +
                       "': not a Llama decode plan");
}

} // namespace

int main(int argc, char **argv) {
  try {
    if (argc < 4) {
      std::cerr << "usage: greedy_decode PLAN.lmp N_NEW TOKEN_ID...\n";
      return 2;
    }
    auto plan = luminal::Plan::load(argv[1]);
    const luminal::Plan &pl = *plan;
    int n_new = std::atoi(argv[2]);
    std::vector<int32_t> prompt;
    for (int i = 3; i < argc; ++i) prompt.push_back(std::atoi(argv[i]));
    uint32_t tokens = find(pl, "tokens", luminal::Role::input);
    uint32_t logits = find(pl, "logits", luminal::Role::output);
    int seq = -1, pos = -1;
    for (size_t i = 0; i < pl.dims.size(); ++i) {
      if (pl.dims[i].name == "seq") seq = int(i);
      if (pl.dims[i].name == "pos") pos = int(i);
    }
    if (seq < 0 || pos < 0 || pl.dims.size() != 2)
      throw luminal::Error("expected the dims seq and pos");

    luminal::Executor ex(plan, "cpu");
    std::vector<int64_t> dims(2);
    dims[seq] = int64_t(prompt.size());
    dims[pos] = 0;
    std::vector<int64_t> vals = ex.evaluate(dims);
    // every other input is a KV cache: zeroed once, updated in place by the plan
    std::vector<std::vector<float>> caches;
    std::vector<void *> io(pl.buffers.size(), nullptr);
    for (uint32_t b = 0; b < pl.buffers.size(); ++b)
      if (pl.buffers[b].role == luminal::Role::input && b != tokens) {
        caches.emplace_back(size_t(vals[pl.buffers[b].nbytes]) / sizeof(float), 0.0f);
        io[b] = caches.back().data();
      }
    std::vector<float> out(size_t(vals[pl.buffers[logits].nbytes]) / sizeof(float));
    io[logits] = out.data();

    std::vector<int32_t> step = prompt;
    int64_t at = 0;
    for (int n = 0; n < n_new; ++n) {
      dims[seq] = int64_t(step.size());
      dims[pos] = at;
      io[tokens] = step.data();
      ex.run(dims, io.data());
      int32_t best = 0;
      for (size_t v = 1; v < out.size(); ++v)
        if (out[v] > out[size_t(best)]) best = int32_t(v);
      std::cout << best << (n + 1 < n_new ? " " : "\n");
      at += int64_t(step.size());
      step.assign(1, best);
    }
    return 0;
  } catch (const std::exception &e) {
    std::cerr << "greedy_decode: error: " << e.what() << "\n";
    return 1;
  }
}
