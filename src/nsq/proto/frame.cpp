#include "nsq/proto/frame.hpp"

#include <cstring>

#include "core/bytes.hpp"
#include "nsq/proto/error.hpp"

namespace cg::nsq::proto {

frame_decoder::frame_decoder(std::size_t max_frame_size) : max_frame_(max_frame_size) {}

std::span<char> frame_decoder::prepare(std::size_t min_bytes) {
    std::size_t pending = end_ - begin_;
    // A started frame whose size is known and sane: make room for all of it in one go.
    if (pending >= 4) {
        auto size = load_be32(reinterpret_cast<const std::uint8_t*>(buf_.data() + begin_));
        if (size <= max_frame_ && size + 4 > pending) min_bytes = std::max(min_bytes, size + 4 - pending);
    }
    if (begin_ > 0 && (buf_.size() - end_ < min_bytes || begin_ == end_)) {
        if (pending > 0) std::memmove(buf_.data(), buf_.data() + begin_, pending);
        begin_ = 0;
        end_ = pending;
    }
    if (buf_.size() - end_ < min_bytes) buf_.resize(end_ + min_bytes);
    return {buf_.data() + end_, buf_.size() - end_};
}

void frame_decoder::commit(std::size_t n) {
    end_ += n;
}

void frame_decoder::feed(std::string_view bytes) {
    if (bytes.empty()) return;  // memcpy from a null view is UB even for 0 bytes
    auto area = prepare(bytes.size());
    std::memcpy(area.data(), bytes.data(), bytes.size());
    commit(bytes.size());
}

decode_status frame_decoder::next(frame& out) {
    if (err_) return decode_status::error;
    std::size_t pending = end_ - begin_;
    if (pending < 4) return decode_status::need_more;
    const auto* p = reinterpret_cast<const std::uint8_t*>(buf_.data() + begin_);
    std::uint32_t size = load_be32(p);
    // Checked on the size field alone, so an oversize frame never causes an allocation.
    if (size > max_frame_) {
        err_ = error(errc::frame_too_large, "frame of " + std::to_string(size) + " bytes over the limit of " +
                                                std::to_string(max_frame_));
        return decode_status::error;
    }
    if (size < 4) {
        err_ = error(errc::bad_frame, "frame size " + std::to_string(size) + " < 4");
        return decode_status::error;
    }
    if (pending < 4 + std::size_t{size}) return decode_status::need_more;
    auto type = static_cast<std::int32_t>(load_be32(p + 4));
    if (type < 0 || type > 2) {
        err_ = error(errc::bad_frame, "unknown frame type " + std::to_string(type));
        return decode_status::error;
    }
    out.type = static_cast<frame_type>(type);
    out.data = std::string_view(buf_.data() + begin_ + 8, size - 4);
    begin_ += 4 + std::size_t{size};
    if (begin_ == end_) begin_ = end_ = 0;  // cheap reset; the view stays valid until prepare()
    return decode_status::frame;
}

std::string frame_decoder::take_buffered() {
    std::string out(buf_.data() + begin_, end_ - begin_);
    begin_ = end_ = 0;
    return out;
}

void append_frame(std::string& out, frame_type type, std::string_view data) {
    append_be32(out, static_cast<std::uint32_t>(data.size() + 4));
    append_be32(out, static_cast<std::uint32_t>(type));
    out.append(data);
}

}  // namespace cg::nsq::proto
