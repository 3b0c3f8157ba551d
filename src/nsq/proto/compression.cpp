#include "nsq/proto/compression.hpp"

#include <snappy.h>
#include <zlib.h>

#include <algorithm>
#include <array>

#include "nsq/proto/error.hpp"

namespace cg::nsq::proto {
namespace {

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        t[i] = c;
    }
    return t;
}
constexpr auto crc32c_table = make_crc32c_table();

constexpr std::size_t max_block = 65536;  // uncompressed bytes per chunk
// A data chunk's longest body: its CRC and snappy::MaxCompressedLength(max_block) = 32 + n + n / 6.
constexpr std::size_t max_chunk = 4 + 32 + max_block + max_block / 6;
constexpr std::string_view stream_identifier("\xff\x06\x00\x00sNaPpY", 10);
constexpr unsigned char chunk_compressed = 0x00, chunk_uncompressed = 0x01, chunk_padding = 0xfe,
                        chunk_identifier = 0xff;

void put_le24(std::string& out, std::size_t n) {
    out.push_back(static_cast<char>(n & 0xff));
    out.push_back(static_cast<char>((n >> 8) & 0xff));
    out.push_back(static_cast<char>((n >> 16) & 0xff));
}
void put_le32(std::string& out, std::uint32_t n) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
}
std::uint32_t get_le32(const char* p) {
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
    return v;
}

error corrupt(std::string what) {
    return error(errc::bad_response, "snappy stream: " + std::move(what));
}

}  // namespace

std::uint32_t crc32c(std::string_view data) noexcept {
    std::uint32_t c = 0xffffffffu;
    for (unsigned char b : data) c = crc32c_table[(c ^ b) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

std::uint32_t snappy_masked_crc(std::string_view data) noexcept {
    auto c = crc32c(data);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

void snappy_encoder::encode(std::string_view in, std::string& out) {
    if (!started_) {
        out.append(stream_identifier);
        started_ = true;
    }
    while (!in.empty()) {
        auto block = in.substr(0, max_block);
        in.remove_prefix(block.size());
        snappy::Compress(block.data(), block.size(), &scratch_);
        // Like the Go writer: keep the compressed form only when it saves at least 1/8.
        bool compressed = scratch_.size() < block.size() - block.size() / 8;
        auto payload = compressed ? std::string_view(scratch_) : block;
        out.push_back(static_cast<char>(compressed ? chunk_compressed : chunk_uncompressed));
        put_le24(out, payload.size() + 4);
        put_le32(out, snappy_masked_crc(block));
        out.append(payload);
    }
}

result<void> snappy_decoder::decode(std::string_view in, std::string& out, std::size_t max_out) {
    if (failed_) return corrupt("earlier error");
    pending_.append(in);
    std::size_t pos = 0, appended = 0;
    auto fail = [&](std::string why) -> result<void> {
        failed_ = true;
        more_ = false;
        return corrupt(std::move(why));
    };
    more_ = false;
    while (pending_.size() - pos >= 4) {
        if (appended >= max_out) {
            more_ = true;  // the rest next call, so one read never expands without bound
            break;
        }
        const char* h = pending_.data() + pos;
        auto type = static_cast<unsigned char>(h[0]);
        std::size_t len = static_cast<unsigned char>(h[1]) | (static_cast<unsigned char>(h[2]) << 8) |
                          (static_cast<std::size_t>(static_cast<unsigned char>(h[3])) << 16);
        // Refused before waiting for (and buffering) its body: the framing format allows no data chunk
        // longer than a 64 KiB block's worst-case compressed form plus its CRC (Go's reader neither).
        if (type == chunk_identifier && len != stream_identifier.size() - 4)
            return fail("bad stream identifier");
        if (len > max_chunk)
            return fail("chunk of " + std::to_string(len) + " bytes (at most " + std::to_string(max_chunk) +
                        ")");
        if (pending_.size() - pos < 4 + len) break;
        std::string_view body(h + 4, len);
        pos += 4 + len;
        if (type == chunk_identifier) {
            if (body != stream_identifier.substr(4)) return fail("bad stream identifier");
            identified_ = true;
            continue;
        }
        if (!identified_) return fail("data before the stream identifier");
        if (type == chunk_compressed || type == chunk_uncompressed) {
            if (body.size() < 4) return fail("chunk too short");
            auto crc = get_le32(body.data());
            auto data = body.substr(4);
            std::string_view plain;
            if (type == chunk_compressed) {
                // The block's own header says how large it claims to be; Uncompress would allocate that
                // much (up to 4 GiB) before finding out the data does not match. Check it first.
                std::size_t declared = 0;
                if (!snappy::GetUncompressedLength(data.data(), data.size(), &declared))
                    return fail("corrupt block header");
                if (declared > max_block)
                    return fail("block declares " + std::to_string(declared) +
                                " bytes uncompressed (at most " + std::to_string(max_block) + ")");
                scratch_.clear();
                if (!snappy::Uncompress(data.data(), data.size(), &scratch_)) return fail("corrupt block");
                plain = scratch_;
            } else {
                plain = data;
            }
            if (plain.size() > max_block) return fail("block too large");
            if (snappy_masked_crc(plain) != crc) return fail("checksum mismatch");
            out.append(plain);
            appended += plain.size();
        } else if (type == chunk_padding || (type >= 0x80 && type <= 0xfd)) {
            continue;  // skippable
        } else {
            return fail("unskippable chunk type " + std::to_string(type));
        }
    }
    pending_.erase(0, pos);
    return {};
}

struct deflate_encoder::impl {
    z_stream z{};
};

deflate_encoder::deflate_encoder(int level) : p_(std::make_unique<impl>()) {
    // -15: raw DEFLATE, as Go's compress/flate writes it.
    deflateInit2(&p_->z, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
}
deflate_encoder::~deflate_encoder() {
    deflateEnd(&p_->z);
}

void deflate_encoder::encode(std::string_view in, std::string& out) {
    auto& z = p_->z;
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z.avail_in = static_cast<uInt>(in.size());
    for (;;) {
        auto start = out.size();
        std::size_t room = deflateBound(&z, z.avail_in) + 64;
        out.resize(start + room);
        z.next_out = reinterpret_cast<Bytef*>(out.data() + start);
        z.avail_out = static_cast<uInt>(room);
        deflate(&z, Z_SYNC_FLUSH);
        out.resize(start + (room - z.avail_out));
        if (z.avail_out != 0 && z.avail_in == 0) break;  // all input consumed and flushed
    }
}

struct deflate_decoder::impl {
    z_stream z{};
    bool failed = false;
    // Input zlib has not consumed yet (a call stopped at max_out): kept here, since the caller's buffer
    // is gone by the next call.
    std::string in;
    std::size_t in_pos = 0;
    bool more = false;  // the last call stopped at max_out: zlib may hold output for no further input
};

deflate_decoder::deflate_decoder() : p_(std::make_unique<impl>()) {
    inflateInit2(&p_->z, -15);
}
deflate_decoder::~deflate_decoder() {
    inflateEnd(&p_->z);
}

bool deflate_decoder::pending() const noexcept {
    return p_->more || p_->in_pos < p_->in.size();
}

result<void> deflate_decoder::decode(std::string_view in, std::string& out, std::size_t max_out) {
    auto& p = *p_;
    auto& z = p.z;
    if (p.failed) return error(errc::bad_response, "deflate stream: earlier error");
    if (!in.empty()) {
        if (p.in_pos == p.in.size()) {
            p.in.assign(in);
        } else {
            p.in.erase(0, p.in_pos);
            p.in.append(in);
        }
        p.in_pos = 0;
    }
    z.next_in = reinterpret_cast<Bytef*>(p.in.data() + p.in_pos);
    z.avail_in = static_cast<uInt>(p.in.size() - p.in_pos);
    std::size_t appended = 0;
    p.more = false;
    // DEFLATE expands up to ~1032:1: output is bounded by max_out, never by what the input could become.
    while (appended < max_out) {
        auto start = out.size();
        std::size_t room = std::min<std::size_t>(max_out - appended, 64 * 1024);
        out.resize(start + room);
        z.next_out = reinterpret_cast<Bytef*>(out.data() + start);
        z.avail_out = static_cast<uInt>(room);
        int rc = inflate(&z, Z_SYNC_FLUSH);
        out.resize(start + (room - z.avail_out));
        appended += room - z.avail_out;
        if (rc == Z_STREAM_END) {
            p.failed = true;
            return error(errc::bad_response, "deflate stream: ended by the peer");
        }
        if (rc != Z_OK && rc != Z_BUF_ERROR) {
            p.failed = true;
            return error(errc::bad_response, std::string("deflate stream: ") + (z.msg ? z.msg : "corrupt"));
        }
        if (z.avail_out != 0) break;  // no more output possible from this input
    }
    p.more = appended >= max_out;
    p.in_pos = p.in.size() - z.avail_in;
    if (p.in_pos == p.in.size()) {
        p.in.clear();
        p.in_pos = 0;
    }
    return {};
}

}  // namespace cg::nsq::proto
