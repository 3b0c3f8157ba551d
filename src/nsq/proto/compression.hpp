// NSQ stream compression, sans-io: bytes in, bytes out. nsqd 1.3.0 wraps a connection in
//  - snappy: the snappy *framing* format (github.com/golang/snappy Reader/Writer): a stream identifier
//    chunk, then compressed (0x00) or uncompressed (0x01) chunks of ≤ 64 KiB with a masked CRC-32C;
//  - deflate: raw DEFLATE (no zlib header), each write ended by a sync flush so the peer can decode it.
// Each object holds one direction of one connection's state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace cg::nsq::proto {

// CRC-32C (Castagnoli) and the snappy framing mask over it.
std::uint32_t crc32c(std::string_view data) noexcept;
std::uint32_t snappy_masked_crc(std::string_view data) noexcept;

class snappy_encoder {
  public:
    // Appends the framed, compressed form of `in` to `out` (the stream identifier before the first).
    void encode(std::string_view in, std::string& out);

  private:
    bool started_ = false;
    std::string scratch_;
};

class snappy_decoder {
  public:
    // Appends what `in` completes to `out`; keeps a partial chunk for the next call. bad_response on a
    // corrupt stream (bad CRC, unknown unskippable chunk, missing identifier); the error is sticky.
    result<void> decode(std::string_view in, std::string& out);

  private:
    std::string pending_;
    bool identified_ = false;
    bool failed_ = false;
    std::string scratch_;
};

class deflate_encoder {
  public:
    explicit deflate_encoder(int level);
    ~deflate_encoder();
    deflate_encoder(const deflate_encoder&) = delete;
    deflate_encoder& operator=(const deflate_encoder&) = delete;
    // Appends `in` compressed and sync-flushed.
    void encode(std::string_view in, std::string& out);

    struct impl;

  private:
    std::unique_ptr<impl> p_;
};

class deflate_decoder {
  public:
    deflate_decoder();
    ~deflate_decoder();
    deflate_decoder(const deflate_decoder&) = delete;
    deflate_decoder& operator=(const deflate_decoder&) = delete;
    // Appends everything `in` lets it decode; bad_response on a corrupt stream (sticky).
    result<void> decode(std::string_view in, std::string& out);

    struct impl;

  private:
    std::unique_ptr<impl> p_;
};

}  // namespace cg::nsq::proto
