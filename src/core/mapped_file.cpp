#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace dq {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path);
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = size_t(st.st_size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("{}: cannot map {} bytes: {}", path, f->size_, std::strerror(e));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

void MappedFile::prefault() const {
  if (!data_) return;
  void* p = const_cast<uint8_t*>(data_);
  madvise(p, size_, MADV_WILLNEED);
  if (madvise(p, size_, MADV_POPULATE_READ) == 0) return;
  volatile uint8_t sink = 0;  // older kernels: touch one byte per page
  for (size_t i = 0; i < size_; i += 4096) sink = sink + data_[i];
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
}

std::string read_text_file(const std::string& path, size_t max_bytes) {
  auto f = MappedFile::open(path);
  if (f->size() > max_bytes) fail("{}: file is {} bytes, more than the {} allowed", path, f->size(), max_bytes);
  return std::string(reinterpret_cast<const char*>(f->data()), f->size());
}

bool file_exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace dq
