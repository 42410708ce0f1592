// safetensors: an 8-byte little-endian header length N, N bytes of JSON, then the data buffer.
// Everything in the header is validated before any tensor is used: length cap, well-formed JSON,
// known dtypes, shapes, offsets in bounds, ordered and non-overlapping, bytes == dtype x shape
// (overflow-checked). Tensor data is used in place from a read-only memory map.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace dq {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapped file
  size_t nbytes = 0;
  size_t file_offset = 0;  // of the first byte, for messages

  int64_t numel() const;
  std::string shape_str() const;  // "[3, 4]"
};

class SafetensorsFile {
 public:
  static constexpr size_t kMaxHeaderBytes = size_t(100) << 20;

  // Maps and validates a file. Throws dq::Error "PATH: ..." on any problem.
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);
  // Validates an in-memory image (used by open and by the fuzz target). `keep` owns `data`.
  static std::shared_ptr<const SafetensorsFile> parse(const uint8_t* data, size_t size, const std::string& name,
                                                      std::shared_ptr<const void> keep = nullptr);

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::shared_ptr<const void>& keepalive() const { return keep_; }
  // Maps every page of the file now (see MappedFile::prefault); no-op for in-memory images.
  void prefault() const;

 private:
  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::shared_ptr<const void> keep_;
  std::shared_ptr<const MappedFile> file_;
};

// Writes a safetensors file (tensors in the given order, header padded to 8 bytes).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t nbytes;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dq
