// Server → client framing: [size:int32][frame_type:int32][data], size counting type + data.
// Pure: bytes in, frames out. The decoder owns one growable buffer that the driver reads into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace cg::nsq::proto {

enum class frame_type : std::int32_t { response = 0, error = 1, message = 2 };

struct frame {
    frame_type type = frame_type::response;
    std::string_view data;  // valid until the next prepare()/feed() on the decoder
};

enum class decode_status { frame, need_more, error };

// Default cap: nsqd's max-msg-size (1 MiB) plus the message header, with slack.
inline constexpr std::size_t default_max_frame_size = 1024 * 1024 + 1024;
// The fixed part of a frame: size + type.
inline constexpr std::size_t frame_header_size = 8;

class frame_decoder {
  public:
    // `max_frame_size` bounds the size field (type + data); larger frames fail before any allocation.
    explicit frame_decoder(std::size_t max_frame_size = default_max_frame_size);

    // A writable area of at least `min_bytes` (more when a started frame needs more) for the next read.
    // Moves unread bytes to the front, which invalidates views of earlier frames.
    std::span<char> prepare(std::size_t min_bytes = 16 * 1024);
    // Marks `n` bytes of the last prepare() area as filled.
    void commit(std::size_t n);
    // prepare + copy + commit, for tests and the fuzzer.
    void feed(std::string_view bytes);

    // The next complete frame, need_more, or error (sticky: the stream cannot be resynchronised).
    decode_status next(frame& out);
    const error& last_error() const noexcept { return err_; }
    // Bytes received but not yet returned as frames.
    std::size_t buffered() const noexcept { return end_ - begin_; }
    // Removes and returns the bytes not yet returned as frames: what was read past a point where the
    // stream changes encoding (compression starting right after the IDENTIFY reply).
    std::string take_buffered();

  private:
    std::size_t max_frame_;
    std::vector<char> buf_;
    std::size_t begin_ = 0, end_ = 0;
    error err_;
};

// Appends one frame (server side: fake-nsqd, and tests).
void append_frame(std::string& out, frame_type type, std::string_view data);

}  // namespace cg::nsq::proto
