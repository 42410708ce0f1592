// A read-only memory map of a whole file. Weights are used in place from it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dq {

class MappedFile {
 public:
  // Throws dq::Error naming the path when the file cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Reads the whole file into memory and maps every page now (no page faults or disk reads
  // later, in the middle of a decode step).
  void prefault() const;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) text file; throws dq::Error naming the path.
std::string read_text_file(const std::string& path, size_t max_bytes = size_t(64) << 20);
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace dq
