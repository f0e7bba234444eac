#include "plan.hpp"

#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace luminal {

namespace {

constexpr size_t kHeaderSize = 32;
constexpr const char *kRoleNames[] = {"input", "output", "weight", "scratch"};
constexpr const char *kFormatNames[] = {"c_source", "shared_object", "cuda_source", "ptx",
                                        "cubin",    "msl",           "metallib"};

// Names end up in Python strings and messages, so they must be well-formed UTF-8.
bool valid_utf8(const uint8_t *s, size_t n) {
  for (size_t i = 0; i < n;) {
    uint8_t c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n - i || (len == 2 && c < 0xC2)) return false;
    for (size_t k = 1; k < len; ++k)
      if ((s[i + k] & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

// Bounds-checked little-endian reader; every failure names the section being read.
struct Reader {
  const uint8_t *p;
  size_t n, pos;
  const char *section = "header";

  [[noreturn]] void fail(const std::string &why) const {
    throw PlanError(std::string("plan section '") + section + "' at byte " + std::to_string(pos) +
                    ": " + why);
  }
  const uint8_t *take(size_t k) {
    if (k > n - pos) fail("truncated (needs " + std::to_string(k) + " more bytes)");
    const uint8_t *r = p + pos;
    pos += k;
    return r;
  }
  template <typename T> T get() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T)); // the format is little-endian, like the host
    return v;
  }
  std::string str() {
    uint32_t len = get<uint32_t>();
    const uint8_t *s = take(len);
    if (!valid_utf8(s, len)) fail("a string is not valid UTF-8");
    return std::string(reinterpret_cast<const char *>(s), len);
  }
  // A record count, refused when even minimal records could not fit in the bytes left.
  uint32_t count(size_t min_record) {
    uint32_t c = get<uint32_t>();
    if (uint64_t(c) * min_record > n - pos) fail("count " + std::to_string(c) + " exceeds file");
    return c;
  }
  uint32_t id(uint32_t limit, const char *what) {
    uint32_t v = get<uint32_t>();
    if (v >= limit)
      fail(std::string(what) + " index " + std::to_string(v) + " out of range (" +
           std::to_string(limit) + " defined)");
    return v;
  }
  template <typename E> E code(int limit, const char *what) {
    uint8_t v = get<uint8_t>();
    if (v >= limit) fail(std::string("unknown ") + what + " code " + std::to_string(v));
    return static_cast<E>(v);
  }
};

// An aliased output shares its input's memory, so it must be an input of the same dtype,
// shape and size, and no input may be updated by two outputs.
bool same_program(const Program &a, const Program &b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].op != b[i].op || a[i].arg != b[i].arg) return false;
  return true;
}

void check_aliases(const Plan &pl, Reader &r) {
  std::vector<bool> taken(pl.buffers.size(), false);
  for (const Buffer &b : pl.buffers) {
    if (b.alias == kNone) continue;
    std::string what = "buffer '" + b.name + "'";
    if (b.role != Role::output) r.fail(what + ": only outputs can alias (update) an input");
    if (b.alias >= pl.buffers.size() || pl.buffers[b.alias].role != Role::input)
      r.fail(what + ": alias " + std::to_string(b.alias) + " is not an input buffer");
    const Buffer &t = pl.buffers[b.alias];
    bool same = b.dtype == t.dtype && b.shape.size() == t.shape.size() &&
                same_program(pl.exprs[b.nbytes], pl.exprs[t.nbytes]);
    for (size_t k = 0; same && k < b.shape.size(); ++k)
      same = same_program(pl.exprs[b.shape[k]], pl.exprs[t.shape[k]]);
    if (!same) r.fail(what + ": updates input '" + t.name + "' of a different dtype/shape/size");
    if (taken[b.alias]) r.fail(what + ": input '" + t.name + "' is updated by two outputs");
    taken[b.alias] = true;
  }
}

void parse_body(Plan &pl, Reader &r) {
  r.section = "target";
  pl.backend = r.str();
  pl.arch = r.str();

  r.section = "dims";
  pl.dims.resize(r.count(20));
  std::set<std::string> dim_names;
  for (Dim &d : pl.dims) {
    d.name = r.str();
    d.min = r.get<int64_t>();
    d.max = r.get<int64_t>();
    if (d.name.empty() || !dim_names.insert(d.name).second)
      r.fail("dim name '" + d.name + "' is empty or repeated");
    if (d.min < 0 || d.min > d.max)
      r.fail("dim '" + d.name + "' has bad range [" + std::to_string(d.min) + ", " +
             std::to_string(d.max) + "]");
  }

  r.section = "exprs";
  pl.exprs.resize(r.count(4));
  for (size_t i = 0; i < pl.exprs.size(); ++i) {
    Program &prog = pl.exprs[i];
    prog.resize(r.count(9));
    for (Instr &in : prog) {
      in.op = static_cast<Op>(r.get<uint8_t>());
      in.arg = r.get<int64_t>();
    }
    validate_program(prog, pl.dims.size(), "expression #" + std::to_string(i));
  }
  const auto n_expr = uint32_t(pl.exprs.size());

  r.section = "buffers";
  const bool has_alias = pl.version >= 2;
  pl.buffers.resize(r.count(has_alias ? 19 : 15));
  std::set<std::string> io_names;
  for (Buffer &b : pl.buffers) {
    b.name = r.str();
    b.dtype = r.code<DType>(kNumDTypes, "dtype");
    b.role = r.code<Role>(4, "role");
    uint8_t rank = r.get<uint8_t>();
    if (rank > 32) r.fail("buffer '" + b.name + "' has rank " + std::to_string(rank) + " > 32");
    for (int k = 0; k < rank; ++k) b.shape.push_back(r.id(n_expr, "shape expression"));
    b.nbytes = r.id(n_expr, "nbytes expression");
    b.offset = r.get<uint32_t>();
    if (b.role == Role::scratch ? b.offset >= n_expr : b.offset != kNone)
      r.fail("buffer '" + b.name + "': an arena offset expression is required for scratch " +
             "buffers and forbidden for others");
    if (has_alias) b.alias = r.get<uint32_t>();
    if ((b.role == Role::input || b.role == Role::output) &&
        (b.name.empty() || !io_names.insert(b.name).second))
      r.fail("input/output name '" + b.name + "' is empty or repeated");
  }
  check_aliases(pl, r);
  const auto n_buf = uint32_t(pl.buffers.size());

  r.section = "kernels";
  pl.kernels.resize(r.count(17));
  for (Kernel &k : pl.kernels) {
    k.name = r.str();
    k.format = r.code<KernelFormat>(7, "kernel format");
    k.entry = r.str();
    uint64_t size = r.get<uint64_t>();
    if (size > r.n - r.pos) r.fail("kernel '" + k.name + "' code is truncated");
    const uint8_t *code = r.take(size);
    k.code.assign(reinterpret_cast<const char *>(code), size);
    if (k.entry.empty()) r.fail("kernel '" + k.name + "' has no entry point");
  }

  r.section = "steps";
  pl.steps.resize(r.count(1));
  auto args = [&](Step &s) {
    s.args.resize(r.count(4));
    for (uint32_t &a : s.args) a = r.id(n_buf, "argument buffer");
  };
  for (Step &s : pl.steps) {
    s.kind = r.code<StepKind>(3, "step kind");
    if (s.kind == StepKind::launch) {
      s.kernel = r.id(uint32_t(pl.kernels.size()), "kernel");
      for (uint32_t &g : s.grid) g = r.id(n_expr, "grid expression");
      for (uint32_t &b : s.block) b = r.id(n_expr, "block expression");
      s.shared_mem = r.id(n_expr, "shared memory expression");
      args(s);
    } else if (s.kind == StepKind::libcall) {
      s.func = r.str();
      s.fields.resize(r.count(6));
      std::set<std::string> seen;
      for (Field &f : s.fields) {
        f.name = r.str();
        if (!seen.insert(f.name).second) r.fail("descriptor field '" + f.name + "' repeated");
        f.is_real = r.code<uint8_t>(2, "field kind") == 1;
        if (f.is_real)
          f.real = r.get<double>();
        else
          f.expr = r.id(n_expr, "field expression");
      }
      args(s);
    } else {
      s.dst = r.id(n_buf, "copy destination buffer");
      s.src = r.id(n_buf, "copy source buffer");
      s.nbytes = r.id(n_expr, "copy size expression");
      s.dst_offset = r.id(n_expr, "copy destination offset expression");
      s.src_offset = r.id(n_expr, "copy source offset expression");
      Role dr = pl.buffers[s.dst].role;
      if (dr == Role::input || dr == Role::weight)
        r.fail("copy writes into " + std::string(role_name(dr)) + " buffer '" +
               pl.buffers[s.dst].name + "'");
    }
    if (pl.version >= 3) {
      s.when = r.get<uint32_t>();
      if (s.when != kNone && s.when >= n_expr) r.fail("step condition expression out of range");
    }
  }

  r.section = "weights";
  pl.weights.resize(r.count(25));
  std::vector<bool> has_source(n_buf, false);
  for (WeightSource &w : pl.weights) {
    w.buffer = r.id(n_buf, "weight buffer");
    w.external = r.code<uint8_t>(2, "weight source kind") == 1;
    w.path = r.str();
    w.offset = r.get<uint64_t>();
    w.nbytes = r.get<uint64_t>();
    const Buffer &b = pl.buffers[w.buffer];
    if (b.role != Role::weight) r.fail("weight data given for non-weight buffer '" + b.name + "'");
    if (has_source[w.buffer]) r.fail("weight '" + b.name + "' has two sources");
    has_source[w.buffer] = true;
    if (w.external == w.path.empty() || w.path.find('\0') != std::string::npos)
      r.fail("weight '" + b.name + "': a file path is required for external data only");
    for (uint32_t e : b.shape)
      if (!is_constant(pl.exprs[e])) r.fail("weight '" + b.name + "' has a symbolic shape");
    if (!is_constant(pl.exprs[b.nbytes])) r.fail("weight '" + b.name + "' has a symbolic size");
    int64_t want = eval_program(pl.exprs[b.nbytes], nullptr, "size of weight '" + b.name + "'");
    if (want < 0 || uint64_t(want) != w.nbytes)
      r.fail("weight '" + b.name + "' data has " + std::to_string(w.nbytes) +
             " bytes, buffer needs " + std::to_string(want));
  }
  for (uint32_t i = 0; i < n_buf; ++i)
    if (pl.buffers[i].role == Role::weight && !has_source[i])
      r.fail("weight '" + pl.buffers[i].name + "' has no data");

  r.section = "metadata";
  pl.metadata.resize(r.count(8));
  for (auto &kv : pl.metadata) {
    kv.first = r.str();
    kv.second = r.str();
  }
}

std::shared_ptr<const Plan> parse(const uint8_t *data, size_t n, std::shared_ptr<const void> keep,
                                  const std::string &base_dir) {
  if (n < kHeaderSize)
    throw PlanError("not a luminal plan: " + std::to_string(n) + " bytes is shorter than the " +
                    std::to_string(kHeaderSize) + "-byte header (truncated file?)");
  if (std::memcmp(data, kMagic, 4) != 0)
    throw PlanError("not a luminal plan: bad magic (expected 'LMPL' at byte 0)");
  Reader r{data, n, 4};
  auto plan = std::make_shared<Plan>();
  plan->version = r.get<uint32_t>();
  if (plan->version < kOldestVersion || plan->version > kFormatVersion)
    throw PlanError("plan format version " + std::to_string(plan->version) +
                    " is not supported (this runtime reads versions " +
                    std::to_string(kOldestVersion) + " to " + std::to_string(kFormatVersion) +
                    "); recompile the model");
  uint64_t file_size = r.get<uint64_t>(), blob_offset = r.get<uint64_t>();
  uint32_t crc = r.get<uint32_t>(), reserved = r.get<uint32_t>();
  if (file_size != n)
    throw PlanError("plan is truncated or has trailing bytes: header says " +
                    std::to_string(file_size) + " bytes, got " + std::to_string(n));
  if (blob_offset < kHeaderSize || blob_offset > n || blob_offset % kAlign != 0 || reserved != 0)
    throw PlanError("plan header is corrupt (blob offset " + std::to_string(blob_offset) + ")");
  if (crc32(data + kHeaderSize, n - kHeaderSize) != crc)
    throw PlanError("plan checksum mismatch: the file is corrupt");

  r.n = blob_offset; // the body may not run into the blob
  parse_body(*plan, r);
  for (size_t i = r.pos; i < blob_offset; ++i)
    if (data[i] != 0) throw PlanError("plan has unexpected bytes after the metadata section");
  plan->blob = data + blob_offset;
  plan->blob_size = n - blob_offset;
  for (const WeightSource &w : plan->weights)
    if (!w.external && (w.offset % kAlign != 0 || w.offset > plan->blob_size ||
                        w.nbytes > plan->blob_size - w.offset))
      throw PlanError("inline weight '" + plan->buffers[w.buffer].name +
                      "' lies outside the blob or is not 64-byte aligned");
  plan->keep = std::move(keep);
  plan->base_dir = base_dir;
  return plan;
}

} // namespace

const char *role_name(Role r) {
  return kRoleNames[int(r)];
}
const char *kernel_format_name(KernelFormat f) {
  return kFormatNames[int(f)];
}

std::shared_ptr<const Plan> Plan::load(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw PlanError("cannot open plan '" + path + "': " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw PlanError("plan '" + path + "' is not a regular file");
  }
  auto size = size_t(st.st_size);
  void *map = size ? ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  if (map == MAP_FAILED) throw PlanError("cannot map plan '" + path + "': " + std::strerror(errno));
#ifdef MADV_HUGEPAGE
  // read-only file huge pages where the kernel supports them (see host_alloc)
  if (map && size >= (size_t(4) << 20)) ::madvise(map, size, MADV_HUGEPAGE);
#endif
  // The mapping stays alive as long as the plan: inline weights are used in place.
  std::shared_ptr<const void> keep(map, [size](const void *p) {
    if (p) ::munmap(const_cast<void *>(p), size);
  });
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  try {
    return parse(static_cast<const uint8_t *>(map), size, keep, dir.empty() ? "/" : dir);
  } catch (const PlanError &e) {
    throw PlanError("'" + path + "': " + e.what());
  }
}

std::shared_ptr<const Plan> Plan::from_bytes(const void *data, size_t n,
                                             const std::string &base_dir) {
  return from_parts({{data, n}}, base_dir);
}

std::shared_ptr<const Plan>
Plan::from_parts(const std::vector<std::pair<const void *, size_t>> &parts,
                 const std::string &base_dir) {
  size_t n = 0;
  for (const auto &p : parts) n += p.second;
  // Copy into aligned memory so inline weights keep their alignment (huge pages when large).
  void *mem = host_alloc(n, kAlign);
  if (!mem) throw Error("out of memory copying plan bytes");
  size_t at = 0;
  for (const auto &p : parts) {
    if (p.second) std::memcpy(static_cast<uint8_t *>(mem) + at, p.first, p.second);
    at += p.second;
  }
  std::shared_ptr<const void> keep(mem, [](const void *p) { std::free(const_cast<void *>(p)); });
  return parse(static_cast<const uint8_t *>(mem), n, keep, base_dir);
}

std::vector<std::string> Plan::dim_names() const {
  std::vector<std::string> names;
  for (const Dim &d : dims) names.push_back(d.name);
  return names;
}

std::string Plan::expr_users(uint32_t id) const {
  std::string out;
  auto add = [&](const std::string &s) { out += (out.empty() ? "" : ", ") + s; };
  for (const Buffer &b : buffers) {
    for (uint32_t e : b.shape)
      if (e == id) add("shape of '" + b.name + "'");
    if (b.nbytes == id) add("size of '" + b.name + "'");
    if (b.offset == id) add("arena offset of '" + b.name + "'");
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step &s = steps[i];
    bool used = s.shared_mem == id || s.nbytes == id || s.dst_offset == id || s.src_offset == id ||
                s.when == id;
    for (int k = 0; k < 3; ++k) used |= s.grid[k] == id || s.block[k] == id;
    for (const Field &f : s.fields) used |= !f.is_real && f.expr == id;
    if (used) add("step " + std::to_string(i));
  }
  return "expression #" + std::to_string(id) + " = " + render_program(exprs[id], dim_names()) +
         (out.empty() ? "" : " (" + out + ")");
}

} // namespace luminal
