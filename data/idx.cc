#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace tessel::data {
namespace {

// gzread reads gzip and plain files alike.
struct GzFileCloser {
  void operator()(gzFile file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzFileCloser>;

// Reads up to `count` bytes; returns how many came (fewer only at the end of the file).
size_t read_bytes(gzFile file, const std::string& path, void* destination, size_t count) {
  size_t done = 0;
  auto* out = static_cast<unsigned char*>(destination);
  while (done < count) {
    // gzread takes an unsigned int count: read in chunks of at most 1 GiB.
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(count - done, size_t{1} << 30));
    const int got = gzread(file, out + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      TESSEL_FAIL("IDX file '", path, "': read error: ", message ? message : "unknown",
                  " (corrupt gzip data?)");
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

uint32_t big_endian_u32(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

}  // namespace

IdxArray read_idx(const std::string& path, uint32_t expected_magic) {
  GzFile file(gzopen(path.c_str(), "rb"));
  TESSEL_CHECK(file != nullptr, "IDX file '", path, "': cannot open: ", std::strerror(errno));

  unsigned char magic_bytes[4];
  const size_t magic_read = read_bytes(file.get(), path, magic_bytes, 4);
  TESSEL_CHECK(magic_read == 4, "IDX file '", path, "': truncated: ", magic_read,
               " bytes, shorter than the 4-byte magic number");
  const uint32_t magic = big_endian_u32(magic_bytes);
  TESSEL_CHECK(magic == expected_magic, "IDX file '", path, "': wrong magic number 0x", std::hex,
               magic, " (expected 0x", expected_magic, std::dec, ": ",
               expected_magic == kIdxImagesMagic ? "u8 images with 3 dimensions"
                                                 : "u8 labels with 1 dimension",
               ")");

  const int num_dims = static_cast<int>(magic & 0xff);
  IdxArray array;
  int64_t count = 1;
  for (int d = 0; d < num_dims; ++d) {
    unsigned char dim_bytes[4];
    TESSEL_CHECK(read_bytes(file.get(), path, dim_bytes, 4) == 4, "IDX file '", path,
                 "': truncated header: dimension ", d, " of ", num_dims, " is missing");
    const int64_t dim = big_endian_u32(dim_bytes);
    array.dims.push_back(dim);
    // Checked before multiplying: 2^40 times a 32-bit dimension would overflow.
    TESSEL_CHECK(dim == 0 || count <= (int64_t{1} << 40) / dim, "IDX file '", path,
                 "': dimensions ", array.dims, " describe more than 2^40 values (corrupt header?)");
    count *= dim;
  }

  // Grow with the data actually read (doubling, from 64 KiB): a corrupt header may claim up to
  // 2^40 values, which must not be allocated (and zeroed) before the file turns out to be short.
  const size_t wanted = static_cast<size_t>(count);
  size_t got = 0;
  while (got < wanted) {
    const size_t chunk = std::min(wanted - got, std::max(got, size_t{1} << 16));
    array.values.resize(got + chunk);
    const size_t read = read_bytes(file.get(), path, array.values.data() + got, chunk);
    got += read;
    if (read < chunk) break;
  }
  array.values.resize(got);
  TESSEL_CHECK(got == wanted, "IDX file '", path, "': truncated data: dimensions ", array.dims,
               " need ", count, " values but the file holds ", got);
  unsigned char extra;
  TESSEL_CHECK(read_bytes(file.get(), path, &extra, 1) == 0, "IDX file '", path,
               "': unexpected data after the ", count, " values of dimensions ", array.dims);
  return array;
}

}  // namespace tessel::data
