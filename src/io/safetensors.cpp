// write_safetensors / read_safetensors: the file around the header (length
// prefix, raw data, atomic replace). The header itself is safetensors_header.cpp.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>

#include "atomic_file.hpp"
#include "riftco_transformer/model_state.hpp"
#include "safetensors_header.hpp"

namespace riftco_transformer {

// Tensor buffers are written and read as raw bytes; the layout is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using detail::load_error;

/// A file opened for reading, with its size; closed on every path out.
class InputFile {
 public:
  explicit InputFile(const std::filesystem::path& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer;
    // anything that is not a regular file is refused right after.
    fd_.value = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_.value < 0) {
      const int error = errno;
      load_error(path, std::string("cannot open: ") + std::strerror(error));
    }
    struct stat info {};
    if (::fstat(fd_.value, &info) != 0) {
      const int error = errno;
      load_error(path, std::string("cannot stat: ") + std::strerror(error));
    }
    if (!S_ISREG(info.st_mode)) load_error(path, "not a regular file");
    const int flags = ::fcntl(fd_.value, F_GETFL);
    if (flags >= 0) ::fcntl(fd_.value, F_SETFL, flags & ~O_NONBLOCK);
    size_ = static_cast<std::uint64_t>(info.st_size);
  }

  std::uint64_t size() const { return size_; }

  void read_at(std::uint64_t offset, void* destination, std::uint64_t bytes) const {
    auto* out = static_cast<char*>(destination);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_.value, out, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int error = errno;
        load_error(path_, std::string("cannot read: ") + std::strerror(error));
      }
      if (n == 0) load_error(path_, "the file ended early (was it changed while being read?)");
      out += n;
      offset += static_cast<std::uint64_t>(n);
      bytes -= static_cast<std::uint64_t>(n);
    }
  }

 private:
  struct Descriptor {
    int value = -1;
    ~Descriptor() {
      if (value >= 0) ::close(value);
    }
  };
  std::filesystem::path path_;
  Descriptor fd_;
  std::uint64_t size_ = 0;
};

detail::SafetensorsHeader read_header(const InputFile& file, const std::filesystem::path& path,
                                      bool accept_half = false) {
  if (file.size() < 8) {
    load_error(path, "file is " + std::to_string(file.size()) + " bytes, shorter than the 8-byte header length");
  }
  std::array<unsigned char, 8> prefix{};
  file.read_at(0, prefix.data(), prefix.size());
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | prefix[static_cast<std::size_t>(i)];
  if (length > detail::kMaxSafetensorsHeaderBytes) {
    load_error(path, "header length " + std::to_string(length) + " is over the 100 MiB limit");
  }
  if (length > file.size() - 8) {
    load_error(path, "header length " + std::to_string(length) + " is larger than the rest of the file (" +
                         std::to_string(file.size() - 8) + " bytes)");
  }
  std::string text(length, '\0');
  file.read_at(8, text.data(), length);
  detail::SafetensorsHeader header = detail::parse_safetensors_header(path, text, file.size() - 8 - length, accept_half);
  header.data_start = 8 + length;
  return header;
}

}  // namespace

namespace detail {

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  const InputFile file(path);
  return read_header(file, path);
}

/// IEEE half (F16) or bfloat16 (BF16) bits → float32 (exact).
float half_to_float(std::uint16_t h, StoredDtype dtype) {
  std::uint32_t bits = 0;
  if (dtype == StoredDtype::BF16) {
    bits = static_cast<std::uint32_t>(h) << 16;
  } else {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
    std::uint32_t exponent = (h >> 10) & 0x1FU;
    std::uint32_t mantissa = h & 0x3FFU;
    if (exponent == 0x1FU) {
      bits = sign | 0x7F800000U | (mantissa << 13);  // inf / NaN
    } else if (exponent != 0) {
      bits = sign | ((exponent + 112U) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
      bits = sign;  // ±0
    } else {  // subnormal half: normalize
      exponent = 113U;
      while ((mantissa & 0x400U) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3FFU) << 13);
    }
  }
  return std::bit_cast<float>(bits);
}

TensorFile read_safetensors_checked(const std::filesystem::path& path, const HeaderCheck& check, bool accept_half) {
  const InputFile file(path);
  const SafetensorsHeader header = read_header(file, path, accept_half);
  // Everything the caller can refuse from the header alone is refused before
  // a byte of tensor data is allocated (a sparse file can claim gigabytes).
  if (check) check(header);
  TensorFile result;
  result.metadata = header.metadata;
  result.tensors.reserve(header.entries.size());
  std::vector<std::uint16_t> halves;
  for (const SafetensorsEntry& entry : header.entries) {
    Tensor tensor = Tensor::empty(entry.shape);
    if (entry.dtype == StoredDtype::F32) {
      file.read_at(header.data_start + entry.begin, tensor.data(), entry.end - entry.begin);
    } else {
      halves.resize(static_cast<std::size_t>(tensor.numel()));
      file.read_at(header.data_start + entry.begin, halves.data(), entry.end - entry.begin);
      float* out = tensor.data();
      for (std::size_t i = 0; i < halves.size(); ++i) out[i] = half_to_float(halves[i], entry.dtype);
    }
    result.tensors.emplace_back(entry.name, std::move(tensor));
  }
  return result;
}

TensorFile read_safetensors_as_f32(const std::filesystem::path& path, const HeaderCheck& check) {
  return read_safetensors_checked(path, check, true);
}

}  // namespace detail

void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = detail::encode_safetensors_header(path, tensors, metadata);
  std::array<std::byte, 8> prefix{};
  for (std::size_t i = 0; i < 8; ++i) prefix[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);

  std::vector<Tensor> host;  // keeps CPU copies of non-CPU tensors alive until written
  std::vector<std::span<const std::byte>> pieces{prefix, std::as_bytes(std::span(header))};
  host.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    host.push_back(tensor.to(Backend::Cpu));
    pieces.push_back(std::as_bytes(host.back().values()));
  }
  detail::write_file_atomically(path, pieces);
}

TensorFile read_safetensors(const std::filesystem::path& path) {
  return detail::read_safetensors_checked(path, {});
}

}  // namespace riftco_transformer
