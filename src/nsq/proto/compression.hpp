// NSQ stream compression, sans-io: bytes in, bytes out. nsqd 1.3.0 wraps a connection in
//  - snappy: the snappy *framing* format (github.com/golang/snappy Reader/Writer): a stream identifier
//    chunk, then compressed (0x00) or uncompressed (0x01) chunks of ≤ 64 KiB with a masked CRC-32C;
//  - deflate: raw DEFLATE (no zlib header), each write ended by a sync flush so the peer can decode it.
// Each object holds one direction of one connection's state.
//
// Decoders bound their output: one decode() call appends at most `max_out` bytes (plus at most one snappy
// chunk, ≤ 64 KiB); what the input holds beyond that stays inside the decoder (pending()) and comes out of
// the next call, which may pass no new input. So a small compressed read can never expand into an
// allocation the size of its compression ratio (a "bomb"), and a declared size is checked before anything
// is allocated for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace cg::nsq::proto {

// What one decode() call appends at most by default (the transport reads 64 KiB of compressed bytes at a
// time; a frame larger than this is assembled over several calls).
inline constexpr std::size_t default_max_decoded = 256 * 1024;

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
    // Appends what `in` (after the input kept from earlier calls) completes to `out`, stopping once
    // `max_out` bytes were appended; keeps a partial chunk and the chunks not decoded yet for the next call.
    // bad_response on a corrupt stream (bad CRC, unknown unskippable chunk, missing identifier, a chunk
    // longer than the format allows or declaring more than 64 KiB uncompressed — refused before any
    // allocation); the error is sticky.
    result<void> decode(std::string_view in, std::string& out, std::size_t max_out = default_max_decoded);
    // Whole chunks are waiting: call decode() again (input optional) before reading more.
    bool pending() const noexcept { return more_; }

  private:
    std::string pending_;
    bool identified_ = false;
    bool failed_ = false;
    bool more_ = false;
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
    // Appends what `in` (after the input kept from earlier calls) decodes to, at most `max_out` bytes;
    // the rest stays inside (pending()). bad_response on a corrupt stream (sticky).
    result<void> decode(std::string_view in, std::string& out, std::size_t max_out = default_max_decoded);
    // Input or output is left over from the last call: call decode() again (input optional).
    bool pending() const noexcept;

    struct impl;

  private:
    std::unique_ptr<impl> p_;
};

}  // namespace cg::nsq::proto
