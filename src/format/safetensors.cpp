#include "format/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dq {

using json = nlohmann::json;

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = MappedFile::open(path);
  auto st = parse(f->data(), f->size(), path, f);
  std::const_pointer_cast<SafetensorsFile>(st)->file_ = f;
  return st;
}

void SafetensorsFile::prefault() const {
  if (file_) file_->prefault();
}

namespace {

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

std::shared_ptr<const SafetensorsFile> SafetensorsFile::parse(const uint8_t* data, size_t size,
                                                              const std::string& name,
                                                              std::shared_ptr<const void> keep) {
  if (size < 8) fail("{}: truncated safetensors file: {} bytes, need at least 8 for the header length", name, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > kMaxHeaderBytes)
    fail("{}: safetensors header length {} exceeds the limit of {} bytes", name, n, kMaxHeaderBytes);
  if (n > size - 8)
    fail("{}: safetensors header length {} runs past the end of the file ({} bytes after the length field)", name,
         n, size - 8);
  const char* hdr = reinterpret_cast<const char*>(data + 8);
  json j;
  try {
    j = json::parse(hdr, hdr + n);
  } catch (const json::exception& e) {
    fail("{}: safetensors header is not valid JSON: {}", name, e.what());
  }
  if (!j.is_object()) fail("{}: safetensors header must be a JSON object, got {}", name, j.type_name());

  auto out = std::make_shared<SafetensorsFile>();
  out->path_ = name;
  out->keep_ = std::move(keep);
  const uint8_t* buf = data + 8 + n;
  const size_t buf_size = size - 8 - size_t(n);

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ must be an object of strings, got {}", name, v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail("{}: __metadata__['{}'] must be a string, got {}", name, m.key(), m.value().type_name());
        out->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail("{}: tensor '{}': entry must be an object, got {}", name, key, v.type_name());
    TensorInfo t;
    t.name = key;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) fail("{}: tensor '{}': missing string field 'dtype'", name, key);
    if (!parse_dtype(dt->get<std::string>(), &t.dtype))
      fail("{}: tensor '{}': unknown dtype '{}'", name, key, dt->get<std::string>());
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) fail("{}: tensor '{}': missing array field 'shape'", name, key);
    if (sh->size() > 8) fail("{}: tensor '{}': shape has {} dimensions, at most 8 supported", name, key, sh->size());
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned())
        fail("{}: tensor '{}': shape entries must be non-negative integers, got {}", name, key, d.dump());
      uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t(1) << 40) || mul_overflows(numel, dim, &numel))
        fail("{}: tensor '{}': shape {} is too large", name, key, sh->dump());
      t.shape.push_back(int64_t(dim));
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      fail("{}: tensor '{}': 'data_offsets' must be two non-negative integers [begin, end]", name, key);
    uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (b > e) fail("{}: tensor '{}': data_offsets [{}, {}] has begin after end", name, key, b, e);
    if (e > buf_size)
      fail("{}: tensor '{}': data_offsets [{}, {}] run past the data buffer of {} bytes (truncated file?)", name, key,
           b, e, buf_size);
    uint64_t want;
    if (mul_overflows(numel, dtype_size(t.dtype), &want) || want != e - b)
      fail("{}: tensor '{}': {} x {} needs {} bytes but data_offsets [{}, {}] hold {}", name, key,
           dtype_name(t.dtype), t.shape_str(), numel * dtype_size(t.dtype), b, e, e - b);
    t.data = buf + b;
    t.nbytes = size_t(e - b);
    t.file_offset = 8 + size_t(n) + size_t(b);
    out->tensors_.push_back(std::move(t));
  }
  // Ordered and non-overlapping.
  std::vector<const TensorInfo*> by_off;
  for (const auto& t : out->tensors_) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_off.size(); ++i) {
    const TensorInfo* p = by_off[i - 1];
    const TensorInfo* c = by_off[i];
    if (p->data + p->nbytes > c->data)
      fail("{}: tensors '{}' (bytes {}..{}) and '{}' (bytes {}..{}) overlap", name, p->name,
           p->data - buf, p->data - buf + p->nbytes, c->name, c->data - buf, c->data - buf + c->nbytes);
  }
  for (size_t i = 0; i < out->tensors_.size(); ++i) out->index_[out->tensors_[i].name] = i;
  return out;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  size_t off = 0;
  for (const auto& t : tensors) {
    h[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes}}};
    off += t.nbytes;
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string s = h.dump();
  while (s.size() % 8) s += ' ';
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("{}: cannot create: {}", path, std::strerror(errno));
  uint8_t len[8];
  uint64_t n = s.size();
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(s.data(), 1, s.size(), f) == s.size();
  for (const auto& t : tensors) ok = ok && (t.nbytes == 0 || std::fwrite(t.data, 1, t.nbytes, f) == t.nbytes);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) fail("{}: write failed: {}", path, std::strerror(errno));
}

}  // namespace dq
